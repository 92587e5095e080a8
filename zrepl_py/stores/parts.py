"""Cutting a put's stream into parts and sending them a few at a time: the S3 multipart
upload's and the ``sftp://`` store's write path (``stores.s3``, ``stores.sftp``).

Memory stays bounded whatever the stream's length: the parts in flight plus the one being
filled, ``part_size * (concurrency + 1)`` bytes.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import hashlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def cut(chunks: Iterable[bytes], size: int, digest: hashlib._Hash,
        counted: Callable[[int], None]) -> Iterator[bytearray]:
    """Cut ``chunks`` into parts of exactly ``size`` bytes, the last one shorter (possibly
    empty); hash the bytes into ``digest`` as they pass and call ``counted(total bytes so
    far)`` after each chunk (it may raise to stop the put: an object too large). A fresh
    buffer per part, so a part handed to a sending thread is never written again.

    Raises:
        whatever iterating ``chunks`` or ``counted`` raises.
    """
    buf = bytearray(size)
    fill = 0
    total = 0
    for chunk in chunks:
        digest.update(chunk)
        total += len(chunk)
        counted(total)
        view = memoryview(chunk).cast("B")
        while view:
            n = min(size - fill, len(view))
            buf[fill:fill + n] = view[:n]
            fill += n
            view = view[n:]
            if fill == size:
                yield buf
                buf = bytearray(size)
                fill = 0
    del buf[fill:]
    yield buf


def send_all(parts: Iterable[bytearray], send: Callable[[int, bytearray], T], *,
             concurrency: int, thread_name: str) -> builtins.list[T]:
    """Call ``send(number, part)`` for each non-empty part (numbered from 1), up to
    ``concurrency`` at a time in worker threads, and return their results in part order.

    The caller's loop over ``parts`` waits while ``concurrency`` parts are in flight, which
    bounds memory; the first failure of a send stops the loop at the next part. On any
    failure (a send's, or one raised by iterating ``parts``, KeyboardInterrupt included),
    queued sends are cancelled and running ones finish before the error is raised.

    Raises:
        whatever a send or iterating ``parts`` raises.
    """
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency,
                                                 thread_name_prefix=thread_name)
    # One slot per part in flight: the reader blocks when all are taken.
    slots = threading.BoundedSemaphore(concurrency)
    futures: list[concurrent.futures.Future[T]] = []
    try:
        number = 0
        for part in parts:
            if not part:
                continue  # an empty last part: the stream ended on a part boundary
            number += 1
            _raise_first_failure(futures)
            slots.acquire()
            try:
                future = pool.submit(send, number, part)
            except BaseException:
                slots.release()
                raise
            future.add_done_callback(lambda _f: slots.release())
            futures.append(future)
            del part
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _raise_first_failure(futures: builtins.list[concurrent.futures.Future[Any]]) -> None:
    for future in futures:
        if future.done() and not future.cancelled() and (failed := future.exception()) is not None:
            raise failed
