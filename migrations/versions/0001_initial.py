"""Initial catalog: datasets, snapshots, replica cursors, chained streams, volumes, runs.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Types are written out (no imports from zrepl_py) so this revision never changes under us:
guids are signed BIGINT holding the unsigned value by two's complement, times are
``timestamp with time zone`` (naive UTC text on SQLite).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

NAME = sa.String(255)
KEY = sa.String(1024)
TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create every catalog table."""
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host", NAME, nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_datasets"),
        sa.UniqueConstraint("host", "name", name="uq_datasets_host_name"),
    )
    op.create_table(
        "snapshots",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("guid", sa.BigInteger(), nullable=False),
        sa.Column("createtxg", sa.BigInteger(), nullable=False),
        sa.Column("creation", TIME, nullable=False),
        sa.Column("first_seen", TIME, nullable=False),
        sa.Column("destroyed_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_snapshots"),
        sa.ForeignKeyConstraint(
            ["dataset_id"], ["datasets.id"], name="fk_snapshots_dataset_id", ondelete="RESTRICT"
        ),
        sa.UniqueConstraint("dataset_id", "guid", name="uq_snapshots_dataset_id_guid"),
    )
    op.create_index(
        "ix_snapshots_dataset_id_createtxg", "snapshots", ["dataset_id", "createtxg"]
    )
    op.create_table(
        "replica_cursors",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", NAME, nullable=False),
        sa.Column("target", KEY, nullable=False),
        sa.Column("source_dataset_id", sa.Integer(), nullable=False),
        sa.Column("target_location", KEY, nullable=False),
        sa.Column("method", sa.String(16), nullable=False),
        sa.Column("snapshot_name", NAME, nullable=False),
        sa.Column("guid", sa.BigInteger(), nullable=False),
        sa.Column("createtxg", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_replica_cursors"),
        sa.ForeignKeyConstraint(
            ["source_dataset_id"],
            ["datasets.id"],
            name="fk_replica_cursors_source_dataset_id",
            ondelete="RESTRICT",
        ),
        sa.UniqueConstraint(
            "job", "target", "source_dataset_id",
            name="uq_replica_cursors_job_target_source_dataset_id",
        ),
        sa.CheckConstraint("method IN ('zfs', 'rsync')", name=op.f("ck_replica_cursors_method")),
    )
    op.create_table(
        "streams",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("store", NAME, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("from_guid", sa.BigInteger(), nullable=True),
        sa.Column("to_guid", sa.BigInteger(), nullable=False),
        sa.Column("from_name", NAME, nullable=True),
        sa.Column("to_name", NAME, nullable=False),
        sa.Column("to_createtxg", sa.BigInteger(), nullable=False),
        sa.Column("raw_bytes", sa.BigInteger(), nullable=False),
        sa.Column("stored_bytes", sa.BigInteger(), nullable=False),
        sa.Column("object_prefix", KEY, nullable=False),
        sa.Column("storage_class", sa.String(64), nullable=False),
        sa.Column("compression", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("uploaded_at", TIME, nullable=True),
        sa.Column("verified_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_streams"),
        sa.ForeignKeyConstraint(
            ["dataset_id"], ["datasets.id"], name="fk_streams_dataset_id", ondelete="RESTRICT"
        ),
        # Guid continuity, enforced by the database: an incremental must start where its
        # parent ends, in the same dataset and store; a parent with children cannot go.
        sa.UniqueConstraint("id", "to_guid", "dataset_id", "store", name="uq_streams_chain_key"),
        sa.ForeignKeyConstraint(
            ["parent_id", "from_guid", "dataset_id", "store"],
            ["streams.id", "streams.to_guid", "streams.dataset_id", "streams.store"],
            name="fk_streams_parent_continuity",
            ondelete="RESTRICT",
        ),
        sa.UniqueConstraint("store", "object_prefix", name="uq_streams_store_object_prefix"),
        sa.CheckConstraint(
            "(kind = 'full' AND parent_id IS NULL AND from_guid IS NULL)"
            " OR (kind = 'incremental' AND parent_id IS NOT NULL AND from_guid IS NOT NULL)",
            name=op.f("ck_streams_kind_parent"),
        ),
        sa.CheckConstraint("kind IN ('full', 'incremental')", name=op.f("ck_streams_kind")),
        sa.CheckConstraint(
            "state IN ('uploading', 'uploaded', 'verified', 'condemned', 'bad')",
            name=op.f("ck_streams_state"),
        ),
        sa.CheckConstraint("raw_bytes >= 0 AND stored_bytes >= 0", name=op.f("ck_streams_sizes")),
    )
    op.create_index("ix_streams_dataset_id_store", "streams", ["dataset_id", "store"])
    op.create_index("ix_streams_parent_id", "streams", ["parent_id"])
    op.create_table(
        "volumes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("stream_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("key", KEY, nullable=False),
        sa.Column("raw_bytes", sa.BigInteger(), nullable=False),
        sa.Column("stored_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_volumes"),
        sa.ForeignKeyConstraint(
            ["stream_id"], ["streams.id"], name="fk_volumes_stream_id", ondelete="RESTRICT"
        ),
        sa.UniqueConstraint("stream_id", "index", name="uq_volumes_stream_id_index"),
        sa.CheckConstraint('"index" >= 0', name=op.f("ck_volumes_index")),
        sa.CheckConstraint("raw_bytes >= 0 AND stored_bytes >= 0", name=op.f("ck_volumes_sizes")),
        sa.CheckConstraint("length(sha256) = 64", name=op.f("ck_volumes_sha256")),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job", NAME, nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("target", KEY, nullable=True),
        sa.Column("started_at", TIME, nullable=False),
        sa.Column("ended_at", TIME, nullable=True),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.CheckConstraint(
            "action IN ('snapshot', 'replicate', 'archive', 'prune', 'audit', 'restore')",
            name=op.f("ck_runs_action"),
        ),
        sa.CheckConstraint(
            "result IN ('running', 'ok', 'failed', 'partial')", name=op.f("ck_runs_result")
        ),
    )
    op.create_index(
        "ix_runs_job_action_target_started_at", "runs", ["job", "action", "target", "started_at"]
    )


def downgrade() -> None:
    """Drop every catalog table (all catalog rows are lost)."""
    op.drop_table("runs")
    op.drop_table("volumes")
    if op.get_bind().dialect.name == "sqlite":
        # SQLite's DROP TABLE deletes row by row and checks ON DELETE RESTRICT for each, so
        # remove chains leaf first; PostgreSQL drops the table without looking at rows.
        while op.get_bind().execute(
            sa.text(
                "DELETE FROM streams WHERE id NOT IN"
                " (SELECT parent_id FROM streams WHERE parent_id IS NOT NULL)"
            )
        ).rowcount:
            pass
    op.drop_table("streams")
    op.drop_table("replica_cursors")
    op.drop_table("snapshots")
    op.drop_table("datasets")
