"""Runs record the process that runs them, and can end ``interrupted``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25

A run killed with SIGKILL (or lost with its host) never finishes its row, which then says
``running`` forever (docs/decisions.md#a-killed-run-ends-interrupted). ``host``, ``pid`` and
``pid_start`` (the process start time in clock ticks after boot, field 22 of /proc/PID/stat, so a
reused PID is not taken for the run) let the next zbak on that host see the process is gone and end
the row ``interrupted``. Rows written before this revision have them NULL and are left alone.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

OLD_RESULTS = "result IN ('running', 'ok', 'failed', 'partial')"
NEW_RESULTS = "result IN ('running', 'ok', 'failed', 'partial', 'interrupted')"


def upgrade() -> None:
    """Add runs.host/pid/pid_start and allow result ``interrupted``."""
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("host", sa.String(255), nullable=True))
        batch.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("pid_start", sa.BigInteger(), nullable=True))
        batch.drop_constraint("result", type_="check")
        batch.create_check_constraint("result", NEW_RESULTS)


def downgrade() -> None:
    """Drop the columns; ``interrupted`` rows become ``failed`` (the older result set)."""
    op.execute("UPDATE runs SET result = 'failed' WHERE result = 'interrupted'")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("result", type_="check")
        batch.create_check_constraint("result", OLD_RESULTS)
        batch.drop_column("pid_start")
        batch.drop_column("pid")
        batch.drop_column("host")
