"""Make every cold object of a restore path readable: one batch of thaw requests, recorded.

S3 GLACIER and DEEP_ARCHIVE objects must be restored (RestoreObject) before a GET. A restore
asks for every frozen volume of the path at once, records the request per stream in the
catalog, and stops with exit 75; the next run finds the objects thawing or thawed and
continues (AWS S3 user guide, "Restoring an archived object").
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from zrepl_py.catalog.rows import StreamRow, VolumeRow
from zrepl_py.config.restore import RestoreConfig
from zrepl_py.stores.base import COLD_CLASSES, Backend, Thaw

if TYPE_CHECKING:  # the estimate is pure; only request_thaws writes the catalog
    from zrepl_py.catalog.repository import Catalog

# Typical hours until a restore completes, per class and tier (AWS S3 user guide, "Archive
# retrieval options"): Flexible Retrieval 1-5 min / 3-5 h / 5-12 h, Deep Archive -/12 h/48 h.
THAW_HOURS = {
    ("GLACIER", "Expedited"): 0.1,
    ("GLACIER", "Standard"): 5,
    ("GLACIER", "Bulk"): 12,
    ("DEEP_ARCHIVE", "Standard"): 12,
    ("DEEP_ARCHIVE", "Bulk"): 48,
}


@dataclasses.dataclass(frozen=True)
class ThawEstimate:
    """What thawing a path's cold volumes takes: objects, bytes, hours and USD."""

    objects: int
    bytes: int
    hours: float
    cost_usd: float
    tier: str


def effective_tier(storage_class: str, tier: str) -> str:
    """``tier``, or Standard where the class has no such tier (Deep Archive: no Expedited)."""
    return tier if (storage_class, tier) in THAW_HOURS else "Standard"


def estimate(streams: Sequence[StreamRow], volumes: Mapping[int, Sequence[VolumeRow]],
             cfg: RestoreConfig) -> ThawEstimate:
    """Estimate thawing every volume of ``streams`` in a cold class (pure)."""
    objects = size = 0
    hours = cost = 0.0
    for stream in streams:
        if stream.storage_class not in COLD_CLASSES:
            continue
        tier = effective_tier(stream.storage_class, cfg.thaw_tier)
        vols = volumes[stream.id]
        objects += len(vols)
        size += sum(v.stored_bytes for v in vols)
        hours = max(hours, THAW_HOURS[(stream.storage_class, tier)])
        price = cfg.price(stream.storage_class, tier)
        if price is not None:
            cost += (price.per_gb * sum(v.stored_bytes for v in vols) / 1e9
                     + price.per_1000_requests * len(vols) / 1000)
    return ThawEstimate(objects, size, hours, round(cost, 4), cfg.thaw_tier)


def request_thaws(backend: Backend, catalog: Catalog, streams: Sequence[StreamRow],
                  volumes: Mapping[int, Sequence[VolumeRow]], cfg: RestoreConfig,
                  now: dt.datetime) -> tuple[int, dt.datetime | None]:
    """Ask for every frozen volume of ``streams`` to be thawed, in one pass.

    Returns:
        ``(objects not yet readable, when they should be ready)``; ``(0, None)`` when every
        volume can be read now.

    Raises:
        ObjectNotFound, StoreError: a volume is missing or the store failed.
    """
    waiting = 0
    ready_by: dt.datetime | None = None
    recorded = catalog.thaws(s.id for s in streams)
    for stream in streams:
        if stream.storage_class not in COLD_CLASSES:
            continue
        tier = effective_tier(stream.storage_class, cfg.thaw_tier)
        asked = False
        for volume in volumes[stream.id]:
            info = backend.stat(volume.key)
            if info.readable:
                continue
            waiting += 1
            if info.thaw is Thaw.FROZEN:
                backend.request_thaw(volume.key, days=cfg.thaw_days, tier=tier)
                asked = True
        if asked or (stream.id in recorded and waiting):
            previous = recorded.get(stream.id)
            when = (previous.ready_by if previous and not asked
                    else now + dt.timedelta(hours=THAW_HOURS[(stream.storage_class, tier)]))
            if asked:
                catalog.record_thaw(stream.id, tier=tier, days=cfg.thaw_days,
                                    requested_at=now, ready_by=when)
            ready_by = when if ready_by is None else max(ready_by, when)
    if waiting and ready_by is None:
        ready_by = now + dt.timedelta(hours=1)  # thawing, requested outside zbak
    return waiting, ready_by
