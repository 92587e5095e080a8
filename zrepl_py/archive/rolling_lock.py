"""The rolling Object Lock (docs/design.md#immutable-cold-storage): ``zbak archive`` and
``zbak audit`` extend the lock of every catalogued volume retention still wants (each stream
not condemned) to now + period once less than half the period is left, one
PutObjectRetention per version (S3 has no batch form), ``concurrency`` at a time, and record
the new date in the catalog. Without extensions a lock lapses one period after it was last
set; with them, at least half a period after the last run that extended it.

:func:`due` is the choice (pure); :func:`roll_locks` makes the calls.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from zrepl_py.catalog.rows import StreamRow, VolumeRow
from zrepl_py.errors import StoreError
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


@dataclasses.dataclass
class Rolled:
    """What :func:`roll_locks` did: ``extended`` volumes (their new retain-until dates
    recorded), ``failed`` ``KEY: error`` for each PutObjectRetention that failed."""

    extended: int = 0
    failed: list[str] = dataclasses.field(default_factory=list)


def roll_locks(backend: Backend, catalog: Catalog, streams: Iterable[StreamRow],
               volumes: Mapping[int, Sequence[VolumeRow]], now: dt.datetime, *,
               concurrency: int) -> Rolled:
    """Extend the locks :func:`due` names in ``backend`` (a store without ``object_lock``:
    nothing) and record each new date in ``catalog``.

    Raises:
        CatalogError: recording the dates failed (the locks stay extended; the next run
            extends them again).
    """
    policy = backend.lock_policy
    rolled = Rolled()
    if policy is None:
        return rolled
    chosen: Sequence[VolumeRow] = due(streams, volumes, policy, now)
    if not chosen:
        return rolled
    extended: dict[int, dt.datetime] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futures = {pool.submit(backend.lock_version, v.key, v.version_id): v
                   for v in chosen if v.version_id is not None}
        for future in concurrent.futures.as_completed(futures):
            volume = futures[future]
            try:
                extended[volume.id] = future.result()
            except StoreError as exc:
                rolled.failed.append(f"{volume.key}: {exc}")
    catalog.set_retain_until(extended)
    rolled.extended = len(extended)
    log.info("store %s: extended the Object Lock of %d version(s), %d failed", backend.name,
             rolled.extended, len(rolled.failed))
    return rolled
