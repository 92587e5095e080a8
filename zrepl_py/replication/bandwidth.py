"""A job's ``bandwidth_limit`` timetable followed while its ZFS pipelines run: at each
boundary the shared rate of the running ``pv`` stages changes (``proc.ratelimit.SharedRate``,
docs/decisions.md#a-new-limit-reaches-running-transfers)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from zrepl_py.clock import Clock
from zrepl_py.proc.ratelimit import SharedRate
from zrepl_py.values.timetable import Timetable

log = logging.getLogger(__name__)

FOLLOW_EVERY = 0.5
"""Seconds between two readings of the clock by ``follow``: a new limit is in force at
most this long (plus a ``pv -R``) after its boundary."""


@contextlib.contextmanager
def follow(rate: SharedRate, timetable: Timetable, clock: Clock, *,
           every: float = FOLLOW_EVERY) -> Iterator[None]:
    """While the ``with`` block runs, keep ``rate``'s total at the limit ``timetable`` has in
    force by ``clock`` (read every ``every`` seconds, in a daemon thread; a clock stepped
    forward or back is followed too). Nothing runs for a constant timetable."""
    if timetable.constant:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(every):
            in_force = timetable.at(clock.now())
            if in_force.limit != rate.total:
                log.info("bandwidth limit now %s (window %s)", in_force.describe(),
                         in_force.window or "default")
                rate.set_total(in_force.limit)

    thread = threading.Thread(target=watch, name="zbak-bandwidth", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
