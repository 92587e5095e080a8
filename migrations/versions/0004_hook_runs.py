"""Runs of pre and post hooks: action ``hook``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

Each pre or post command of an action (``[jobs.NAME.hooks.ACTION]``,
docs/decisions.md#hooks-are-recorded-runs) is recorded as a run of action ``hook`` with target
``pre-ACTION`` or ``post-ACTION``, so a hook that fails is a failed run: alerted, shown by ``zbak
status`` and counted by ``status --check``.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

OLD_ACTIONS = "action IN ('snapshot', 'replicate', 'archive', 'prune', 'audit', 'restore')"
NEW_ACTIONS = ("action IN ('snapshot', 'replicate', 'archive', 'prune', 'audit', 'restore',"
               " 'hook')")


def upgrade() -> None:
    """Allow runs of action ``hook``."""
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("action", type_="check")
        batch.create_check_constraint("action", NEW_ACTIONS)


def downgrade() -> None:
    """Delete the hook runs (the older schema has no place for them) and restore the
    older action set."""
    op.execute("DELETE FROM runs WHERE action = 'hook'")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("action", type_="check")
        batch.create_check_constraint("action", OLD_ACTIONS)
