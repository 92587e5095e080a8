"""The bandwidth limit of uploads to a store: paces the chunks a ``Backend.put`` reads.

The archive hands ``Backend.put`` the stored bytes of a volume as an iterable of chunks
(``archive.volumes``); ``Throttle.chunks`` yields them no faster than the store's
``bandwidth_limit`` in force (``values.timetable``), so what leaves for the store is limited
whatever the store does with it (an S3 multipart upload sends a part once it has read it: the
wire sees parts, at the limit on average). One ``Throttle`` per run and store: the uploads of
the run share the limit.

Pacing is virtual scheduling: a chunk of ``n`` bytes may go when the previous one's time is
up, and takes ``n / limit`` seconds of the schedule; an idle spell earns no credit (the next
chunk goes at once, then the schedule restarts). Chunks are cut into ``SLICE`` bytes while a
limit holds, so a new limit acts within a slice's time. The limit in force is read again at
most every ``every`` seconds of the monotonic clock; when it changed, the schedule restarts
at the new rate (a window's start lowers the rate at its next slice, its end lifts it).
Without a limit in force, chunks pass through untouched
(docs/decisions.md#a-new-limit-reaches-running-transfers).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator

from zrepl_py.clock import Clock
from zrepl_py.values.timetable import Timetable

SLICE = 64 * 1024
"""Bytes of the pieces chunks are cut into while a limit holds."""
EVERY = 0.5
"""Seconds between two readings of the timetable: a new limit holds within this of its
boundary (plus a slice at the old rate)."""


class Throttle:
    """Paces uploads under ``timetable`` (see the module doc); shared by the threads of a
    run (one lock), so two uploads at once share the limit.

    Args:
        timetable: the store's ``bandwidth_limit``.
        clock: what the timetable is read by (aware UTC).
        every: seconds between two readings of the timetable.
        monotonic / sleep: the pacing clock and the wait (tests pass fakes).
    """

    def __init__(self, timetable: Timetable, clock: Clock, *, every: float = EVERY,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.timetable = timetable
        self.clock = clock
        self.every = every
        self._monotonic = monotonic
        self._sleep = sleep
        self._lock = threading.Lock()
        self._limit: int | None = None
        self._read_at: float | None = None
        self._next = 0.0  # monotonic time the next slice may go

    @property
    def limit(self) -> int | None:
        """Bytes per second in force at the last reading (None: none)."""
        return self._limit

    def _limit_now(self, now: float) -> int | None:
        """The limit in force, read again every ``every`` seconds (called under the lock)."""
        if self._read_at is None or now - self._read_at >= self.every:
            self._read_at = now
            limit = self.timetable.at(self.clock.now()).limit
            if limit != self._limit:
                self._limit, self._next = limit, now
        return self._limit

    def _pace(self, size: int) -> None:
        """Wait until ``size`` more bytes may go under the limit."""
        while True:
            with self._lock:
                now = self._monotonic()
                limit = self._limit_now(now)
                if limit is None:
                    return
                if self._next <= now:
                    self._next = now + size / limit
                    return
                wait = self._next - now
            self._sleep(min(wait, self.every))

    def chunks(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """Yield ``chunks`` (cut into ``SLICE`` pieces while a limit holds) no faster than
        the limit in force."""
        if not self.timetable.limited:
            yield from chunks
            return
        for chunk in chunks:
            for start in range(0, len(chunk), SLICE):
                piece = chunk[start:start + SLICE] if len(chunk) > SLICE else chunk
                self._pace(len(piece))
                yield piece

