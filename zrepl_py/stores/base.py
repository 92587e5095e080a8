"""The object-store interface every archive store implements (``file://`` and ``s3://``).

Error contract (all are ``zrepl_py.errors.StoreError`` subclasses, each naming store and key):

* ``ObjectNotFound``: the key does not exist (``get``, ``stat``, ``request_thaw``).
  ``delete`` of a missing key is not an error (deletion is idempotent, so a prune rerun
  after a crash converges).
* ``NeedsThaw``: ``get`` of an object in a cold class (GLACIER, DEEP_ARCHIVE) that is not
  restored; call ``request_thaw`` and wait until ``stat(key).thaw`` is ``THAWED``.
* ``StoreTransient``: throttling, HTTP 5xx, connection reset, timeout, raised only after the
  backend's own retries with exponential backoff were used up; the caller may run again later.
* ``StorePermanent``: anything retrying cannot fix (access denied, no such bucket, invalid
  storage class, a key outside the store's prefix).

Keys are relative to the store's root (the URL's prefix or directory), ``/``-separated, never
starting with ``/`` and never containing ``..`` segments. Sizes are bytes, times aware UTC.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import datetime as dt
import enum
import logging
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from zrepl_py.errors import StorePermanent
from zrepl_py.stores.object_lock import LockPolicy

log = logging.getLogger(__name__)

# S3 storage classes whose objects must be restored (thawed) before a GET; GLACIER_IR is read
# directly (AWS S3 user guide, "Using Amazon S3 storage classes").
COLD_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})


class Thaw(enum.Enum):
    """Whether an object can be read now."""

    NOT_NEEDED = "not_needed"  # a class read directly (STANDARD, *_IA, GLACIER_IR, file://)
    FROZEN = "frozen"  # cold class, no restore requested (or the restored copy expired)
    THAWING = "thawing"  # restore requested, not finished
    THAWED = "thawed"  # restored copy readable until ``ObjectInfo.thaw_expires``


class ObjectInfo(NamedTuple):
    """What the store says about one object (a named tuple: listings of 100,000 objects
    build one per object, three times faster than a frozen dataclass).

    Attributes:
        key: the key relative to the store root.
        size: stored bytes.
        storage_class: the class the store reports (``STANDARD`` for ``file://``).
        modified: last-modified time, aware UTC.
        thaw: whether a GET would succeed now (see :class:`Thaw`).
        thaw_expires: when a restored (thawed) copy expires, aware UTC, else None.
        sha256: the SHA-256 of the whole object that the store itself keeps (lowercase hex),
            as ``stat`` reports it; None when the store keeps none for the object: always
            for ``file://`` (a file is only its bytes) and for ``list``, and on S3 for
            objects uploaded without one or in several parts (their checksum covers the
            parts' checksums, not the bytes).
        etag: a token that changes whenever the object may hold other bytes, from ``list``
            and ``stat`` alike: on S3 the ETag with the LastModified time (every PUT
            writes a new object; S3 user guide, "Checking object integrity"), for
            ``file://`` the file's inode, mtime and ctime in nanoseconds (a rewrite or an
            atomic replace changes the ctime, which no tool can set back; ``stat(2)``).
            None when the store gives none: then nothing is trusted from the listing.
    """

    key: str
    size: int
    storage_class: str
    modified: dt.datetime
    thaw: Thaw = Thaw.NOT_NEEDED
    thaw_expires: dt.datetime | None = None
    sha256: str | None = None
    etag: str | None = None

    @property
    def readable(self) -> bool:
        """True when a GET would return the bytes now."""
        return self.thaw in (Thaw.NOT_NEEDED, Thaw.THAWED)

    @property
    def identity(self) -> str | None:
        """``SIZE:ETAG``: what a later listing must show for the object to be the one seen
        now (``catalog.stamps``); None without an etag."""
        return None if self.etag is None else f"{self.size}:{self.etag}"


@dataclasses.dataclass(frozen=True)
class PutResult:
    """What ``put`` stored: ``size`` bytes whose SHA-256 is ``sha256`` (lowercase hex), in
    ``storage_class`` (the class actually used: ``file://`` stores everything STANDARD),
    as version ``version_id`` of its key (S3 on a versioned bucket; else None), locked until
    ``retain_until`` (aware UTC) on a store with Object Lock (else None)."""

    size: int
    sha256: str
    storage_class: str
    version_id: str | None = None
    retain_until: dt.datetime | None = None


class Version(NamedTuple):
    """One version of a key in a store that keeps versions (S3 ListObjectVersions), or a
    delete marker.

    Attributes:
        info: the version as :meth:`Backend.list` would show it (a delete marker: size 0).
        version_id: S3's ``VersionId``.
        latest: S3's ``IsLatest``: what a read without a version id gets (a delete marker
            latest hides the key).
        marker: True for a delete marker (no bytes).
    """

    info: ObjectInfo
    version_id: str
    latest: bool
    marker: bool


class Unfinished(NamedTuple):
    """What an unfinished put left in the store: an S3 multipart upload never completed nor
    aborted, or a ``file://`` temporary file (a process killed mid-put leaves one; neither
    is an object, ``list`` never shows it).

    Attributes:
        key: the object key the put was for.
        ident: the store's handle on it: the upload id, or the temporary file's name.
        what: ``"multipart upload ID"`` or ``"temporary file NAME"``, for messages.
        size: bytes it holds (the uploaded parts, the file's length); None when not
            asked for (``sizes=False``) or unknown.
        since: aware UTC: when the upload was initiated (S3 ``Initiated``), or when the
            temporary file was last written (its mtime: a running put keeps it recent).
    """

    key: str
    ident: str
    what: str
    size: int | None
    since: dt.datetime


def under_any(key: str, prefixes: Collection[str]) -> bool:
    """Whether ``key`` lies under one of ``prefixes`` (a set of directory prefixes, each
    ending in ``/``): one lookup per ``/`` in the key."""
    at = key.find("/")
    while at >= 0:
        if key[:at + 1] in prefixes:
            return True
        at = key.find("/", at + 1)
    return False


def get_recorded(backend: Backend, key: str, version_id: str | None) -> Iterator[bytes]:
    """The bytes of ``key`` as the catalog recorded it: version ``version_id`` when it
    records one (an overwrite or a delete marker since changes nothing read;
    docs/design.md#object-lock), else the newest.

    Raises:
        as :meth:`Backend.get` and :meth:`Backend.get_version`.
    """
    return backend.get(key) if version_id is None else backend.get_version(key, version_id)


def stat_recorded(backend: Backend, key: str, version_id: str | None) -> ObjectInfo:
    """:func:`get_recorded`'s object as ``stat`` sees it.

    Raises:
        as :meth:`Backend.stat` and :meth:`Backend.stat_version`.
    """
    return backend.stat(key) if version_id is None else backend.stat_version(key, version_id)


class Backend(abc.ABC):
    """One store: a bucket and prefix, or a directory.

    Attributes:
        name: the store's name in the config (``[stores.NAME]``), used in messages.
        url: the store's URL (``s3://bucket/prefix`` or ``file:///dir``).
    """

    name: str
    url: str

    @abc.abstractmethod
    def put(self, key: str, chunks: Iterable[bytes], *, storage_class: str = "STANDARD") -> PutResult:
        """Store the concatenation of ``chunks`` (of unknown total length) under ``key``.

        The object appears whole or not at all: a failure or interruption leaves no object
        under ``key`` (an earlier object there is kept until the new one is complete, then
        replaced). Memory stays bounded by the part size times the upload concurrency,
        whatever the total length. The SHA-256 is computed over the bytes as they pass.

        Raises:
            StoreTransient, StorePermanent: as in the module docstring; also any exception
                raised by iterating ``chunks`` (the upload is aborted first).
        """

    @abc.abstractmethod
    def get(self, key: str, *, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Yield the object's bytes in order, in chunks of at most ``chunk_size`` bytes.

        A connection lost mid-object is resumed from the last byte yielded (ranged GET),
        within the retry budget.

        Raises:
            ObjectNotFound, NeedsThaw, StoreTransient, StorePermanent. ``ObjectNotFound`` and
            ``NeedsThaw`` are raised by the call itself, before any byte is yielded; errors
            after the first byte are raised while iterating.
        """

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Return what the store knows of ``key``.

        Raises:
            ObjectNotFound, StoreTransient, StorePermanent.
        """

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield every object whose key starts with ``prefix``, in key order (byte-wise).

        Objects of unfinished puts never appear. A listing may not know thaw progress: cold
        objects are reported ``FROZEN`` there, and ``stat`` tells ``THAWING``/``THAWED``.

        Raises:
            StoreTransient, StorePermanent (also for a prefix starting with ``/`` or holding
            a ``..`` segment).
        """

    def get_version(self, key: str, version_id: str, *,
                    chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """:meth:`get` of version ``version_id`` of ``key`` (S3 ``VersionId``): the bytes
        zbak wrote there, whatever was written or deleted under the key since.

        Raises:
            as :meth:`get`; ``ObjectNotFound`` when the version is gone; ``StorePermanent``
            on a store that keeps no versions (this default).
        """
        raise self._no_versions(key)

    def stat_version(self, key: str, version_id: str) -> ObjectInfo:
        """:meth:`stat` of version ``version_id`` of ``key``.

        Raises:
            as :meth:`get_version`.
        """
        raise self._no_versions(key)

    @property
    def keeps_versions(self) -> bool:
        """True when the store's objects are versioned and locked (S3 with
        ``[stores.NAME.object_lock]``): its keys are write-once, so what zbak wrote is a
        version of its own and reads and checks go by version
        (docs/design.md#immutable-cold-storage). False here."""
        return False

    @property
    def lock_policy(self) -> LockPolicy | None:
        """How the store locks what it writes (``[stores.NAME.object_lock]``); None here."""
        return None

    def lock_version(self, key: str, version_id: str) -> dt.datetime:
        """Lock version ``version_id`` of ``key`` until now + :attr:`lock_policy`'s period
        (set when written, extended by ``archive.rolling_lock``); return the new retain-until
        date (aware UTC).

        Raises:
            StoreTransient, StorePermanent (this default: the store keeps no versions).
        """
        raise self._no_versions(key)

    def retain_until(self, key: str, version_id: str) -> dt.datetime | None:
        """When the Object Lock of version ``version_id`` of ``key`` lapses (aware UTC), None
        when it has none.

        Raises:
            ObjectNotFound (the version is gone), StoreTransient, StorePermanent (this
                default: the store keeps no versions).
        """
        raise self._no_versions(key)

    def list_versions(self, prefix: str) -> Iterator[Version]:
        """Every version and delete marker of every key under ``prefix``, by key in key
        order, each key's versions newest first (S3 ListObjectVersions' order).

        Raises:
            StoreTransient, StorePermanent (this default: the store keeps no versions).
        """
        raise self._no_versions(prefix)

    def delete_version(self, key: str, version_id: str) -> None:
        """Delete version (or delete marker) ``version_id`` of ``key`` for good (S3
        DeleteObject with ``VersionId``: no delete marker is added; a delete without it only
        hides the key, docs/security.md#prune-on-a-lock-store); a missing version is not an
        error. S3 refuses a version whose Object Lock has not lapsed (AccessDenied).

        Raises:
            StoreTransient, StorePermanent (a locked version; this default: the store keeps
                no versions).
        """
        raise self._no_versions(key)

    def _no_versions(self, key: str) -> StorePermanent:
        return StorePermanent(f"store {self.name} keeps no object versions: {key!r} cannot be"
                              " read by version", store=self.name, key=key)

    def list_outside(self, prefix: str, skip: Collection[str]) -> Iterator[ObjectInfo]:
        """:meth:`list` of ``prefix`` without the objects under any of the prefixes in
        ``skip`` (each ending in ``/``: directories, e.g. other datasets' ``HOST/DATASET/``),
        in key order; one audit batch lists its datasets' own objects with it
        (docs/decisions.md#catalog-commands-stay-fast-at-100000-streams).

        This default filters :meth:`list` (the skipped objects are still listed, though
        never held); ``file://`` and S3 override it to leave the skipped directories
        unread.

        Raises:
            as :meth:`list`.
        """
        if not skip:
            yield from self.list(prefix)
            return
        skipped = frozenset(skip)
        for info in self.list(prefix):
            if not under_any(info.key, skipped):
                yield info

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is not an error (idempotent).

        Raises:
            StoreTransient, StorePermanent.
        """

    @abc.abstractmethod
    def request_thaw(self, key: str, *, days: int, tier: str) -> Thaw:
        """Ask the store to make a cold object readable for ``days`` days, at retrieval
        ``tier`` (``Expedited``, ``Standard`` or ``Bulk``; S3 RestoreObject). Requesting again
        while a restore is in progress is not an error. Returns the state after the request
        (``NOT_NEEDED`` for a class read directly).

        Raises:
            ObjectNotFound, StoreTransient, StorePermanent.
        """

    @abc.abstractmethod
    def unfinished_uploads(self, prefix: str = "", *, sizes: bool = True) -> builtins.list[Unfinished]:
        """What unfinished puts of keys starting with ``prefix`` left behind (see
        :class:`Unfinished`), in key order. ``sizes``: also each one's bytes (S3: one
        ListParts request per upload; free for ``file://``).

        Raises:
            StoreTransient, StorePermanent (AccessDenied on S3 without
            s3:ListBucketMultipartUploads, or s3:ListMultipartUploadParts for the sizes).
        """

    @abc.abstractmethod
    def abort_upload(self, upload: Unfinished) -> bool:
        """Remove one leftover :meth:`unfinished_uploads` returned (AbortMultipartUpload,
        or unlink the temporary file); False when it was gone already (completed, or
        removed by someone else). Never touches an object.

        Raises:
            StoreTransient, StorePermanent.
        """

    def abort_uploads_before(self, before: dt.datetime, prefix: str = "") -> builtins.list[str]:
        """Remove the leftovers of unfinished puts under ``prefix`` whose ``since`` is
        before ``before`` (aware UTC, compared with the store's times: S3's clock, the
        file system's mtimes). An upload running now is younger, on ``file://`` because
        it writes its temporary file all the time; on S3 only its start is known, so
        ``before`` must leave room for the longest put.

        Returns:
            ``"KEY (multipart upload ID)"`` or ``"KEY (temporary file NAME)"`` per
            leftover removed, in key order.

        Raises:
            StoreTransient, StorePermanent.
        """
        removed = []
        for upload in self.unfinished_uploads(prefix, sizes=False):
            if upload.since < before and self.abort_upload(upload):
                log.info("store %s: removed the %s of %r (unfinished since %s)", self.name,
                         upload.what, upload.key, f"{upload.since:%Y-%m-%d %H:%M:%S}Z")
                removed.append(f"{upload.key} ({upload.what})")
        return removed

    @abc.abstractmethod
    def probe(self) -> str:
        """Check that the store can be used now, for ``zbak init``; return one line saying
        what was found (``bucket B reachable``, ``directory D writable``).

        A store may prepare itself here where that is the admin's set-up step (``file://``
        creates its directory); no other call does (a missing directory is usually an
        unmounted disk).

        Raises:
            StorePermanent: what the admin must fix (no such bucket, access denied, a
                directory that cannot be created or written).
            StoreTransient: the store did not answer within the retries.
        """

    def abort_stale_uploads(self, older_than: float) -> builtins.list[str]:
        """Remove what unfinished puts left behind that started more than ``older_than``
        seconds ago (>= 0): S3 multipart uploads never completed nor aborted (a process
        killed mid-put; their parts are billed and never visible), the ``file://`` store's
        temporary files last written that long ago. Younger leftovers may be puts still
        running and are kept. Objects are never touched. Used by ``zbak audit --repair``
        (docs/reliability.md#r15-multipart-edge-cases; z3 ``s3_mp_cleanup.py``). The age is
        measured against this host's clock, so keep ``older_than`` well above any clock skew and
        the longest put (days, not minutes). A bucket lifecycle rule
        ``AbortIncompleteMultipartUpload`` does the same on the server side.

        Returns:
            as :meth:`abort_uploads_before`.

        Raises:
            StoreTransient, StorePermanent (also for a negative ``older_than``).
        """
        if older_than < 0:
            raise StorePermanent(f"store {self.name}: older_than must be >= 0 seconds, not"
                                 f" {older_than}", store=self.name)
        # <= the cutoff, not <: an age of 0 removes whatever is there now.
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than)
        return self.abort_uploads_before(cutoff + dt.timedelta(microseconds=1))

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """``{key: stored bytes}`` of every object :meth:`list` yields for ``prefix``; a
        store may answer it more cheaply than the whole listing (``file://`` builds no
        :class:`ObjectInfo`: 308,000 objects in 1.7 instead of 2.5 s of CPU and 60 MiB less).

        Raises:
            as :meth:`list`.
        """
        return {info.key: info.size for info in self.list(prefix)}

    def local_path(self, key: str) -> Path | None:
        """The object's file when the store is a local directory (reads skip a copy), else None."""
        return None

    def close(self) -> None:  # noqa: B027 (a no-op unless the store holds connections)
        """Release connections; the backend is not used afterwards."""
