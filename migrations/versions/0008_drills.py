"""Restore drills: table ``drills`` and runs of action ``drill``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-10

``zbak drill`` restores the newest restorable snapshot of each store and replica of a job into
scratch and compares it with the source (docs/drills.md). Each drilled source is a run of
action ``drill`` (its target the source: alerts, ``zbak status``, ``status --check`` and the
daemon's ``--once`` read runs) and a row of ``drills``: when, the result (``ok``, ``failed``,
``skipped`` by design, ``pending`` a thaw), the recovery time in seconds, the bytes restored,
the datasets and files compared, the snapshot, what its cold objects needed, and why. The
metrics ``zbak_drill_*`` and the drill staleness alert read its newest rows per source.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from zrepl_py.catalog.types import UtcDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

OLD_ACTIONS = ("action IN ('snapshot', 'replicate', 'archive', 'prune', 'audit', 'restore',"
               " 'hook', 'failover', 'failback')")
NEW_ACTIONS = ("action IN ('snapshot', 'replicate', 'archive', 'prune', 'audit', 'restore',"
               " 'hook', 'failover', 'failback', 'drill')")


def upgrade() -> None:
    """Create ``drills`` and allow runs of action ``drill``."""
    op.create_table(
        "drills",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", sa.String(255), nullable=False),
        sa.Column("source", sa.String(1024), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("started_at", UtcDateTime(), nullable=False),
        sa.Column("ended_at", UtcDateTime(), nullable=False),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("datasets", sa.Integer(), nullable=False),
        sa.Column("files", sa.BigInteger(), nullable=True),
        sa.Column("snapshot", sa.String(255), nullable=True),
        sa.Column("thaw", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.CheckConstraint("kind IN ('store', 'replica')", name=op.f("ck_drills_kind")),
        sa.CheckConstraint("result IN ('ok', 'failed', 'skipped', 'pending')",
                           name=op.f("ck_drills_result")),
        sa.CheckConstraint("bytes >= 0 AND datasets >= 0", name=op.f("ck_drills_sizes")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drills")),
    )
    op.create_index("ix_drills_job_source_started_at", "drills", ["job", "source", "started_at"])
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("action", type_="check")
        batch.create_check_constraint("action", NEW_ACTIONS)


def downgrade() -> None:
    """Drop ``drills`` and the drill runs (the older schema has no place for them), and
    restore the older action set."""
    op.drop_index("ix_drills_job_source_started_at", table_name="drills")
    op.drop_table("drills")
    op.execute("DELETE FROM runs WHERE action = 'drill'")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("action", type_="check")
        batch.create_check_constraint("action", OLD_ACTIONS)
