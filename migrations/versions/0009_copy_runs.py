"""Runs of action ``copy``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28

``zbak copy`` copies a job's streams from one store to another (docs/copies.md); each copy of
a job into a store is a run of action ``copy``, its target ``STORE:DATASET`` as an archive's
(alerts, ``zbak status`` and the daemon's ``--once`` read runs).
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

OLD_ACTIONS = ("action IN ('snapshot', 'replicate', 'archive', 'prune', 'audit', 'restore',"
               " 'hook', 'failover', 'failback', 'drill')")
NEW_ACTIONS = ("action IN ('snapshot', 'replicate', 'archive', 'prune', 'audit', 'restore',"
               " 'hook', 'failover', 'failback', 'drill', 'copy')")


def upgrade() -> None:
    """Allow runs of action ``copy``."""
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("action", type_="check")
        batch.create_check_constraint("action", NEW_ACTIONS)


def downgrade() -> None:
    """Drop the copy runs (the older schema has no place for them) and restore the older
    action set."""
    op.execute("DELETE FROM runs WHERE action = 'copy'")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("action", type_="check")
        batch.create_check_constraint("action", OLD_ACTIONS)
