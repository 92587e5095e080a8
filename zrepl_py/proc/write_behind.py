"""A bounded write-behind: pieces handed over by one thread, written by another in order.

Why (docs/performance.md#a-restore-writes-behind): ``zfs receive`` does not take a stream
at an even pace, and a restore's producer (the age decryption, the zstd decode) runs at its
own. With a pipe of 1 MiB between the two each waited for the other (a sealed restore kept
1.3 of 2 CPUs busy); a queue of tens of MiB in this process lets the producer go on while
the receive pauses, without the two copies an mbuffer(1) process would add.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable


class WriteBehind:
    """Write the pieces given to :meth:`put` with ``write`` in a thread of its own, in order,
    holding at most ``limit`` bytes not yet written (one larger piece alone is let through).

    Args:
        write: writes one whole piece; whatever it raises stops the thread and is raised by
            the next :meth:`put` or :meth:`drain`.
        limit: bytes queued at most (> 0).
        name: the thread's name.
    """

    def __init__(self, write: Callable[[bytes], None], limit: int, name: str):
        self._write = write
        self._limit = limit
        self._pending: collections.deque[bytes] = collections.deque()
        self._queued = 0  # bytes in _pending and the piece being written
        self._closed = False
        self._error: BaseException | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, data: bytes) -> None:
        """Queue ``data`` (which must not change afterwards), waiting while ``limit`` bytes
        are queued.

        Raises:
            whatever ``write`` raised for an earlier piece.
            ValueError: after :meth:`drain` or :meth:`discard` (as a closed file's write).
        """
        with self._changed:
            while (self._queued and self._queued + len(data) > self._limit
                   and self._error is None and not self._closed):
                self._changed.wait()
            if self._error is not None:
                raise self._error
            if self._closed:
                raise ValueError("write after the write-behind was closed")
            self._pending.append(data)
            self._queued += len(data)
            self._changed.notify_all()

    def drain(self) -> None:
        """Wait until every queued piece is written; the thread then ends.

        Raises:
            whatever ``write`` raised.
        """
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def discard(self) -> None:
        """Drop the pieces not yet written; the thread ends once the piece it is writing is
        written (or its write fails). Call :meth:`join` before whatever ``write`` writes to
        is closed."""
        with self._changed:
            self._queued -= sum(map(len, self._pending))
            self._pending.clear()
            self._closed = True
            self._changed.notify_all()

    def join(self) -> None:
        """Wait for the thread to end (after :meth:`drain` or :meth:`discard`)."""
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending and not self._closed:
                    self._changed.wait()
                if not self._pending:
                    return
                data = self._pending.popleft()
            try:
                self._write(data)
            except BaseException as exc:  # handed to the thread that puts
                with self._changed:
                    self._error = exc
                    self._pending.clear()
                    self._queued = 0
                    self._changed.notify_all()
                return
            with self._changed:
                self._queued -= len(data)
                self._changed.notify_all()
