"""One dataset's scheduled actions run one at a time inside the daemon, in action order.

The per-dataset ``flock`` (``zrepl_py.locking``) keeps the daemon and manual runs apart: a
run that finds it taken does nothing (exit 3). Inside the daemon that would be wasteful: a
snapshot and a replication due at the same minute would race for the lock and one would be
skipped. So the daemon's own runs of one dataset queue at a ``Gate`` instead: they enter one
at a time, the earliest arrival first and, among runs that arrive within ``SETTLE`` seconds
of each other, snapshot before replicate before archive before prune before audit.
"""

from __future__ import annotations

import itertools
import threading
import time

SETTLE = 0.3
"""Seconds within which runs count as arriving together (then action order decides); a run
also waits this long before competing, so runs fired by the same tick all line up first."""
_POLL = 0.25
_sequence = itertools.count()


class Gate:
    """A mutual exclusion for one dataset: first come, first served, except that a waiter
    lets in one of lower ``order`` that arrived less than ``SETTLE`` seconds after it (never
    more: nobody waits behind later arrivals for long)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._waiting: list[tuple[float, int, int]] = []  # (arrival, order, sequence)

    def _next(self) -> tuple[float, int, int]:
        first = min(self._waiting)[0]
        together = [w for w in self._waiting if w[0] - first < SETTLE]
        return min(together, key=lambda w: (w[1], w[0], w[2]))

    def acquire(self, order: int, stop: threading.Event) -> bool:
        """Wait for the gate; True once held, False when ``stop`` was set first.

        Args:
            order: rank among actions arriving together (lower enters first).
            stop: set by the daemon on shutdown; a waiter then gives up.
        """
        key = (time.monotonic(), order, next(_sequence))
        with self._cond:
            self._waiting.append(key)
        if not stop.wait(SETTLE):
            with self._cond:
                while not stop.is_set():
                    if not self._busy and self._next() == key:
                        self._waiting.remove(key)
                        self._busy = True
                        return True
                    self._cond.wait(_POLL)
        with self._cond:
            self._waiting.remove(key)
            self._cond.notify_all()
        return False

    def release(self) -> None:
        """Let the next waiter in."""
        with self._cond:
            self._busy = False
            self._cond.notify_all()
