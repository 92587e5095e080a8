"""Run many pieces of work in a few threads, some only after others, and settle what is done
in batches in the caller's thread.

``fan_out`` is the shape of a replication run over a tree (``replication.zfs_target``): one
piece of work per dataset (its transfers, in a worker thread), a child waiting for the
parent it needs, at most N at once, and the bookkeeping of every finished one (guid checks,
holds, cursors) done by the caller's thread for all that finished since it last looked, as
one command or transaction per batch, while the next transfers run. zrepl's replication
driver works the same way (``concurrency.steps``; "initial replication cannot start
replicating child filesystems before the parent filesystem's initial replication step has
completed", zrepl docs "Replication Options").

Stopping: once ``stop`` says so of a finished piece (a failed transfer), nothing new
starts; pieces already running finish (their bookkeeping is settled), and the keys never
started are returned. If the caller's thread is interrupted (an exception in ``settle``,
KeyboardInterrupt), ``cancel`` is set so running work can stop early, the workers are
waited for, and the exception propagates.
"""

from __future__ import annotations

import dataclasses
import heapq
import queue
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class Finished(Generic[K, R]):
    """One piece of work that finished: its key and its result, or the exception it raised."""

    key: K
    result: R | None
    error: BaseException | None


def fan_out(
    keys: Sequence[K],
    work: Callable[[K], R],
    *,
    after: Mapping[K, K | None],
    concurrency: int,
    settle: Callable[[list[Finished[K, R]]], bool | None],
    stop: Callable[[Finished[K, R]], bool],
    cancel: threading.Event | None = None,
    name: str = "zbak-work",
    idle: threading.Event | None = None,
) -> list[K]:
    """Run ``work(key)`` for every key, at most ``concurrency`` at once.

    The workers take the next key themselves as soon as they are free, so a ``settle`` in
    progress never holds a transfer back.

    Args:
        keys: distinct keys, in the order to start them (when free to start).
        work: runs in a worker thread; what it returns or raises is given to ``settle``.
        after: ``after[key]``: the key that must have finished (whatever its outcome) before
            ``key`` starts; None or absent, or a key not in ``keys``: none.
        concurrency: most pieces running at once (>= 1).
        settle: called in the caller's thread with every piece finished since its last
            call (at least one, in the order of ``keys``), while the others go on; a true
            result starts nothing more (as ``stop``), a raise stops the run (see the module
            doc).
        stop: when true for a finished piece, start nothing more (called in a worker).
        cancel: set when the caller's thread is interrupted, for ``work`` to watch.
        name: prefix of the worker threads' names.
        idle: set before a ``settle`` once no piece runs or will start any more (a worker
            has ended with none running): that batch, and any after it, may use what the
            workers were using (CPU, connections).

    Returns:
        the keys never started (after a ``stop``, or waiting on a key never started).

    Raises:
        ValueError: ``concurrency`` below 1.
        whatever ``settle`` raises, after every running piece has finished.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    board: _Board[K, R] = _Board(keys, after, stop)
    finished: queue.SimpleQueue[Finished[K, R] | None] = queue.SimpleQueue()
    workers = [threading.Thread(target=board.serve, args=(work, finished), daemon=True,
                                name=f"{name}-{i}")
               for i in range(max(1, min(concurrency, len(keys))))]
    for worker in workers:
        worker.start()
    try:
        active = len(workers)
        while active:
            batch = []
            item = finished.get()
            while True:
                if item is None:
                    active -= 1
                else:
                    batch.append(item)
                try:
                    item = finished.get_nowait()
                except queue.Empty:
                    break
            if batch:
                batch.sort(key=lambda done: board.position[done.key])
                if idle is not None and active < len(workers) and board.idle():
                    idle.set()
                if settle(batch):
                    board.halt()
    except BaseException:
        board.halt()
        if cancel is not None:
            cancel.set()
        raise
    finally:
        for worker in workers:
            worker.join()
    return [key for key in keys if key not in board.started]


class _Board(Generic[K, R]):
    """What the workers share: the keys free to start, those waiting, whether to stop."""

    def __init__(self, keys: Sequence[K], after: Mapping[K, K | None],
                 stop: Callable[[Finished[K, R]], bool]):
        self.keys = keys
        self.position = {key: i for i, key in enumerate(keys)}
        self.stop = stop
        self.ready: list[int] = []  # heap of positions free to start
        self.waiting: dict[K, list[K]] = {}  # a key -> the keys that start once it finished
        for key in keys:
            first = after.get(key)
            if first is None or first not in self.position:
                heapq.heappush(self.ready, self.position[key])
            else:
                self.waiting.setdefault(first, []).append(key)
        self.started: set[K] = set()
        self.running = 0
        self.stopped = False
        self.changed = threading.Condition()

    def halt(self) -> None:
        """Start nothing more."""
        with self.changed:
            self.stopped = True
            self.changed.notify_all()

    def idle(self) -> bool:
        """True when no piece is running."""
        with self.changed:
            return self.running == 0

    def _next(self) -> K | None:
        """The next key to run (waiting while only running keys can free one); None: done."""
        with self.changed:
            while not self.stopped and not self.ready and self.running:
                self.changed.wait()
            if self.stopped or not self.ready:
                return None
            key = self.keys[heapq.heappop(self.ready)]
            self.started.add(key)
            self.running += 1
            return key

    def _done(self, item: Finished[K, R]) -> None:
        with self.changed:
            self.running -= 1
            for later in self.waiting.pop(item.key, []):
                heapq.heappush(self.ready, self.position[later])
            if self.stop(item):
                self.stopped = True
            self.changed.notify_all()

    def serve(self, work: Callable[[K], R],
              finished: queue.SimpleQueue[Finished[K, R] | None]) -> None:
        """A worker: run keys until none is left to start, then say so (None)."""
        try:
            while (key := self._next()) is not None:
                try:
                    item = Finished(key, work(key), None)
                except BaseException as exc:  # given to settle, raised by the caller
                    item = Finished(key, None, exc)
                self._done(item)
                finished.put(item)
        finally:
            finished.put(None)
