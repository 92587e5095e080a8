"""``FaultyBackend``: a real store with injected faults (restic's ``errorBackend`` /
``errorOnceBackend``, borg's monkeypatch-after-N pattern, as a wrapper).

The wrapper forwards every call to the inner ``Backend`` (``FileBackend`` or ``S3Backend``)
and changes only what its arguments ask for. Faults on the data of ``get`` are applied to the
bytes as they stream, at absolute offsets of the object, whatever the chunking:

* ``truncate_at=N``: the read ends after byte N (no error: a connection that closes early, or
  a zstd decoder that "succeeds" on a short frame, docs/style.md#the-zstandard-pitfall).
* ``flip_byte_at=N``: byte N arrives XORed with ``flip_mask`` (default 0x01: one bit).
* ``append=b"..."``: these bytes follow the object (trailing garbage, CPython gh-132983).
* ``faulty_reads=N``: the three faults above apply only to the first N reads of each key
  (``faulty_reads=1`` is restic's "corrupt on the first read, good on the second"); None means
  every read.
* ``keys``: which keys the data faults touch: a predicate ``key -> bool``, or a string that
  must occur in the key; None means every key.

``stat`` and ``list`` are passed through unchanged, so a truncated read is NOT visible as a
smaller object: the reader's own end-of-frame, byte-count and SHA-256 checks must catch it.
``local_path`` always returns None, so readers of a ``file://`` store cannot bypass the faults
by opening the file themselves; they download through ``get`` like from S3.

Faults on calls (``op`` is one of ``put``, ``get``, ``stat``, ``list``, ``delete``,
``request_thaw``, ``abort_stale_uploads``):

* ``fail_once={"put", ...}``: the first call of each named op raises ``error(op, key)``.
* ``fail_after_calls=N``: the first N calls of the ``counted`` ops (default ``put`` and
  ``delete``: the steps that change the store) run; every later one raises before reaching the
  inner store.
* ``after_call=f``: ``f(count, op, key)`` runs after each counted call SUCCEEDED (``count``
  from 1). ``support/crash_runner.py`` passes a function that SIGKILLs the process, which stops
  the run exactly after the k-th durable step.
* ``hang={"get": 30.0}``: the named ops sleep that many seconds before calling the inner store
  (a store that stopped answering; pair with a timeout in the caller or the test).

Every call is appended to ``calls`` as ``(op, key)`` (``key`` is the prefix for ``list``).
The default error is ``StoreTransient`` for ``fail_once`` (worth a retry) and
``StorePermanent`` for ``fail_after_calls``; both carry "injected fault" in the message.
Thread-safe: counters are under a lock (restores fetch volumes in parallel).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from zrepl_py.errors import StoreError, StorePermanent, StoreTransient
from zrepl_py.stores.base import Backend, ObjectInfo, PutResult, Thaw, Unfinished

COUNTED = ("put", "delete")
"""The ops ``fail_after_calls`` and ``after_call`` count by default: those that change the store."""


def _transient(op: str, key: str | None) -> StoreError:
    return StoreTransient(f"injected fault: {op} {key!r} failed once", store="faulty", key=key)


def _permanent(op: str, key: str | None) -> StoreError:
    return StorePermanent(f"injected fault: {op} {key!r} refused after the call limit",
                          store="faulty", key=key)


class FaultyBackend(Backend):
    """Wrap ``inner`` and inject the faults named by the keyword arguments (module docstring).

    Args:
        inner: the real backend; its ``name`` and ``url`` are reported as this one's.
        truncate_at / flip_byte_at: byte offsets into the object (0-based) for ``get``.
        flip_mask: the XOR applied at ``flip_byte_at`` (1..255).
        append: bytes yielded after the object's last byte.
        faulty_reads: how many reads of each key get the data faults (None: all).
        keys: predicate or substring selecting the keys the data faults apply to.
        fail_once: ops whose first call raises ``once_error(op, key)``.
        once_error: builds the exception for ``fail_once`` (default ``StoreTransient``).
        fail_after_calls: counted calls allowed before every further one raises.
        limit_error: builds the exception for ``fail_after_calls`` (default ``StorePermanent``).
        counted: the ops counted by ``fail_after_calls`` and ``after_call``.
        after_call: ``f(count, op, key)`` after each successful counted call.
        hang: op -> seconds to sleep before calling the inner store.

    Raises:
        ValueError: a negative offset or limit, or a mask outside 1..255.
    """

    def __init__(
        self,
        inner: Backend,
        *,
        truncate_at: int | None = None,
        flip_byte_at: int | None = None,
        flip_mask: int = 0x01,
        append: bytes | None = None,
        faulty_reads: int | None = None,
        keys: Callable[[str], bool] | str | None = None,
        fail_once: Iterable[str] = (),
        once_error: Callable[[str, str | None], BaseException] = _transient,
        fail_after_calls: int | None = None,
        limit_error: Callable[[str, str | None], BaseException] = _permanent,
        counted: Iterable[str] = COUNTED,
        after_call: Callable[[int, str, str | None], None] | None = None,
        hang: Mapping[str, float] | None = None,
    ):
        for what, value in (("truncate_at", truncate_at), ("flip_byte_at", flip_byte_at),
                            ("faulty_reads", faulty_reads), ("fail_after_calls", fail_after_calls)):
            if value is not None and value < 0:
                raise ValueError(f"{what} must be >= 0, not {value}")
        if not 1 <= flip_mask <= 255:
            raise ValueError(f"flip_mask must be 1..255, not {flip_mask}")
        self.inner = inner
        self.name = inner.name
        self.url = inner.url
        self.truncate_at = truncate_at
        self.flip_byte_at = flip_byte_at
        self.flip_mask = flip_mask
        self.append = append
        self.faulty_reads = faulty_reads
        self._keys = (lambda key: keys in key) if isinstance(keys, str) else keys
        self._fail_once = set(fail_once)
        self._once_error = once_error
        self.fail_after_calls = fail_after_calls
        self._limit_error = limit_error
        self._counted = frozenset(counted)
        self._after_call = after_call
        self._hang = dict(hang or {})
        self._lock = threading.Lock()
        self._reads: dict[str, int] = {}
        self.counted_calls = 0
        """Counted calls that succeeded so far."""
        self.calls: list[tuple[str, str | None]] = []
        """Every call as ``(op, key)``, in order."""

    def __repr__(self) -> str:
        return f"FaultyBackend({self.inner!r})"

    # -- call faults --------------------------------------------------------------------------

    def _enter(self, op: str, key: str | None) -> None:
        """Record the call; sleep, fail once or fail over the limit as configured."""
        with self._lock:
            self.calls.append((op, key))
            once = op in self._fail_once
            self._fail_once.discard(op)
            over = (op in self._counted and self.fail_after_calls is not None
                    and self.counted_calls >= self.fail_after_calls)
        if op in self._hang:
            time.sleep(self._hang[op])
        if once:
            raise self._once_error(op, key)
        if over:
            raise self._limit_error(op, key)

    def _done(self, op: str, key: str | None) -> None:
        """Count a successful call and run ``after_call``."""
        if op not in self._counted:
            return
        with self._lock:
            self.counted_calls += 1
            count = self.counted_calls
        if self._after_call is not None:
            self._after_call(count, op, key)

    # -- data faults --------------------------------------------------------------------------

    def _faulty(self, key: str) -> bool:
        if self._keys is not None and not self._keys(key):
            return False
        with self._lock:
            seen = self._reads.get(key, 0)
            self._reads[key] = seen + 1
        return self.faulty_reads is None or seen < self.faulty_reads

    def _mutate(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        offset = 0
        for chunk in chunks:
            end = offset + len(chunk)
            if self.flip_byte_at is not None and offset <= self.flip_byte_at < end:
                changed = bytearray(chunk)
                changed[self.flip_byte_at - offset] ^= self.flip_mask
                chunk = bytes(changed)
            if self.truncate_at is not None and end >= self.truncate_at:
                if self.truncate_at > offset:
                    yield chunk[: self.truncate_at - offset]
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()  # release the inner read (file handle, HTTP body)
                return
            offset = end
            yield chunk
        if self.append:
            yield self.append

    # -- Backend ------------------------------------------------------------------------------

    def put(self, key: str, chunks: Iterable[bytes], *,
            storage_class: str = "STANDARD") -> PutResult:
        """The inner ``put``, after the call faults; counted (``counted`` default)."""
        self._enter("put", key)
        result = self.inner.put(key, chunks, storage_class=storage_class)
        self._done("put", key)
        return result

    def get(self, key: str, *, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The inner ``get`` with the data faults applied when ``key`` is selected."""
        self._enter("get", key)
        chunks = self.inner.get(key, chunk_size=chunk_size)
        self._done("get", key)
        return self._mutate(iter(chunks)) if self._faulty(key) else chunks

    def stat(self, key: str) -> ObjectInfo:
        """The inner ``stat`` (sizes are the real ones, whatever ``get`` does)."""
        self._enter("stat", key)
        info = self.inner.stat(key)
        self._done("stat", key)
        return info

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """The inner ``list``."""
        self._enter("list", prefix)
        found = list(self.inner.list(prefix))
        self._done("list", prefix)
        return iter(found)

    def delete(self, key: str) -> None:
        """The inner ``delete``, after the call faults; counted (``counted`` default)."""
        self._enter("delete", key)
        self.inner.delete(key)
        self._done("delete", key)

    def request_thaw(self, key: str, *, days: int, tier: str) -> Thaw:
        """The inner ``request_thaw``."""
        self._enter("request_thaw", key)
        state = self.inner.request_thaw(key, days=days, tier=tier)
        self._done("request_thaw", key)
        return state

    def probe(self) -> str:
        """The inner ``probe``, after the call faults (op ``probe``, key None)."""
        self._enter("probe", None)
        found = self.inner.probe()
        self._done("probe", None)
        return found

    def abort_stale_uploads(self, older_than: float) -> list[str]:
        """The inner ``abort_stale_uploads``, after the call faults (op ``abort_stale_uploads``,
        key None)."""
        self._enter("abort_stale_uploads", None)
        removed = self.inner.abort_stale_uploads(older_than)
        self._done("abort_stale_uploads", None)
        return removed

    def unfinished_uploads(self, prefix: str = "", *, sizes: bool = True) -> list[Unfinished]:
        """The inner ``unfinished_uploads``, after the call faults."""
        self._enter("unfinished_uploads", prefix)
        found = self.inner.unfinished_uploads(prefix, sizes=sizes)
        self._done("unfinished_uploads", prefix)
        return found

    def abort_upload(self, upload: Unfinished) -> bool:
        """The inner ``abort_upload``, after the call faults."""
        self._enter("abort_upload", upload.key)
        removed = self.inner.abort_upload(upload)
        self._done("abort_upload", upload.key)
        return removed

    def local_path(self, key: str) -> Path | None:
        """Always None: every read goes through ``get`` and its faults."""
        return None

    def close(self) -> None:
        """Close the inner backend."""
        self.inner.close()
