"""Failovers: table ``failovers``, and runs of action ``failover`` and ``failback``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05

``zbak failover`` makes a job's replica live and ``zbak failback`` brings the source back
(docs/design.md#replica-failover-and-failback). What replication obeys is the replica's own
``zbak:failover`` mark (docs/decisions.md#failed-over-is-recorded-on-the-replica); ``failovers``
is what ``zbak status`` shows: one row per failover of a job's target, identified by the
mark's time, with the failback's time and where it kept the source once it is done. Both
commands are recorded as runs of their own action, so a failed one is alerted and counted
like any other.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

NAME = sa.String(255)
KEY = sa.String(1024)
TIME = sa.DateTime(timezone=True)
OLD_ACTIONS = ("action IN ('snapshot', 'replicate', 'archive', 'prune', 'audit', 'restore',"
               " 'hook')")
NEW_ACTIONS = ("action IN ('snapshot', 'replicate', 'archive', 'prune', 'audit', 'restore',"
               " 'hook', 'failover', 'failback')")


def upgrade() -> None:
    """Create ``failovers``; allow runs of action ``failover`` and ``failback``."""
    op.create_table(
        "failovers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", NAME, nullable=False),
        sa.Column("target", KEY, nullable=False),
        sa.Column("replica", NAME, nullable=False),
        sa.Column("failed_over_at", TIME, nullable=False),
        sa.Column("planned", sa.Boolean(), nullable=False),
        sa.Column("recorded_at", TIME, nullable=False),
        sa.Column("failed_back_at", TIME, nullable=True),
        sa.Column("kept", NAME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_failovers"),
        sa.UniqueConstraint("job", "target", "failed_over_at",
                            name="uq_failovers_job_target_failed_over_at"),
    )
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("action", type_="check")
        batch.create_check_constraint("action", NEW_ACTIONS)


def downgrade() -> None:
    """Drop ``failovers`` and the failover and failback runs (the older schema has no place
    for them); the replicas' own marks are untouched."""
    op.execute("DELETE FROM runs WHERE action IN ('failover', 'failback')")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("action", type_="check")
        batch.create_check_constraint("action", OLD_ACTIONS)
    op.drop_table("failovers")
