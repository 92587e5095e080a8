"""Health before work: pool state and free space of the source and the target
(docs/design.md#operations).

Before ``zbak replicate`` sends to a ZFS target and before ``zbak archive`` reads its
source, zbak reads ``zpool status POOL`` (the full text, never ``-x``: ``-x`` calls a
redundant pool with one failed disk of a mirror "healthy" only when it is ONLINE, and says
nothing of read/write/checksum error counts) and the pool's free space:

- any problem (pool state not ONLINE, a vdev not ONLINE, non-zero error counts, data
  errors) becomes a warning in the run's result and catalog row, and a ``degraded`` event
  (``zrepl_py.observe.events``; job None, action ``health``, target ``HOST:POOL``); the run goes on,
  since a degraded redundant pool still reads and writes correctly;
- a ZFS target pool with less free space than the job's ``[jobs.NAME.replicate] min_free``
  raises ``InsufficientSpace`` (that target's run fails, nothing is sent) and emits a
  ``degraded`` event for the job. Free space is ``zfs get -Hp available POOL`` (what the root
  dataset can still write, below ``zpool free`` by the slop space), a percentage floor is
  taken of ``used + available`` of the root dataset.

The pool is read and its ``zpool status`` parsed by ``zrepl_py.zfs.pool_status``; this module
judges the report.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

from zrepl_py.errors import InsufficientSpace
from zrepl_py.observe import events

if TYPE_CHECKING:
    from zrepl_py.config.replicate import FreeSpaceFloor
    from zrepl_py.zfs.pool_status import PoolReport

log = logging.getLogger(__name__)


def needs_size(floor: FreeSpaceFloor | None) -> bool:
    """A percentage ``min_free`` floor needs the pool's size (one more command)."""
    return floor is not None and floor.percent is not None


def _note(report: PoolReport, role: str, now: dt.datetime) -> list[str]:
    """Log the report; for a degraded pool emit the event and return the warning."""
    if not report.degraded:
        log.info("%s %s: %d bytes free", role, report.describe(), report.free_bytes)
        return []
    message = f"{role} {report.describe()}"
    events.emit(events.Event("degraded", None, "health", f"{report.host}:{report.pool}",
                             message, now))
    return [message]


def source_warnings(report: PoolReport, now: dt.datetime) -> list[str]:
    """Judge a job's source pool: a warning per problem of a degraded pool (empty if
    healthy), each also a ``degraded`` event at ``now`` (aware UTC)."""
    return _note(report, "source", now)


def target_warnings(report: PoolReport, floor: FreeSpaceFloor | None, *, job: str, target: str,
                    now: dt.datetime) -> list[str]:
    """Judge a ZFS target's pool: health warnings, and the ``min_free`` floor.

    Args:
        report: the target pool's report (with its size when ``needs_size(floor)``).
        floor: the job's ``[jobs.NAME.replicate] min_free``, or None for no floor.
        job / target: the job's name and the target string, for the message and event.
        now: aware UTC, the events' time.

    Returns:
        one warning per problem of a degraded pool (empty if healthy).

    Raises:
        InsufficientSpace: the pool's free space is under ``floor``.
    """
    warnings = _note(report, "target", now)
    if floor is not None:
        need = floor.floor_bytes(report.size_bytes or 0)
        if report.free_bytes < need:
            message = (f"target pool {report.pool} on {report.host} has {report.free_bytes} "
                       f"bytes free, under min_free {floor} ({need} bytes) of job {job}: "
                       f"nothing sent to {target}. Free space there (prune old snapshots) "
                       f"or lower [jobs.{job}.replicate] min_free.")
            events.emit(events.Event("degraded", job, "replicate", target, message, now))
            raise InsufficientSpace(message)
    return warnings
