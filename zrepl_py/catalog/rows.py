"""The catalog's rows as plain frozen dataclasses, and the vocabulary of states they use.

What the repository (``catalog.repository.Catalog``) takes and hands back, and what every
planner works on: no SQLAlchemy here, so a pure planner that imports rows loads no database
code (docs/decisions.md#pure-planners-load-no-database-code). Times are aware UTC; guids are
ints 0 .. 2**64-1; sizes are bytes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY

if TYPE_CHECKING:
    from zrepl_py.objects.manifest import Manifest

LOCAL_HOST = "local"

# Which stream states may follow which; "condemned" is the catalog tombstone written before the
# objects are deleted (docs/design.md#chain-prune-order), so nothing leaves it.
STATE_TRANSITIONS: dict[str, frozenset[str]] = {
    "uploading": frozenset({"uploaded", "bad", "condemned"}),
    "uploaded": frozenset({"verified", "bad", "condemned"}),
    "verified": frozenset({"verified", "bad", "condemned"}),
    "bad": frozenset({"condemned"}),
    "condemned": frozenset(),
}

STREAM_KINDS = ("full", "incremental")
STREAM_STATES = ("uploading", "uploaded", "verified", "condemned", "bad")
LIVING_STATES = frozenset({"uploaded", "verified"})
"""Stream states whose objects are complete and may be restored from or built on."""
RUN_ACTIONS = ("snapshot", "replicate", "archive", "prune", "audit", "restore", "hook",
               "failover", "failback", "drill", "copy")
"""``hook``: a pre or post command of an action (``zrepl_py.hooks``); its target is
``pre-ACTION`` or ``post-ACTION``. ``failover``/``failback``: ``zbak failover``/``failback``
of one target (revision 0007). ``drill``: one source's restore drill, its target the source
(``zrepl_py.drill``, revision 0008). ``copy``: ``zbak copy`` of a job into a store, its target
``STORE:DATASET`` (``zrepl_py.copying``, revision 0009)."""
RUN_RESULTS = ("running", "ok", "failed", "partial", "interrupted")
"""``interrupted``: the process running it died without ending the row (``runlog.sweep_interrupted``)."""
REPLICATION_METHODS = ("zfs", "rsync")
DRILL_KINDS = ("store", "replica")
DRILL_RESULTS = ("ok", "failed", "skipped", "pending")
"""``skipped``: not drilled by design (a cold store without ``thaw``, a sealed store without
an identity); ``pending``: a thaw was requested and the objects are not readable yet."""


@dataclasses.dataclass(frozen=True)
class SnapshotFact:
    """A snapshot as zfs lists it now.

    Attributes:
        name: the short name after ``@``.
        guid: the snapshot guid, 0 .. 2**64-1.
        createtxg: the transaction group that created it (orders snapshots).
        creation: creation time, aware UTC.
    """

    name: str
    guid: int
    createtxg: int
    creation: dt.datetime


@dataclasses.dataclass(frozen=True)
class SyncResult:
    """What :meth:`Catalog.sync_snapshots` changed: rows added, tombstoned, renamed."""

    added: int
    gone: int
    renamed: int = 0


@dataclasses.dataclass(frozen=True)
class SnapshotRow:
    """A catalogued snapshot; ``destroyed_at`` (aware UTC) is set once zfs stopped listing it."""

    host: str
    dataset: str
    name: str
    guid: int
    createtxg: int
    creation: dt.datetime
    first_seen: dt.datetime
    destroyed_at: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class RunRow:
    """One run of a job action; ``ended_at`` is None and ``result`` "running" until finished."""

    id: int
    job: str
    action: str
    target: str | None
    started_at: dt.datetime
    ended_at: dt.datetime | None
    result: str
    bytes: int
    error: str | None
    host: str | None = None
    """Host name of the process running it; None for rows written before revision 0003."""
    pid: int | None = None
    pid_start: int | None = None
    """The process start time (``transfers.process_start``), None when unknown."""


@dataclasses.dataclass(frozen=True)
class FailoverRow:
    """One failover of a job's target as this catalog knows it (``catalog.failovers``).

    Attributes:
        job: the job; target: the target as the config writes it.
        replica: the target dataset (the root of the replicas).
        failed_over_at: the failover's time, from the replica's ``zbak:failover`` mark
            (``values.failover``): with job and target, the row's identity.
        planned: ``zbak failover --planned``.
        recorded_at: when this catalog learned of it (the failover's run, or a replication
            that found the mark).
        failed_back_at: when a failback finished, None while failed over.
        kept: where the failback kept the source as it was (None: nothing kept).
    """

    job: str
    target: str
    replica: str
    failed_over_at: dt.datetime
    planned: bool
    recorded_at: dt.datetime
    failed_back_at: dt.datetime | None = None
    kept: str | None = None


@dataclasses.dataclass(frozen=True)
class CursorRow:
    """The last snapshot known complete on a replica target for one source dataset and job."""

    job: str
    target: str
    source_host: str
    source_dataset: str
    target_location: str
    method: str
    snapshot_name: str
    guid: int
    createtxg: int
    updated_at: dt.datetime


@dataclasses.dataclass(frozen=True, kw_only=True)
class NewStream:
    """A stream to record. Fulls leave ``parent_id``/``from_guid``/``from_name`` None;
    incrementals set ``parent_id`` (the stream they apply on) and ``from_guid`` (its ``to_guid``).

    Sizes are bytes (``raw_bytes`` as zfs sent it, ``stored_bytes`` after compression); times
    are aware UTC; ``object_prefix`` is the key prefix of the stream's objects in ``store``.
    """

    host: str = LOCAL_HOST
    dataset: str
    store: str
    kind: str
    to_guid: int
    to_name: str
    to_createtxg: int
    object_prefix: str
    storage_class: str
    compression: str
    created_at: dt.datetime
    parent_id: int | None = None
    from_guid: int | None = None
    from_name: str | None = None
    raw_bytes: int = 0
    stored_bytes: int = 0
    state: str = "uploading"
    uploaded_at: dt.datetime | None = None
    verified_at: dt.datetime | None = None
    manifest_version_id: str | None = None
    manifest_copy_version_id: str | None = None
    manifest_retain_until: dt.datetime | None = None
    sealed_to: tuple[str, ...] | None = None
    """A sealed stream's age recipients (``streams.codec.Codec.sealed_to``); None for a
    plain stream, or not known (docs/sealed.md#changing-the-recipients)."""


def shown_keys(keys: Iterable[str]) -> str:
    """Public keys for a message (pure): each cut to its first 16 characters, enough to tell
    an ``age1...`` or ``ssh-ed25519 ...`` key from the others."""
    return ", ".join(f"{key[:16]}..." for key in keys)


class ManifestLock(NamedTuple):
    """The recorded versions of stream ``stream_id``'s manifest and manifest copy (S3
    ``VersionId``) and when their Object Locks lapse (aware UTC; the earlier of the two)."""

    stream_id: int
    version_id: str
    copy_version_id: str
    retain_until: dt.datetime


class StoredVersion(NamedTuple):
    """Which version of its key a volume is (S3 ``VersionId``, on a versioned bucket) and
    when its Object Lock lapses (aware UTC; None: not locked)."""

    version_id: str
    retain_until: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class NewVolume:
    """One stored object of a stream: ``index`` 0, 1, ... in stream order; sizes in bytes;
    ``sha256`` the lowercase hex digest of the stored (compressed) bytes; ``version_id`` and
    ``retain_until`` its :class:`StoredVersion` when the store keeps versions (else None:
    a ``file://`` store, an unversioned bucket, a stream catalogued from its manifest)."""

    index: int
    key: str
    raw_bytes: int
    stored_bytes: int
    sha256: str
    version_id: str | None = None
    retain_until: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class ThawRow:
    """A thaw requested for a stream's cold objects: retrieval ``tier``, restored copies kept
    ``days`` days; ``requested_at`` and ``ready_by`` (expected readable) are aware UTC."""

    stream_id: int
    tier: str
    days: int
    requested_at: dt.datetime
    ready_by: dt.datetime


@dataclasses.dataclass(frozen=True)
class StreamRow:
    """A catalogued stream (see :class:`NewStream` for the fields) with its id."""

    id: int
    host: str
    dataset: str
    store: str
    kind: str
    parent_id: int | None
    from_guid: int | None
    to_guid: int
    from_name: str | None
    to_name: str
    to_createtxg: int
    raw_bytes: int
    stored_bytes: int
    object_prefix: str
    storage_class: str
    compression: str
    state: str
    created_at: dt.datetime
    uploaded_at: dt.datetime | None
    verified_at: dt.datetime | None
    bad_reason: str | None = None
    """Why the stream is ``bad`` (the marker's sentence: what is wrong, the object's key,
    who found it when); None in every other state, and for a stream marked bad before
    catalog revision 0006, which recorded no reason."""
    sealed_to: tuple[str, ...] | None = None
    """A sealed stream's age recipients (``streams.codec.Codec.sealed_to``); None for a
    plain stream, and for a sealed one catalogued before catalog revision 0012 or from its
    manifest."""

    @property
    def why_bad(self) -> str:
        """``bad_reason``, or a sentence saying it was not recorded (for messages)."""
        return self.bad_reason or ("the reason was not recorded: it was marked bad before"
                                   " zbak kept reasons (catalog revision 0006)")


def first_three(problems: Sequence[str]) -> str:
    """``problems`` joined with ``"; "``, those after the third counted (pure): a stream
    that lost 500 volumes gets a reason naming three keys, not 500."""
    more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def bad_reason(problem: str, action: str, now: dt.datetime) -> str:
    """The reason a stream is marked ``bad`` with (``StreamRow.bad_reason``, pure):
    ``problem`` (what is wrong, naming each object's key) and who found it when, e.g.
    ``"volume 1 (KEY) is missing (found by zbak audit at 2026-11-28 06:00Z)"``.

    Args:
        problem: the sentence; action: the command that found it (``archive``, ``audit``,
            ``restore``, ``prune``); now: aware, shown in UTC.
    """
    return f"{problem} (found by zbak {action} at {now.astimezone(dt.UTC):%Y-%m-%d %H:%M}Z)"


@dataclasses.dataclass(frozen=True)
class VolumeRow:
    """A catalogued volume of stream ``stream_id`` (see :class:`NewVolume`); readers read
    version ``version_id`` of its key when the catalog records one."""

    id: int
    stream_id: int
    index: int
    key: str
    raw_bytes: int
    stored_bytes: int
    sha256: str
    version_id: str | None = None
    retain_until: dt.datetime | None = None


class StreamLink(NamedTuple):
    """The chain facts of one stream (:meth:`Catalog.stream_links`): :class:`StreamRow`'s
    fields of the same names, without its times, prefix, class and compression."""

    id: int
    host: str
    dataset: str
    store: str
    kind: str
    parent_id: int | None
    from_guid: int | None
    to_guid: int
    from_name: str | None
    to_name: str
    to_createtxg: int
    raw_bytes: int
    stored_bytes: int
    state: str


class DatasetStreams(NamedTuple):
    """A catalogued dataset and how many streams it has per store
    (:meth:`Catalog.dataset_streams`): what a large audit batches by."""

    id: int
    host: str
    name: str
    stores: dict[str, int]

    @property
    def streams(self) -> int:
        """Its streams in every store together."""
        return sum(self.stores.values())


class Stored(Protocol):
    """What a put stored, as far as the catalog records it (``stores.base.PutResult``)."""

    @property
    def version_id(self) -> str | None: ...

    @property
    def retain_until(self) -> dt.datetime | None: ...


def manifest_rows(manifest: Manifest, *, store: str, prefix: str, parent_id: int | None,
                  uploaded_at: dt.datetime, versions: Mapping[int, StoredVersion] | None = None,
                  manifest_puts: Sequence[Stored] = (), sealed_to: tuple[str, ...] | None = None
                  ) -> tuple[NewStream, list[NewVolume]]:
    """The catalog rows of ``manifest``'s stream (state ``uploaded``), for
    ``Catalog.add_stream`` with ``manifest.snapshots`` as the carried snapshots.

    Args:
        store: the store's name; prefix: the stream's key prefix there.
        parent_id: the catalogued stream an incremental applies on (None for a full).
        uploaded_at: aware UTC.
        versions: the stored version of each volume by index, as the upload learnt it (a
            manifest names keys only, docs/design.md#object-lock); None: not known.
        manifest_puts: the puts of the manifest and its copy (``put_with_copy``): their
            versions and the earlier lock are recorded when both were locked.
        sealed_to: the recipients the writer sealed the volumes to (``Codec.sealed_to``; a
            manifest names none); None: plain, or not known.
    """
    stream = NewStream(
        host=manifest.host, dataset=manifest.dataset, store=store, kind=manifest.kind,
        to_guid=manifest.to_snap.guid, to_name=manifest.to_snap.name,
        to_createtxg=manifest.to_snap.createtxg, object_prefix=prefix,
        storage_class=manifest.storage_class, compression=manifest.compression,
        created_at=manifest.created_at, parent_id=parent_id,
        from_guid=manifest.from_snap.guid if manifest.from_snap else None,
        from_name=manifest.from_snap.name if manifest.from_snap else None,
        raw_bytes=manifest.raw_bytes, stored_bytes=manifest.stored_bytes,
        state="uploaded", uploaded_at=uploaded_at, sealed_to=sealed_to,
    )
    if len(manifest_puts) == 2:
        primary, copy = manifest_puts
        if (primary.version_id and copy.version_id and primary.retain_until
                and copy.retain_until):
            stream = dataclasses.replace(
                stream, manifest_version_id=primary.version_id,
                manifest_copy_version_id=copy.version_id,
                manifest_retain_until=min(primary.retain_until, copy.retain_until))
    known = versions or {}
    volumes = [NewVolume(v.index, v.key, v.raw_bytes, v.stored_bytes, v.sha256,
                         *(known.get(v.index) or (None, None)))
               for v in manifest.volumes]
    return stream, volumes


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrillRow:
    """One source's restore drill (``zrepl_py.drill``, docs/drills.md).

    Attributes:
        id: the row id (0 for a drill not recorded yet).
        job: the ``[jobs.NAME]`` key.
        source: the store's name, or the replica target as the config writes it.
        kind: ``store`` or ``replica`` (``DRILL_KINDS``).
        started_at / ended_at: aware UTC.
        result: one of ``DRILL_RESULTS``.
        seconds: the recovery time: seconds the restores of the drill took (send and
            receive, or fetch, verify and receive, up to the received guid's check), None
            when nothing was restored.
        bytes: the restored data (``referenced`` of each restored snapshot), bytes.
        datasets: datasets restored (or meant to be).
        files: files compared with the source snapshot, None when none were.
        snapshot: the snapshot restored of the job's dataset (or of its first dataset).
        thaw: what the source's cold objects needed (``thaw 3 object(s), ...``), None when
            nothing was cold.
        detail: why it failed, was skipped or waits; what was not compared; None.
    """

    id: int = 0
    job: str
    source: str
    kind: str
    started_at: dt.datetime
    ended_at: dt.datetime
    result: str
    seconds: float | None = None
    bytes: int = 0
    datasets: int = 0
    files: int | None = None
    snapshot: str | None = None
    thaw: str | None = None
    detail: str | None = None


def recorded_versions(volumes: Mapping[int, Sequence[VolumeRow]]) -> dict[str, str]:
    """Key -> version id of every volume row that records one (``volumes`` by stream id)."""
    return {v.key: v.version_id for rows in volumes.values() for v in rows
            if v.version_id is not None}


def recorded_manifest_versions(streams: Iterable[StreamRow], manifests: Iterable[ManifestLock]
                               ) -> dict[str, str]:
    """Key -> version id of the manifest and manifest copy of each of ``streams`` whose
    manifest versions the catalog records (``manifests``: ``Catalog.manifest_locks``)."""
    prefixes = {s.id: s.object_prefix for s in streams}
    found = {}
    for m in manifests:
        prefix = prefixes.get(m.stream_id)
        if prefix is not None:
            found[prefix + MANIFEST] = m.version_id
            found[prefix + MANIFEST_COPY] = m.copy_version_id
    return found


def owners(streams: Sequence[StreamRow], volumes: Mapping[int, Sequence[VolumeRow]]
           ) -> dict[str, StreamRow]:
    """Key -> the stream whose volume, manifest or manifest copy it is, for the streams
    not condemned (a prune that stopped may have deleted a condemned stream's keys)."""
    by_key: dict[str, StreamRow] = {}
    for stream in streams:
        if stream.state == "condemned":
            continue
        by_key[stream.object_prefix + MANIFEST] = stream
        by_key[stream.object_prefix + MANIFEST_COPY] = stream
        for volume in volumes.get(stream.id, ()):
            by_key[volume.key] = stream
    return by_key
