"""SQLAlchemy models of the catalog: what the database holds and the rules it enforces itself.

The chain rules of DESIGN.md "Catalog and chain validity" live in the schema, so that no code
path (nor a hand-typed SQL statement) can break a chain:

* ``ck_streams_kind_parent``: a full has no parent and no ``from_guid``; an incremental has both.
* ``fk_streams_parent_continuity``: ``(parent_id, from_guid, dataset_id, store)`` references
  ``streams(id, to_guid, dataset_id, store)`` (backed by ``uq_streams_chain_key``), so an
  incremental must start at the guid its parent ends at, in the same dataset and store;
  ``ON DELETE RESTRICT`` refuses deleting a parent that still has children.

Keep this file and ``migrations/versions`` in step: a test runs alembic's ``compare_metadata``.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from zrepl_py.catalog.rows import (
    REPLICATION_METHODS,
    RUN_ACTIONS,
    RUN_RESULTS,
    STREAM_KINDS,
    STREAM_STATES,
)
from zrepl_py.catalog.types import UInt64, UtcDateTime

# Constraint names are fixed so migrations (and SQLite batch rebuilds) can address them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}


NAME_LEN = 255  # ZFS_MAX_DATASET_NAME_LEN - 1: the longest dataset or snapshot name
KEY_LEN = 1024  # S3's object key limit in bytes


def _one_of(column: str, values: tuple[str, ...]) -> str:
    """SQL text ``column IN ('a', 'b')`` for a CHECK constraint (values are constants)."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    """Declarative base carrying the catalog's metadata and its naming convention."""

    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class Dataset(Base):
    """A ZFS dataset on a host (``host="local"`` for this machine); ids are never reused."""

    __tablename__ = "datasets"
    __table_args__ = (sa.UniqueConstraint("host", "name"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    host: Mapped[str] = mapped_column(sa.String(NAME_LEN))
    name: Mapped[str] = mapped_column(sa.String(NAME_LEN))


class Snapshot(Base):
    """A snapshot zbak has seen; ``destroyed_at`` is set once zfs stops listing it (tombstone).

    ``name`` is the short part after ``@``; the guid identifies it forever, the createtxg orders it.
    """

    __tablename__ = "snapshots"
    __table_args__ = (
        sa.UniqueConstraint("dataset_id", "guid"),
        sa.Index("ix_snapshots_dataset_id_createtxg", "dataset_id", "createtxg"),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(
        sa.ForeignKey("datasets.id", ondelete="RESTRICT")
    )
    name: Mapped[str] = mapped_column(sa.String(NAME_LEN))
    guid: Mapped[int] = mapped_column(UInt64)
    createtxg: Mapped[int] = mapped_column(sa.BigInteger)
    creation: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    first_seen: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    destroyed_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)


class ReplicaCursor(Base):
    """Where replication of one source dataset to one target stands, per job.

    ``target`` is the target string of the config (``HOST:POOL/PATH`` or ``HOST:/dir``);
    ``target_location`` the dataset or directory the source dataset lands in; the snapshot
    columns name the last snapshot known to be complete on the target.
    """

    __tablename__ = "replica_cursors"
    __table_args__ = (
        sa.UniqueConstraint("job", "target", "source_dataset_id"),
        sa.CheckConstraint(_one_of("method", REPLICATION_METHODS), name="method"),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    job: Mapped[str] = mapped_column(sa.String(NAME_LEN))
    target: Mapped[str] = mapped_column(sa.String(KEY_LEN))
    source_dataset_id: Mapped[int] = mapped_column(
        sa.ForeignKey("datasets.id", ondelete="RESTRICT")
    )
    target_location: Mapped[str] = mapped_column(sa.String(KEY_LEN))
    method: Mapped[str] = mapped_column(sa.String(16))
    snapshot_name: Mapped[str] = mapped_column(sa.String(NAME_LEN))
    guid: Mapped[int] = mapped_column(UInt64)
    createtxg: Mapped[int] = mapped_column(sa.BigInteger)
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class Stream(Base):
    """One archived send stream (full or incremental) of a dataset in a store."""

    __tablename__ = "streams"
    __table_args__ = (
        sa.UniqueConstraint("id", "to_guid", "dataset_id", "store", name="uq_streams_chain_key"),
        sa.UniqueConstraint("store", "object_prefix"),
        sa.ForeignKeyConstraint(
            ["parent_id", "from_guid", "dataset_id", "store"],
            ["streams.id", "streams.to_guid", "streams.dataset_id", "streams.store"],
            name="fk_streams_parent_continuity",
            ondelete="RESTRICT",
        ),
        sa.CheckConstraint(
            "(kind = 'full' AND parent_id IS NULL AND from_guid IS NULL)"
            " OR (kind = 'incremental' AND parent_id IS NOT NULL AND from_guid IS NOT NULL)",
            name="kind_parent",
        ),
        sa.CheckConstraint(_one_of("kind", STREAM_KINDS), name="kind"),
        sa.CheckConstraint(_one_of("state", STREAM_STATES), name="state"),
        sa.CheckConstraint("raw_bytes >= 0 AND stored_bytes >= 0", name="sizes"),
        sa.Index("ix_streams_dataset_id_store", "dataset_id", "store"),
        sa.Index("ix_streams_parent_id", "parent_id"),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(
        sa.ForeignKey("datasets.id", ondelete="RESTRICT")
    )
    store: Mapped[str] = mapped_column(sa.String(NAME_LEN))
    kind: Mapped[str] = mapped_column(sa.String(16))
    parent_id: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    from_guid: Mapped[int | None] = mapped_column(UInt64, nullable=True)
    to_guid: Mapped[int] = mapped_column(UInt64)
    from_name: Mapped[str | None] = mapped_column(sa.String(NAME_LEN), nullable=True)
    to_name: Mapped[str] = mapped_column(sa.String(NAME_LEN))
    to_createtxg: Mapped[int] = mapped_column(sa.BigInteger)
    raw_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    stored_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    object_prefix: Mapped[str] = mapped_column(sa.String(KEY_LEN))
    storage_class: Mapped[str] = mapped_column(sa.String(64))
    compression: Mapped[str] = mapped_column(sa.String(32))
    state: Mapped[str] = mapped_column(sa.String(16))
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    uploaded_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    verified_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    manifest_seen: Mapped[str | None] = mapped_column(sa.String(KEY_LEN), nullable=True)
    """What the store's listing said of ``manifest.json`` (``catalog.stamps``) when an audit
    last read it and found it agreeing with this row; None: not read since (revision 0005)."""
    manifest_read_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    """When that audit read it."""


class Volume(Base):
    """One stored object of a stream: ``index`` 0, 1, ... in stream order.

    ``sha256`` is the hex digest of the stored (compressed) bytes; sizes are bytes.
    """

    __tablename__ = "volumes"
    __table_args__ = (
        sa.UniqueConstraint("stream_id", "index"),
        sa.CheckConstraint('"index" >= 0', name="index"),
        sa.CheckConstraint("raw_bytes >= 0 AND stored_bytes >= 0", name="sizes"),
        sa.CheckConstraint("length(sha256) = 64", name="sha256"),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    stream_id: Mapped[int] = mapped_column(sa.ForeignKey("streams.id", ondelete="RESTRICT"))
    index: Mapped[int] = mapped_column("index", sa.Integer)
    key: Mapped[str] = mapped_column(sa.String(KEY_LEN))
    raw_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    stored_bytes: Mapped[int] = mapped_column(sa.BigInteger)
    sha256: Mapped[str] = mapped_column(sa.String(64))


class StreamSnapshot(Base):
    """A snapshot a stream carries: a full carries its one snapshot, an ``-I`` incremental
    every snapshot after its from-snapshot up to and including its to-snapshot."""

    __tablename__ = "stream_snapshots"
    __table_args__ = (
        sa.UniqueConstraint("stream_id", "guid"),
        sa.Index("ix_stream_snapshots_guid", "guid"),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    stream_id: Mapped[int] = mapped_column(sa.ForeignKey("streams.id", ondelete="RESTRICT"))
    name: Mapped[str] = mapped_column(sa.String(NAME_LEN))
    guid: Mapped[int] = mapped_column(UInt64)
    createtxg: Mapped[int] = mapped_column(sa.BigInteger)


class ThawRequest(Base):
    """A thaw (S3 RestoreObject) requested for every cold object of a stream, so a rerun of a
    restore or deep audit knows it asked and when the objects should be readable."""

    __tablename__ = "thaw_requests"
    __table_args__ = (sa.UniqueConstraint("stream_id"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    stream_id: Mapped[int] = mapped_column(sa.ForeignKey("streams.id", ondelete="RESTRICT"))
    tier: Mapped[str] = mapped_column(sa.String(16))
    days: Mapped[int] = mapped_column(sa.Integer)
    requested_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    ready_by: Mapped[dt.datetime] = mapped_column(UtcDateTime)


class Run(Base):
    """One run of a job's action (snapshot, replicate, ...), possibly against one target."""

    __tablename__ = "runs"
    __table_args__ = (
        sa.CheckConstraint(_one_of("action", RUN_ACTIONS), name="action"),
        sa.CheckConstraint(_one_of("result", RUN_RESULTS), name="result"),
        sa.Index("ix_runs_job_action_target_started_at", "job", "action", "target", "started_at"),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    job: Mapped[str] = mapped_column(sa.String(NAME_LEN))
    action: Mapped[str] = mapped_column(sa.String(16))
    target: Mapped[str | None] = mapped_column(sa.String(KEY_LEN), nullable=True)
    started_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime, nullable=True)
    result: Mapped[str] = mapped_column(sa.String(16))
    bytes: Mapped[int] = mapped_column(sa.BigInteger)
    error: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    host: Mapped[str | None] = mapped_column(sa.String(NAME_LEN), nullable=True)
    """The host name of the process running it (None: recorded before revision 0003)."""
    pid: Mapped[int | None] = mapped_column(sa.Integer, nullable=True)
    pid_start: Mapped[int | None] = mapped_column(sa.BigInteger, nullable=True)
    """The process start time (clock ticks after boot, ``transfers.process_start``)."""
