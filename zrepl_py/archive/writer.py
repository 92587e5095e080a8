"""Write one planned stream to a store, in the order that keeps the catalog honest.

Order (docs/design.md#archive-writer-order):

1. volumes, each durable before the next, with the upload's progress record updated after
   each (``archive.progress``: ``progress.json`` in the stream's prefix, or on this host in
   the state directory for a store that keeps it locally, a sealed one);
2. ``manifest.json`` (STANDARD class), once the last volume is durable, then its copy
   ``manifest.json.copy`` (same bytes; readers fall back to it,
   docs/reliability.md#r26-catalog-metadata-copy-with-checksum);
3. the catalog row (state ``uploaded``) with its volumes and carried snapshots;
4. the progress record removed.

A crash before 2 leaves a partial upload the next run resumes (or deletes, when the plan
changed); between 2 and 3 the next run adopts the manifest (from its copy when the primary is
damaged, writing whichever of the two is missing or damaged) instead of sending again; after 3
only a stale progress record remains, removed by the next run. The catalog never names an
object that was not written. Where the record is kept on the host, a run on another host
finds none and sends the stream again over the partial upload.

A crash mid-put also leaves what the put had written so far, which is no object (a
``file://`` temporary file, an S3 multipart upload): the store's next put of the same key
removes a temporary file, and a run that resumes or deletes a partial upload removes the
leftovers under that stream's prefix older than its own start (:func:`drop_unfinished`;
``docs/decisions.md#leftover-uploads-of-interrupted-archives``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Collection, Mapping, Sequence

from zrepl_py import __version__
from zrepl_py.archive.planner import PlannedStream
from zrepl_py.archive.progress import DoneVolume, InStore, ProgressHome
from zrepl_py.archive.throttle import Throttle
from zrepl_py.archive.volumes import RestartNeeded, write_volumes
from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import StoredVersion, manifest_rows
from zrepl_py.errors import ObjectNotFound, StoreError, StreamCorrupt
from zrepl_py.objects.checked import put_with_copy, read_object, read_with_copy
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY, copy_key
from zrepl_py.objects.manifest import Manifest, VolumeRecord
from zrepl_py.observe.progress import MeteredReader
from zrepl_py.proc.pipeline import Stage
from zrepl_py.proc.python_end import SendReader
from zrepl_py.stores.base import Backend, PutResult
from zrepl_py.streams.codec import Codec

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """Everything needed to write one stream.

    Attributes:
        host / dataset: the source dataset (host ``local`` or a config host name).
        store: the store's name in the config.
        planned: the planner's stream (kind, from/to, carried snapshots).
        parent_id: the catalogued stream an incremental applies on (None for a full).
        prefix: the stream's key prefix (layout.stream_prefix).
        send_stages: the pipeline producing the raw stream (``[ssh HOST] zfs send ...``).
        send_flags: the send flags, for the manifest (e.g. ``("-I",)``).
        volume_size: raw bytes per volume.
        codec: what happens to each volume's bytes (``streams.codec``: the zstd level, ...).
        storage_class: the class asked for the volumes.
    """

    host: str
    dataset: str
    store: str
    planned: PlannedStream
    parent_id: int | None
    prefix: str
    send_stages: tuple[Stage, ...]
    send_flags: tuple[str, ...]
    volume_size: int
    codec: Codec
    storage_class: str


@dataclasses.dataclass(frozen=True)
class WrittenStream:
    """What writing a stream did: its catalog id, sizes (bytes), volumes written and volumes
    skipped because an interrupted run had stored them already, and whether an existing
    manifest was adopted instead of sending."""

    stream_id: int
    raw_bytes: int
    stored_bytes: int
    volumes_written: int
    volumes_skipped: int
    adopted: bool = False


def write_stream(
    spec: StreamSpec,
    backend: Backend,
    catalog: Catalog,
    now: Callable[[], dt.datetime],
    *,
    on_volume: Callable[[VolumeRecord, bool], None] | None = None,
    progress: Callable[[int, float], None] | None = None,
    listed: Collection[str] | None = None,
    home: ProgressHome | None = None,
    throttle: Throttle | None = None,
) -> WrittenStream:
    """Write ``spec``'s stream (see the module docstring for the order) and catalog it.

    ``progress(raw bytes read from the send, seconds)`` is called about once a second
    (``observe.progress.MeteredReader``), e.g. a ``ProgressReporter``; the caller closes it.
    ``listed``: the names a listing made under the job's lock found at ``spec.prefix``
    (None: not listed); a manifest or ``progress.json`` it does not show is not asked for
    (three GETs less per stream of a tree, docs/decisions.md#an-archive-run-reads-its-tree-once).
    ``home``: where the upload's progress record lives (``archive.progress``); None: in
    the store.
    ``throttle`` paces the volumes' uploads (the store's ``bandwidth_limit``,
    ``archive.throttle``); None: no limit.

    Raises:
        PipelineFailed: ``zfs send`` failed (no manifest, no catalog row; stored volumes
            are kept for the next run to check and skip).
        StoreError: the store failed.
        StreamCorrupt: a manifest already at the prefix contradicts the plan.
        ChainBroken, CatalogError: the catalog refused the row.
    """
    # The store's clock, not the run's (an injected clock in tests): leftovers are told
    # from running puts by the store's times (Backend.abort_uploads_before).
    began = dt.datetime.now(dt.UTC)
    home = home or InStore(backend)
    adopted = (_adopt(spec, backend) if listed is None or {MANIFEST, MANIFEST_COPY} & set(listed)
               else None)
    if adopted is not None:
        # Its volumes' recipients are the crashed run's, not known here.
        stream_id = _catalog(spec, adopted, catalog, now(), sealed_to=None)
        home.delete(spec.prefix)
        return WrittenStream(stream_id, adopted.raw_bytes, adopted.stored_bytes, 0, 0, True)
    # Not named ``progress``: that is the rate callback the resumed send reports to.
    interrupted = home.read(spec.prefix, listed)
    done: tuple[DoneVolume, ...] = ()
    if interrupted is not None:
        if (interrupted.volume_size, interrupted.codec) == (spec.volume_size,
                                                             spec.codec.fingerprint):
            done = interrupted.volumes
        else:
            delete_prefix(backend, spec.prefix, began)
    counts = {"written": 0, "skipped": 0}

    def count(record: VolumeRecord, skipped: bool) -> None:
        counts["skipped" if skipped else "written"] += 1
        if on_volume is not None:
            on_volume(record, skipped)

    try:
        volumes, used_class = _send(spec, backend, home, done, count, progress, throttle)
    except RestartNeeded as exc:
        log.warning("%s; deleting the partial upload and sending %s again", exc, spec.prefix)
        delete_prefix(backend, spec.prefix, began)
        counts.update(written=0, skipped=0)
        volumes, used_class = _send(spec, backend, home, (), count, progress, throttle)
    manifest = _manifest(spec, [v.record for v in volumes], used_class, now())
    puts = put_with_copy(backend, spec.prefix + MANIFEST, manifest.to_json())
    stream_id = _catalog(spec, manifest, catalog, now(),
                         {v.record.index: v.version for v in volumes if v.version is not None},
                         puts, sealed_to=spec.codec.sealed_to)
    home.delete(spec.prefix)
    if interrupted is not None:
        drop_unfinished(backend, spec.prefix, began)
    return WrittenStream(stream_id, manifest.raw_bytes, manifest.stored_bytes,
                         counts["written"], counts["skipped"])


def _send(spec: StreamSpec, backend: Backend, home: ProgressHome, done: Sequence[DoneVolume],
          on_volume: Callable[[VolumeRecord, bool], None],
          progress: Callable[[int, float], None] | None = None,
          throttle: Throttle | None = None) -> tuple[list[DoneVolume], str]:
    with SendReader(spec.send_stages) as reader:
        return write_volumes(MeteredReader(reader, progress), backend, spec.prefix,
                             volume_size=spec.volume_size,
                             codec=spec.codec, storage_class=spec.storage_class,
                             progress=home, done=done,
                             on_volume=on_volume, throttle=throttle)


def delete_prefix(backend: Backend, prefix: str, before: dt.datetime) -> int:
    """Delete every object under ``prefix`` (a partial upload given up) and what the
    unfinished puts there left before ``before`` (:func:`drop_unfinished`); return how
    many objects were deleted.

    Raises:
        StoreError: listing or deleting an object failed.
    """
    keys = [info.key for info in backend.list(prefix)]
    for key in keys:
        backend.delete(key)
    drop_unfinished(backend, prefix, before)
    return len(keys)


def drop_unfinished(backend: Backend, prefix: str, before: dt.datetime) -> None:
    """Remove what unfinished puts under the stream ``prefix`` left before ``before`` (aware
    UTC, the store's clock): the temporary file or multipart upload of a put killed mid-way,
    in a stream this run resumes or gives up. Only this stream's prefix, which the run's
    dataset lock keeps to itself, and only what is older than the run's work on it: see
    ``docs/decisions.md#leftover-uploads-of-interrupted-archives``. A failure (e.g. an S3
    credential without s3:ListBucketMultipartUploads) is a warning: the stream itself is
    written, and ``zbak audit`` reports what is left."""
    try:
        removed = backend.abort_uploads_before(before, prefix)
    except StoreError as exc:
        log.warning("could not remove what interrupted uploads left under %s in store %s: %s;"
                    " `zbak audit` reports it, `zbak audit --repair` removes it", prefix,
                    backend.name, exc)
        return
    for what in removed:
        log.info("removed %s in store %s, left by an interrupted upload", what, backend.name)


def _manifest(spec: StreamSpec, volumes: Sequence[VolumeRecord], storage_class: str,
              now: dt.datetime) -> Manifest:
    planned = spec.planned
    return Manifest(
        host=spec.host, dataset=spec.dataset, kind=planned.kind,
        from_snap=planned.from_snap, to_snap=planned.to_snap,
        snapshots=planned.carried, volumes=tuple(volumes),
        compression=spec.codec.name, compression_level=spec.codec.level, send_flags=spec.send_flags,
        storage_class=storage_class, tool=f"zbak {__version__}", created_at=now,
    )


def _adopt(spec: StreamSpec, backend: Backend) -> Manifest | None:
    """The manifest a crashed run wrote at the prefix before its catalog row, if any; a
    missing or damaged primary or copy is rewritten from the good one."""
    key = spec.prefix + MANIFEST
    try:
        loaded = read_with_copy(backend, key, Manifest.from_json, StreamCorrupt)
    except ObjectNotFound:
        return None
    manifest = loaded.value
    planned = spec.planned
    same = (manifest.dataset == spec.dataset and manifest.kind == planned.kind
            and manifest.to_snap.guid == planned.to_snap.guid
            and (manifest.from_snap.guid if manifest.from_snap else None)
            == (planned.from_snap.guid if planned.from_snap else None))
    if not same:
        raise StreamCorrupt(f"manifest {backend.name}:{key} describes another stream than the"
                            " one planned there; move it away and run again")
    for volume in manifest.volumes:
        info = backend.stat(volume.key)
        if info.size != volume.stored_bytes:
            raise StreamCorrupt(f"volume {backend.name}:{volume.key} has {info.size} bytes, the"
                                f" manifest says {volume.stored_bytes}; delete {spec.prefix}"
                                " and run again")
    _repair_copies(backend, key, loaded.key)
    log.info("adopting %s: its manifest was written but not catalogued", spec.prefix)
    return manifest


def _repair_copies(backend: Backend, key: str, good: str) -> None:
    """Rewrite the primary or copy of ``key`` that is missing or damaged from ``good``."""
    data = read_object(backend, good)
    for other in (key, copy_key(key)):
        if other == good:
            continue
        try:
            Manifest.from_json(read_object(backend, other), other)
        except (ObjectNotFound, StreamCorrupt):
            backend.put(other, [data], storage_class="STANDARD")


def _catalog(spec: StreamSpec, manifest: Manifest, catalog: Catalog, now: dt.datetime,
             versions: Mapping[int, StoredVersion] | None = None,
             manifest_puts: Sequence[PutResult] = (), *,
             sealed_to: tuple[str, ...] | None) -> int:
    stream, volumes = manifest_rows(manifest, store=spec.store, prefix=spec.prefix,
                                    parent_id=spec.parent_id, uploaded_at=now, versions=versions,
                                    manifest_puts=manifest_puts, sealed_to=sealed_to)
    return catalog.add_stream(stream, volumes, manifest.snapshots)
