"""The catalog's tables (SQLAlchemy Core): what the database holds and the rules it enforces
itself.

The chain rules (docs/design.md#catalog-and-chain-validity) live in the schema, so that no code
path (nor a hand-typed SQL statement) can break a chain:

* ``ck_streams_kind_parent``: a full has no parent and no ``from_guid``; an incremental has both.
* ``fk_streams_parent_continuity``: ``(parent_id, from_guid, dataset_id, store)`` references
  ``streams(id, to_guid, dataset_id, store)`` (backed by ``uq_streams_chain_key``), so an
  incremental must start at the guid its parent ends at, in the same dataset and store;
  ``ON DELETE RESTRICT`` refuses deleting a parent that still has children.

Core tables, not ORM classes: the repository reads and writes plain rows (``rows``), and
``sqlalchemy.orm`` with a declarative mapping cost every command that opens the catalog
about 0.06 s of CPU more to import (docs/decisions.md#commands-start-in-under-300-ms).

Keep this file and ``migrations/versions`` in step: a test runs alembic's ``compare_metadata``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from zrepl_py.catalog.rows import (
    DRILL_KINDS,
    DRILL_RESULTS,
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
VERSION_ID_LEN = 1024  # S3: "no more than 1,024 bytes long" (user guide, "Working with objects
# in a versioning-enabled bucket")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    """SQL text ``column IN ('a', 'b')`` for a CHECK constraint (values are constants)."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.Integer, primary_key=True)


def _column(name: str, kind: Any, *, nullable: bool = False) -> sa.Column[Any]:
    """A column, NOT NULL unless ``nullable``."""
    return sa.Column(name, kind, nullable=nullable)


def _snapshot(name: str = "name") -> tuple[sa.Column[str], sa.Column[int], sa.Column[int]]:
    """A snapshot's short name (column ``name``), guid and createtxg."""
    return (_column(name, sa.String(NAME_LEN)), _column("guid", UInt64),
            _column("createtxg", sa.BigInteger))


def _reference(name: str, target: str) -> sa.Column[int]:
    """A NOT NULL foreign key column to ``target`` (``TABLE.id``) that refuses deleting the
    row it points at."""
    return sa.Column(name, sa.ForeignKey(target, ondelete="RESTRICT"), nullable=False)


metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
"""The catalog's schema (migrations/env.py compares the database with it)."""

dataset_table = sa.Table(
    "datasets", metadata,
    _id(),
    _column("host", sa.String(NAME_LEN)),
    _column("name", sa.String(NAME_LEN)),
    sa.UniqueConstraint("host", "name"),
)
"""A ZFS dataset on a host (``host="local"`` for this machine); ids are never reused."""

snapshot_table = sa.Table(
    "snapshots", metadata,
    _id(),
    _reference("dataset_id", "datasets.id"),
    *_snapshot(),
    _column("creation", UtcDateTime),
    _column("first_seen", UtcDateTime),
    _column("destroyed_at", UtcDateTime, nullable=True),
    sa.UniqueConstraint("dataset_id", "guid"),
    sa.Index("ix_snapshots_dataset_id_createtxg", "dataset_id", "createtxg"),
)
"""A snapshot zbak has seen; ``destroyed_at`` is set once zfs stops listing it (tombstone).

``name`` is the short part after ``@``; the guid identifies it forever, the createtxg orders it.
"""

replica_cursor_table = sa.Table(
    "replica_cursors", metadata,
    _id(),
    _column("job", sa.String(NAME_LEN)),
    _column("target", sa.String(KEY_LEN)),
    _reference("source_dataset_id", "datasets.id"),
    _column("target_location", sa.String(KEY_LEN)),
    _column("method", sa.String(16)),
    *_snapshot("snapshot_name"),
    _column("updated_at", UtcDateTime),
    sa.UniqueConstraint("job", "target", "source_dataset_id"),
    sa.CheckConstraint(_one_of("method", REPLICATION_METHODS), name="method"),
)
"""Where replication of one source dataset to one target stands, per job.

``target`` is the target string of the config (``HOST:POOL/PATH`` or ``HOST:/dir``);
``target_location`` the dataset or directory the source dataset lands in; the snapshot
columns name the last snapshot known to be complete on the target.
"""

stream_table = sa.Table(
    "streams", metadata,
    _id(),
    _reference("dataset_id", "datasets.id"),
    _column("store", sa.String(NAME_LEN)),
    _column("kind", sa.String(16)),
    _column("parent_id", sa.Integer, nullable=True),
    _column("from_guid", UInt64, nullable=True),
    _column("to_guid", UInt64),
    _column("from_name", sa.String(NAME_LEN), nullable=True),
    _column("to_name", sa.String(NAME_LEN)),
    _column("to_createtxg", sa.BigInteger),
    _column("raw_bytes", sa.BigInteger),
    _column("stored_bytes", sa.BigInteger),
    _column("object_prefix", sa.String(KEY_LEN)),
    _column("storage_class", sa.String(64)),
    _column("compression", sa.String(32)),
    _column("state", sa.String(16)),
    _column("created_at", UtcDateTime),
    _column("uploaded_at", UtcDateTime, nullable=True),
    _column("verified_at", UtcDateTime, nullable=True),
    # What the store's listing said of manifest.json (catalog.stamps) when an audit last
    # read it and found it agreeing with this row; None: not read since (revision 0005).
    _column("manifest_seen", sa.String(KEY_LEN), nullable=True),
    # When that audit read it.
    _column("manifest_read_at", UtcDateTime, nullable=True),
    # Why the stream is ``bad``, set with that state (``archive.damage.mark_bad``); None
    # for every other state and for streams marked bad before revision 0006.
    _column("bad_reason", sa.Text, nullable=True),
    # On a store that keeps versions (Object Lock): the versions of manifest.json and its
    # copy the upload made, and when the locks of both lapse (revision 0011); None
    # elsewhere, and for streams catalogued before it or from their manifest.
    _column("manifest_version_id", sa.String(VERSION_ID_LEN), nullable=True),
    _column("manifest_copy_version_id", sa.String(VERSION_ID_LEN), nullable=True),
    _column("manifest_retain_until", UtcDateTime, nullable=True),
    # A sealed stream's age recipients, one public key per line, sorted (revision 0012;
    # docs/sealed.md#changing-the-recipients); None for a plain stream, and for a sealed
    # one catalogued before it or from its manifest (not known).
    _column("sealed_to", sa.Text, nullable=True),
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
"""One archived send stream (full or incremental) of a dataset in a store."""

volume_table = sa.Table(
    "volumes", metadata,
    _id(),
    _reference("stream_id", "streams.id"),
    _column("index", sa.Integer),
    _column("key", sa.String(KEY_LEN)),
    _column("raw_bytes", sa.BigInteger),
    _column("stored_bytes", sa.BigInteger),
    _column("sha256", sa.String(64)),
    _column("version_id", sa.String(VERSION_ID_LEN), nullable=True),
    _column("retain_until", UtcDateTime, nullable=True),
    sa.UniqueConstraint("stream_id", "index"),
    sa.CheckConstraint('"index" >= 0', name="index"),
    sa.CheckConstraint("raw_bytes >= 0 AND stored_bytes >= 0", name="sizes"),
    sa.CheckConstraint("length(sha256) = 64", name="sha256"),
)
"""One stored object of a stream: ``index`` 0, 1, ... in stream order.

``sha256`` is the hex digest of the stored (compressed) bytes; sizes are bytes. ``version_id``
is the version of ``key`` the upload made (S3 on a versioned bucket; NULL elsewhere, and for a
stream catalogued from its manifest), ``retain_until`` when its Object Lock lapses (NULL: not
locked; docs/design.md#object-lock).
"""

stream_snapshot_table = sa.Table(
    "stream_snapshots", metadata,
    _id(),
    _reference("stream_id", "streams.id"),
    *_snapshot(),
    sa.UniqueConstraint("stream_id", "guid"),
    sa.Index("ix_stream_snapshots_guid", "guid"),
)
"""A snapshot a stream carries: a full carries its one snapshot, an ``-I`` incremental every
snapshot after its from-snapshot up to and including its to-snapshot."""

thaw_request_table = sa.Table(
    "thaw_requests", metadata,
    _id(),
    _reference("stream_id", "streams.id"),
    _column("tier", sa.String(16)),
    _column("days", sa.Integer),
    _column("requested_at", UtcDateTime),
    _column("ready_by", UtcDateTime),
    sa.UniqueConstraint("stream_id"),
)
"""A thaw (S3 RestoreObject) requested for every cold object of a stream, so a rerun of a
restore or deep audit knows it asked and when the objects should be readable."""

failover_table = sa.Table(
    "failovers", metadata,
    _id(),
    _column("job", sa.String(NAME_LEN)),
    _column("target", sa.String(KEY_LEN)),
    _column("replica", sa.String(NAME_LEN)),
    _column("failed_over_at", UtcDateTime),
    _column("planned", sa.Boolean()),
    _column("recorded_at", UtcDateTime),
    _column("failed_back_at", UtcDateTime, nullable=True),
    _column("kept", sa.String(NAME_LEN), nullable=True),
    sa.UniqueConstraint("job", "target", "failed_over_at"),
)
"""A failover of a job's target (revision 0007), for ``zbak status``: the replica's own
``zbak:failover`` mark is what replication obeys (``values.failover``); this row is what the
catalog shows."""

run_table = sa.Table(
    "runs", metadata,
    _id(),
    _column("job", sa.String(NAME_LEN)),
    _column("action", sa.String(16)),
    _column("target", sa.String(KEY_LEN), nullable=True),
    _column("started_at", UtcDateTime),
    _column("ended_at", UtcDateTime, nullable=True),
    _column("result", sa.String(16)),
    _column("bytes", sa.BigInteger),
    _column("error", sa.Text, nullable=True),
    # The host name of the process running it (None: recorded before revision 0003).
    _column("host", sa.String(NAME_LEN), nullable=True),
    _column("pid", sa.Integer, nullable=True),
    # The process start time (clock ticks after boot, ``transfers.process_start``).
    _column("pid_start", sa.BigInteger, nullable=True),
    sa.CheckConstraint(_one_of("action", RUN_ACTIONS), name="action"),
    sa.CheckConstraint(_one_of("result", RUN_RESULTS), name="result"),
    sa.Index("ix_runs_job_action_target_started_at", "job", "action", "target", "started_at"),
)
"""One run of a job's action (snapshot, replicate, ...), possibly against one target."""

drill_table = sa.Table(
    "drills", metadata,
    _id(),
    _column("job", sa.String(NAME_LEN)),
    _column("source", sa.String(KEY_LEN)),
    _column("kind", sa.String(16)),
    _column("started_at", UtcDateTime),
    _column("ended_at", UtcDateTime),
    _column("result", sa.String(16)),
    _column("seconds", sa.Float, nullable=True),
    _column("bytes", sa.BigInteger),
    _column("datasets", sa.Integer),
    _column("files", sa.BigInteger, nullable=True),
    _column("snapshot", sa.String(NAME_LEN), nullable=True),
    _column("thaw", sa.Text, nullable=True),
    _column("detail", sa.Text, nullable=True),
    sa.CheckConstraint(_one_of("kind", DRILL_KINDS), name="kind"),
    sa.CheckConstraint(_one_of("result", DRILL_RESULTS), name="result"),
    sa.CheckConstraint("bytes >= 0 AND datasets >= 0", name="sizes"),
    sa.Index("ix_drills_job_source_started_at", "job", "source", "started_at"),
)
"""One source's restore drill (``rows.DrillRow``, revision 0008): when, how it ended, the
recovery time and bytes, what thawing its cold objects needed."""
