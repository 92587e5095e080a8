"""The rolling Object Lock (docs/design.md#immutable-cold-storage): ``zbak archive`` and
``zbak audit`` extend the lock of every catalogued volume, manifest and manifest copy
retention still wants (each stream neither condemned nor released by the job's retention,
``pruning.archive.released_streams``: a released chain's locks lapse, so prune can delete it)
to now + period once less than half the period is left, one PutObjectRetention per version
(S3 has no batch form), ``concurrency`` at a time, and record the new date in the catalog (a manifest and its copy share one date, the
earlier). Without extensions a lock lapses one period after it was last set; with them, at
least half a period after the last run that extended it.

:func:`due` and :func:`due_manifests` are the choice (pure); :func:`roll_locks` makes the
calls.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from zrepl_py.catalog.rows import ManifestLock, StreamRow, VolumeRow
from zrepl_py.config.jobs import JobConfig
from zrepl_py.errors import StoreError
from zrepl_py.objects.layout import MANIFEST, copy_key
from zrepl_py.pruning.archive import released_streams
from zrepl_py.stores.base import Backend
from zrepl_py.stores.object_lock import LockPolicy

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog

log = logging.getLogger(__name__)


def due(streams: Iterable[StreamRow], volumes: Mapping[int, Sequence[VolumeRow]], policy: LockPolicy,
        now: dt.datetime) -> list[VolumeRow]:
    """The volumes of ``streams`` (not condemned) whose recorded lock (``retain_until``)
    ``policy`` extends at ``now`` (aware UTC); volumes without a recorded version or lock
    are left out (pure)."""
    return [v for s in streams if s.state != "condemned" for v in volumes.get(s.id, ())
            if v.version_id is not None and v.retain_until is not None
            and policy.due(v.retain_until, now)]


def due_manifests(streams: Iterable[StreamRow], manifests: Iterable[ManifestLock],
                  policy: LockPolicy, now: dt.datetime) -> list[ManifestLock]:
    """The recorded manifest locks (``Catalog.manifest_locks``) of ``streams`` (not
    condemned) that ``policy`` extends at ``now`` (aware UTC; pure)."""
    living = {s.id for s in streams if s.state != "condemned"}
    return [m for m in manifests if m.stream_id in living and policy.due(m.retain_until, now)]


@dataclasses.dataclass
class Rolled:
    """What :func:`roll_locks` did: ``extended`` versions (volumes, manifests and manifest
    copies; their new retain-until dates recorded), ``failed`` ``KEY: error`` for each
    PutObjectRetention that failed."""

    extended: int = 0
    failed: list[str] = dataclasses.field(default_factory=list)


def roll_locks(backend: Backend, catalog: Catalog, job: JobConfig,
               streams: Iterable[StreamRow], volumes: Mapping[int, Sequence[VolumeRow]],
               now: dt.datetime, *, concurrency: int,
               datasets: Sequence[int] | None = None) -> Rolled:
    """Extend the locks :func:`due` and :func:`due_manifests` name in ``backend`` (a store
    without ``object_lock``: nothing) among ``streams`` (job ``job``'s in that store, of the
    datasets of ids ``datasets``; None: every dataset of the job) but those its retention
    releases, and record each new date in ``catalog`` (a manifest's only when its copy's was
    extended too). The release is judged from the catalog's streams of the same datasets in
    every store, read once here: an audit in batches reads only its batch's.

    Raises:
        CatalogError: reading the job's streams or the manifest locks, or recording the
            dates, failed (the locks stay extended; the next run extends them again).
    """
    policy = backend.lock_policy
    rolled = Rolled()
    if policy is None:
        return rolled
    source = job.source
    released = released_streams(job, catalog.bulk_streams(
        host=source.host, below=str(source.dataset), datasets=datasets), backend.name, now)
    streams = [s for s in streams if s.id not in released]
    chosen: Sequence[VolumeRow] = due(streams, volumes, policy, now)
    manifests = due_manifests(streams, catalog.manifest_locks(s.id for s in streams), policy,
                              now)
    calls: dict[tuple[str, str], tuple[str, int]] = {
        (v.key, v.version_id): ("volume", v.id) for v in chosen if v.version_id is not None}
    prefixes = {s.id: s.object_prefix for s in streams}
    for m in manifests:
        key = prefixes[m.stream_id] + MANIFEST
        calls[(key, m.version_id)] = ("manifest", m.stream_id)
        calls[(copy_key(key), m.copy_version_id)] = ("manifest", m.stream_id)
    if not calls:
        return rolled
    extended: dict[int, dt.datetime] = {}
    manifest_dates: dict[int, list[dt.datetime]] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = {pool.submit(backend.lock_version, key, version_id): (key, what)
                   for (key, version_id), what in calls.items()}
        for future in concurrent.futures.as_completed(futures):
            key, (kind, row_id) = futures[future]
            try:
                until = future.result()
            except StoreError as exc:
                rolled.failed.append(f"{key}: {exc}")
                continue
            rolled.extended += 1
            if kind == "volume":
                extended[row_id] = until
            else:
                manifest_dates.setdefault(row_id, []).append(until)
    catalog.set_retain_until(extended)
    catalog.set_manifest_retain_until({sid: min(dates) for sid, dates in manifest_dates.items()
                                       if len(dates) == 2})
    log.info("store %s: extended the Object Lock of %d version(s), %d failed", backend.name,
             rolled.extended, len(rolled.failed))
    return rolled
