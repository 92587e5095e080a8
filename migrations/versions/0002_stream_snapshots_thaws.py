"""Snapshots carried by each stream, and thaw requests.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21

``stream_snapshots`` lets restore and audit find the stream that carries any snapshot (an
``-I`` incremental carries several); ``thaw_requests`` remembers a cold-object restore request
per stream so a rerun continues instead of asking again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

NAME = sa.String(255)
TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create stream_snapshots and thaw_requests."""
    op.create_table(
        "stream_snapshots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("guid", sa.BigInteger(), nullable=False),
        sa.Column("createtxg", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_stream_snapshots"),
        sa.ForeignKeyConstraint(
            ["stream_id"], ["streams.id"], name="fk_stream_snapshots_stream_id",
            ondelete="RESTRICT",
        ),
        sa.UniqueConstraint("stream_id", "guid", name="uq_stream_snapshots_stream_id_guid"),
    )
    op.create_index("ix_stream_snapshots_guid", "stream_snapshots", ["guid"])
    op.create_table(
        "thaw_requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("days", sa.Integer(), nullable=False),
        sa.Column("requested_at", TIME, nullable=False),
        sa.Column("ready_by", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_thaw_requests"),
        sa.ForeignKeyConstraint(
            ["stream_id"], ["streams.id"], name="fk_thaw_requests_stream_id", ondelete="RESTRICT"
        ),
        sa.UniqueConstraint("stream_id", name="uq_thaw_requests_stream_id"),
    )


def downgrade() -> None:
    """Drop both tables (what streams carry and pending thaws are forgotten)."""
    op.drop_table("thaw_requests")
    op.drop_index("ix_stream_snapshots_guid", table_name="stream_snapshots")
    op.drop_table("stream_snapshots")
