"""Do a run's waiting ahead of time, in one background thread, while the main thread computes.

A ``zbak replicate`` spends its fixed cost on two kinds of work: CPU in the main thread
(importing SQLAlchemy, opening and checking the catalog: about 0.3 s) and waiting on other
processes (the SSH handshake; each remote ``zpool``/``zfs`` round trip through sshd, about
10 ms with ``TCP_NODELAY`` (``proc.ssh``), 50 ms without; measured with
``benchmarks/replication.py``). Started right after the job lock is taken, a ``Prefetch``
runs the waiting kind (connect to the target hosts, check their capabilities, read the
pools' health) while the main thread does the CPU kind: a thread blocked on a socket or a
child process holds no GIL.

Each result is taken at most once (``take``), so a second consumer in the same process
(another target or job of the same ``zbak replicate``) reads afresh instead of acting on an
old free-space figure. A task's error is kept and raised to whoever takes its result.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar, cast

log = logging.getLogger(__name__)

T = TypeVar("T")

Task = tuple[Hashable, Callable[[], object]]

TaskOf = tuple[Hashable, Callable[[], T]]
"""A task whose compute returns ``T``: what ``take`` (``Context.prefetched``) is given."""
"""``(key, compute)``: ``take(key, ...)`` returns ``compute()``'s result or raises its error."""


class Prefetch:
    """Run ``tasks`` in order in a daemon thread, starting now.

    Args:
        tasks: ``(key, compute)`` pairs with distinct keys; ``compute`` takes no arguments
            and must be safe to run beside the caller's thread (read-only work only).
    """

    def __init__(self, tasks: Sequence[Task]):
        work: list[tuple[Hashable, Callable[[], object], concurrent.futures.Future[object]]] = [
            (key, compute, concurrent.futures.Future()) for key, compute in tasks]
        self._futures: dict[Hashable, concurrent.futures.Future[object]] = {
            key: future for key, _, future in work}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        if work:
            threading.Thread(target=self._work, args=(work,), name="zbak-prefetch",
                             daemon=True).start()

    def _work(self, work: list[tuple[Hashable, Callable[[], object],
                                     concurrent.futures.Future[object]]]) -> None:
        for key, compute, future in work:
            if self._stopped.is_set() or not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(compute())
            except BaseException as exc:  # kept for the taker, who sees it as its own
                log.debug("prefetch %s failed: %s", key, exc)
                future.set_exception(exc)

    def take(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The prefetched result for ``key`` (waiting for it if it is being computed), else
        ``compute()`` run here: when ``key`` was never prefetched, was taken already, or had
        not started yet (it is cancelled then).

        Raises:
            whatever the prefetched task or ``compute`` raised.
        """
        with self._lock:
            future = self._futures.pop(key, None)
        if future is None or future.cancel():
            return compute()
        # The task prefetched for ``key`` computes what ``compute`` would: the caller's word.
        return cast(T, future.result())

    def close(self) -> None:
        """Skip the tasks not started yet; a running one finishes on its own (not awaited)."""
        self._stopped.set()
        with self._lock:
            futures, self._futures = list(self._futures.values()), {}
        for future in futures:
            future.cancel()
