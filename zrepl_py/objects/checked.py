"""Metadata objects written twice and read with a fallback
(docs/reliability.md#r26-catalog-metadata-copy-with-checksum).

pgBackRest keeps ``backup.info`` and ``backup.info.copy``, each with a checksum inside, and
loads the copy when the primary is missing or fails its check. zbak does the same for stream
manifests and catalog exports: the primary is put first, then ``KEY.copy`` with the same
bytes (both STANDARD class); a reader tries the primary, and on a missing object, a store
error or a failed checksum/parse, the copy. Only when both fail is the read an error.

The checksum is the SHA-256 of the object's JSON in canonical form (keys sorted, no
whitespace, ASCII), so it is checked after ``json.loads`` whatever the indentation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from zrepl_py.errors import ObjectNotFound, StoreError, ZbakError
from zrepl_py.objects.layout import copy_key
from zrepl_py.stores.base import Backend, PutResult, get_recorded

log = logging.getLogger(__name__)
T = TypeVar("T")


def canonical_sha256(obj: Any) -> str:
    """Lowercase hex SHA-256 of ``obj`` as canonical JSON (sorted keys, ``,``/``:``, ASCII)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def put_with_copy(backend: Backend, key: str, data: bytes) -> tuple[PutResult, PutResult]:
    """Put ``data`` at ``key`` then at ``KEY.copy``, both STANDARD class; return what each
    put stored (its version and lock on a store that keeps versions).

    Raises:
        StoreError: a put failed (a failed copy leaves the primary in place).
    """
    return (backend.put(key, [data], storage_class="STANDARD"),
            backend.put(copy_key(key), [data], storage_class="STANDARD"))


@dataclasses.dataclass(frozen=True)
class Loaded(Generic[T]):
    """What :func:`read_with_copy` read.

    Attributes:
        value: the parsed object.
        key: the key it came from (the primary or its ``.copy``).
        primary_problem: why the primary was not used (None when it was).
    """

    value: T
    key: str
    primary_problem: str | None = None

    @property
    def from_copy(self) -> bool:
        """True when the primary failed and the copy was used."""
        return self.primary_problem is not None


def read_object(backend: Backend, key: str, versions: Mapping[str, str] | None = None) -> bytes:
    """The whole object ``key`` (metadata objects are small): the version ``versions``
    names for it (key -> version id: zbak's own on a write-once store,
    ``objects.versions``), else the newest.

    Raises:
        ObjectNotFound, NeedsThaw, StoreTransient, StorePermanent.
    """
    return b"".join(get_recorded(backend, key, (versions or {}).get(key)))


def read_with_copy(backend: Backend, key: str, parse: Callable[[bytes, str], T],
                   corrupt: type[ZbakError],
                   versions: Mapping[str, str] | None = None) -> Loaded[T]:
    """Read ``key`` with ``parse(data, where)``; fall back to ``KEY.copy`` (module docstring).

    Args:
        backend: the store.
        key: the primary's key.
        parse: turns the bytes into a value; raises ``corrupt`` on a bad checksum or format.
            ``where`` is ``STORE:KEY`` for messages.
        corrupt: the error type ``parse`` raises, also raised when both objects fail.
        versions: key -> the version to read, as :func:`read_object`.

    Raises:
        ObjectNotFound: neither the primary nor the copy exists.
        corrupt: both fail (one missing and the other corrupt included); the message names
            both keys and both problems.
        StoreError: the primary failed with a store error and the copy is missing.
    """
    second_key = copy_key(key)
    try:
        return Loaded(parse(read_object(backend, key, versions), f"{backend.name}:{key}"), key)
    except (StoreError, corrupt) as exc:
        first = exc
    try:
        value = parse(read_object(backend, second_key, versions),
                      f"{backend.name}:{second_key}")
    except ObjectNotFound:
        raise first from None  # no copy: written before copies existed, or being written
    except (StoreError, corrupt) as exc:
        if isinstance(first, ObjectNotFound):
            raise
        raise corrupt(f"{first}; its copy {second_key} fails too: {exc}") from None
    log.warning("%s: %s; using its copy %s", backend.name, first, second_key)
    return Loaded(value, second_key, str(first))
