"""Run one kind of work on a stream's chunks in a helper thread, in order, a few chunks behind.

The archive's data path is CPU-bound on the 2 CPUs it was measured on
(docs/decisions.md#archive-at-the-speed-of-the-pipe-within-200-mib): per chunk
of the send stream, one thread reads the pipe and hands the chunk to zstd, and two SHA-256
passes (raw bytes, stored bytes) and the file write follow. hashlib, ``os.write`` and
libzstd release the GIL on large buffers, so each pass can run on another CPU if it runs in
another thread; what it costs is one hand-off per chunk. ``Behind`` is that hand-off: the
caller submits each chunk's work and goes on, the helper thread does the work in submission
order, and the caller waits only when ``depth`` chunks are still pending (which bounds the
memory held: ``depth`` chunks) or at ``drain``. An error raised by the work is raised to
the caller at its next ``submit`` or at ``drain``; nothing submitted after it runs.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable


class Behind:
    """One helper thread running submitted calls in order, at most ``depth`` pending.

    Use as a context manager: leaving it cancels the calls not started yet and waits for
    the running one (so, e.g., a file is no longer written once the block is left).

    Args:
        name: the helper thread's name (``NAME_0``), seen in profiles.
        depth: calls submitted and not finished before ``submit`` waits, >= 1.
    """

    def __init__(self, name: str, depth: int = 1):
        if depth < 1:
            raise ValueError(f"depth must be >= 1, not {depth}")
        self._depth = depth
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        self._pending: collections.deque[concurrent.futures.Future[None]] = collections.deque()

    def submit(self, work: Callable[..., None], *args: object) -> None:
        """Run ``work(*args)`` after the calls submitted before; the arguments must not
        change until it ran.

        Raises:
            whatever an earlier call raised (then this one is not run).
        """
        while len(self._pending) >= self._depth:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(work, *args))

    def drain(self) -> None:
        """Wait until every submitted call ran.

        Raises:
            whatever the first failing call raised.
        """
        while self._pending:
            self._pending.popleft().result()

    def __enter__(self) -> Behind:
        return self

    def __exit__(self, *exc: object) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True)
