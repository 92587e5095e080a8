"""How far each copy of a job lags, from the catalog alone (no store is listed): what
``zbak status``, ``zbak status --check`` and the metrics show per ``[jobs.NAME.copy.STORE]``
(docs/copies.md#how-far-a-copy-lags).

Definitions (times aware UTC, sizes bytes):

* the streams a copy lacks: what the next ``zbak copy`` would copy (``copying.plan``, over the
  chains the target's retention wants): ``zbak copy --dry-run``'s ``planned`` rows. A stream
  the copy never takes (beyond the target's retention, marked bad, not complete, or applying
  on one of those) is not lag; ``zbak copy --dry-run`` says why of each.
* ``streams`` / ``bytes``: how many, and their stored bytes in the store copied from.
* ``oldest_missing``: when the oldest of them was stored there (``uploaded_at``, else
  ``created_at``); ``lag_seconds``: now minus that, 0 when nothing lacks.
* ``newest`` / ``target_newest``: the newest stream (by ``to_createtxg``, state ``uploaded`` or
  ``verified``) of the job's datasets in each store, as ``DATASET@SNAP``, and when it was stored.
* ``max_lag``: the limit ``--check`` judges ``lag_seconds`` by (:func:`lag_limit`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from zrepl_py.catalog.rows import LIVING_STATES, StreamRow
from zrepl_py.config.copies import CopyConfig
from zrepl_py.config.jobs import JobConfig
from zrepl_py.copying.plan import plan_copy
from zrepl_py.pruning.archive import chain_retention, in_store, job_stores, job_streams
from zrepl_py.pruning.last_copy import wanted_prefixes
from zrepl_py.values.cron import longest_gap

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog

SCHEDULE_RUNS = 2
"""A copy's default ``max_lag`` is this many of its schedule's longest gaps: one run may be
missed (the store was down, the job's lock was held) before ``--check`` warns."""


@dataclasses.dataclass(frozen=True)
class CopyLag:
    """How far the copy of a job in store ``store`` lags behind store ``source`` (module doc).

    Attributes:
        store / source: the store copied to, and the store copied from.
        streams / bytes: the streams ``store`` lacks and would get, and their stored bytes.
        oldest_missing: when the oldest of them was stored in ``source`` (None: none lacks).
        lag_seconds: now minus ``oldest_missing``; 0 when none lacks.
        newest / newest_time: the newest stream in ``source`` (``DATASET@SNAP``, stored at).
        target_newest / target_newest_time: the same in ``store`` (None: it holds none).
        max_lag: the limit of ``lag_seconds`` in seconds (None: not judged).
        lagging: ``lag_seconds`` is past ``max_lag``.
    """

    store: str
    source: str
    streams: int
    bytes: int
    oldest_missing: dt.datetime | None
    lag_seconds: float
    newest: str | None
    newest_time: dt.datetime | None
    target_newest: str | None
    target_newest_time: dt.datetime | None
    max_lag: float | None
    lagging: bool


def copy_source(job: JobConfig, store: str) -> str | None:
    """The store a copy to ``store`` reads: the copy's ``from``, else the job's archive
    store (None: neither, which the config refuses for a copy table)."""
    chosen = job.copies.get(store)
    return (chosen.source if chosen else None) or (job.archive.store if job.archive else None)


def wanted_in(job: JobConfig, target: str, source: str, streams: Sequence[StreamRow],
              now: dt.datetime) -> frozenset[str] | None:
    """The object prefixes the retention of ``target`` (its copy table's ``retention``)
    wants among the job's streams in its stores and ``source`` (``pruning.last_copy``);
    None: no retention there, every stream is wanted.

    Args:
        streams: every catalogued stream of the job's tree, any store
            (``Catalog.bulk_streams``).
        now: aware UTC.
    """
    chosen = job.copies.get(target)
    if chosen is None or chosen.retention is None:
        return None
    policy = chain_retention(chosen.retention, accept_early_delete_fee=False)
    stores = {store for store, _ in job_stores(job, accept_early_delete_fee=False)} | {source}
    by_dataset: dict[str, list[StreamRow]] = {}
    for store in stores:
        for dataset, rows in job_streams(job, streams, store).items():
            by_dataset.setdefault(dataset, []).extend(rows)
    wanted: set[str] = set()
    for rows in by_dataset.values():
        wanted |= wanted_prefixes(policy, rows, now)
    return frozenset(wanted)


def lag_limit(copy: CopyConfig, now: dt.datetime) -> dt.timedelta | None:
    """The copy's ``max_lag``, else ``SCHEDULE_RUNS`` times the longest gap between two runs
    of its ``schedule`` (``values.cron.longest_gap`` from ``now``), else None."""
    if copy.max_lag is not None:
        return copy.max_lag
    gap = None if copy.schedule is None else longest_gap(copy.schedule, now)
    return None if gap is None else SCHEDULE_RUNS * gap


def _stored(stream: StreamRow) -> dt.datetime:
    return stream.uploaded_at or stream.created_at


def _newest(streams: Sequence[StreamRow]) -> StreamRow | None:
    living = [s for s in streams if s.state in LIVING_STATES]
    return max(living, key=lambda s: (s.to_createtxg, s.id), default=None)


def copy_lag(job: JobConfig, store: str, streams: Sequence[StreamRow],
             now: dt.datetime) -> CopyLag | None:
    """The lag of the job's copy in ``store`` (module doc) over ``streams`` (every
    catalogued stream of the job's tree, any store); None without a store to copy from
    (PURE)."""
    source = copy_source(job, store)
    if source is None:
        return None
    originals, there = in_store(job, streams, source), in_store(job, streams, store)
    missing = plan_copy(originals, there, wanted_in(job, store, source, streams, now)).copy
    oldest = min((_stored(s) for s in missing), default=None)
    newest, target_newest = _newest(originals), _newest(there)
    chosen = job.copies.get(store)
    limit = None if chosen is None else lag_limit(chosen, now)
    lag = 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
    return CopyLag(
        store=store, source=source, streams=len(missing),
        bytes=sum(s.stored_bytes for s in missing), oldest_missing=oldest, lag_seconds=lag,
        newest=f"{newest.dataset}@{newest.to_name}" if newest else None,
        newest_time=_stored(newest) if newest else None,
        target_newest=f"{target_newest.dataset}@{target_newest.to_name}" if target_newest
        else None,
        target_newest_time=_stored(target_newest) if target_newest else None,
        max_lag=None if limit is None else limit.total_seconds(),
        lagging=limit is not None and lag > limit.total_seconds())


def copy_lags(catalog: Catalog, job: JobConfig, now: dt.datetime) -> list[CopyLag]:
    """:func:`copy_lag` of each ``[jobs.NAME.copy.STORE]`` of ``job`` in the config's order,
    from one read of the job's streams (none read without a copy table).

    Raises:
        CatalogError: the catalog cannot be read.
    """
    if not job.copies:
        return []
    source = job.source
    streams = catalog.bulk_streams(host=source.host, below=str(source.dataset))
    found = (copy_lag(job, store, streams, now) for store in job.copies)
    return [lag for lag in found if lag is not None]
