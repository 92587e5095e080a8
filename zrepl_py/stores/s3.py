"""``s3://bucket/prefix``: a store in an S3 bucket (AWS, MinIO, Ceph RGW, ...) through boto3.

Credentials come only from the standard AWS chain (environment ``AWS_*``, the shared config and
credentials files with an optional profile name, container or instance role); no key is ever
accepted from argv or zbak's config.

Limits this module stays within (AWS S3 user guide, "Amazon S3 multipart upload limits"):

* a part is 5 MiB to 5 GiB, except the last part, which may be smaller;
* an upload has at most 10,000 parts (numbered 1 to 10,000);
* an object is at most 5 TiB.

An object shorter than one part goes up in a single PutObject; a longer one in a multipart
upload whose parts are uploaded ``concurrency`` at a time (memory: at most ``concurrency`` parts
in flight plus the one being filled, ``part_size * (concurrency + 1)`` bytes). Both carry a
SHA-256 checksum that S3 verifies on arrival (``ChecksumAlgorithm=SHA256``; AWS S3 user guide,
"Checking object integrity"). A multipart upload that fails or is interrupted is aborted, so no
upload stays open (parts of an open upload are billed).

Retries: botocore's own retries are OFF (``total_max_attempts=1``) so that
:class:`zrepl_py.stores.retry.RetryPolicy` is the only policy: every call maps botocore's error
to ``StoreTransient`` / ``StorePermanent`` / ``ObjectNotFound`` / ``NeedsThaw`` first, and only
``StoreTransient`` is retried.
"""

from __future__ import annotations

import base64
import bisect
import builtins
import datetime as dt
import email.utils
import hashlib
import http.client
import logging
import re
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import boto3
import botocore.config
import botocore.exceptions
import urllib3.exceptions

from zrepl_py.errors import (
    NeedsThaw,
    ObjectNotFound,
    StoreError,
    StoreNotLockable,
    StorePermanent,
    StoreReadCorrupt,
    StoreTransient,
)
from zrepl_py.stores.base import (
    COLD_CLASSES,
    Backend,
    ObjectInfo,
    PutResult,
    Thaw,
    Unfinished,
    Version,
    under_any,
)
from zrepl_py.stores.keys import check_key, check_prefix
from zrepl_py.stores.object_lock import LockPolicy
from zrepl_py.stores.parts import cut, send_all
from zrepl_py.stores.retry import RetryPolicy

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

MiB = 1 << 20
GiB = 1 << 30
MIN_PART_SIZE = 5 * MiB  # S3 multipart limits: every part but the last is at least 5 MiB
MAX_PART_SIZE = 5 * GiB  # ... and at most 5 GiB
MAX_PARTS = 10_000  # ... part numbers 1 to 10,000
MAX_OBJECT_SIZE = 5 * (1 << 40)  # an object is at most 5 TiB
MAX_COPY_SIZE = 5 * GiB  # one CopyObject copies at most 5 GiB (AWS S3 API reference, CopyObject)
DEFAULT_PART_SIZE = 8 * MiB
# 8 MiB as boto3's managed uploads (s3transfer's multipart_chunksize): with the default upload
# concurrency of 4, parts in flight hold 40 MiB, which keeps ``zbak archive`` to S3 under its
# 200 MiB peak RSS beside zstd's workers (16 MiB parts took it to 213 MiB;
# docs/decisions.md#archive-at-the-speed-of-the-pipe-within-200-mib).

RESTORE_TIERS = ("Expedited", "Standard", "Bulk")  # S3 RestoreObject GlacierJobParameters.Tier

# Error codes retrying can fix (AWS S3 API reference, "Error responses"; 5xx and 429 are
# transient whatever the code).
_TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestLimitExceeded", "TooManyRequests", "RequestTimeout", "RequestTimeoutException",
    "InternalError", "ServiceUnavailable", "OperationAborted",
})
_CREDENTIAL_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "403",
})
# What a broken connection looks like while reading a GET body: botocore wraps urllib3's errors
# (ResponseStreamingError, ReadTimeoutError are HTTPClientErrors), and checks the length at the
# end (IncompleteReadError); the raw ones are listed for the paths botocore does not wrap.
_STREAM_ERRORS = (
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.IncompleteReadError,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    ConnectionError,
    TimeoutError,
)
_RESTORE_RE = re.compile(
    r'ongoing-request="(?P<ongoing>true|false)"(?:,\s*expiry-date="(?P<expiry>[^"]+)")?')


class _RestoreInProgress(StorePermanent):
    """RestoreObject answered RestoreAlreadyInProgress (HTTP 409); request_thaw catches it."""


class _NoLockConfiguration(StorePermanent):
    """GetObjectLockConfiguration answered ObjectLockConfigurationNotFoundError: the bucket
    has no Object Lock; probe catches it."""


class _NoSuchUpload(StorePermanent):
    """The multipart upload no longer exists: completed, or aborted by someone else."""


class S3Backend(Backend):
    """A store under ``prefix`` in ``bucket``.

    Args:
        name: the store's name in the config, for messages.
        bucket: the bucket (a DNS-compatible name).
        prefix: the key prefix of the store (``""`` for the whole bucket); a trailing ``/`` is
            added when missing, so keys live "in a directory".
        endpoint_url: an S3-compatible endpoint (``https://minio.example:9000``); None for AWS.
        region: the region; None takes it from the AWS chain.
        profile: a profile of the shared AWS config/credentials files; None for the default
            chain (environment, default profile, instance role).
        part_size: bytes per multipart part, 5 MiB to 5 GiB; objects shorter than one part are
            uploaded in one PutObject. An object may have at most 10,000 parts.
        concurrency: parts uploaded at the same time (1 to 64).
        client: an existing boto3 S3 client to use instead of building one (its retry config
            is then the caller's business).
        retry: the retry policy; None for :class:`RetryPolicy`'s defaults.
        object_params: parameters every request that creates an object sends besides its
            own (server-side encryption: ``ServerSideEncryption``, ``SSEKMSKeyId``):
            PutObject and CreateMultipartUpload; a CopyObject must send them too, since S3
            applies no source or bucket setting to a copy's encryption unless asked (AWS S3
            user guide, "Specifying server-side encryption with AWS KMS").
        lock: the store's Object Lock: every version ``put`` writes is locked with
            PutObjectRetention once uploaded (S3 applies no lock from a multipart upload's
            headers on every implementation: moto applies none), and ``probe`` checks the
            bucket has versioning and Object Lock; None: nothing is locked.

    Raises:
        StorePermanent: a part size or concurrency out of range, a bad prefix, an unknown
            profile.
    """

    def __init__(
        self,
        name: str,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        concurrency: int = 4,
        client: Any = None,
        retry: RetryPolicy | None = None,
        object_params: Mapping[str, str] | None = None,
        lock: LockPolicy | None = None,
    ):
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix, store=name)
            prefix += "/"
        if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
            raise StorePermanent(
                f"store {name}: part size {part_size} bytes is outside S3's limits"
                f" ({MIN_PART_SIZE} to {MAX_PART_SIZE} bytes)", store=name)
        if not 1 <= concurrency <= 64:
            raise StorePermanent(f"store {name}: upload concurrency {concurrency} is not 1 to 64",
                                 store=name)
        self.name = name
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}"
        self.part_size = part_size
        self.concurrency = concurrency
        self._retry = retry or RetryPolicy()
        self._object_params = dict(object_params or {})
        self.lock = lock
        self._own_client = client is None
        self._client = client if client is not None else self._make_client(
            endpoint_url, region, profile)

    def __repr__(self) -> str:
        return f"S3Backend({self.name!r}, {self.url!r})"

    def _make_client(self, endpoint_url: str | None, region: str | None,
                     profile: str | None) -> S3Client:
        config = botocore.config.Config(
            # botocore retries off: RetryPolicy is the only retry policy (see module docstring).
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=max(10, self.concurrency + 2),
            connect_timeout=10,
            read_timeout=60,
        )
        try:
            session = boto3.session.Session(profile_name=profile, region_name=region)
            return session.client("s3", endpoint_url=endpoint_url, config=config)
        except botocore.exceptions.BotoCoreError as exc:
            raise StorePermanent(f"store {self.name}: cannot set up the S3 client: {exc}",
                                 store=self.name) from exc

    # -- Backend ----------------------------------------------------------------------------

    def put(self, key: str, chunks: Iterable[bytes], *,
            storage_class: str = "STANDARD") -> PutResult:
        """Upload the concatenation of ``chunks`` under ``key`` in ``storage_class``.

        Less than one part in total: one PutObject. Otherwise a multipart upload with at most
        ``concurrency`` parts in flight; S3 makes the object visible only on
        CompleteMultipartUpload, so an earlier object under ``key`` stays until then. On any
        failure, KeyboardInterrupt and the caller's exception included, queued parts are
        cancelled, running ones finish, and the upload is aborted. On a lock store the new
        version is then locked (``_lock_version``); a failure there raises, leaving the
        version stored but unlocked.

        Raises:
            StorePermanent: invalid key or storage class, access denied, no such bucket, more
                than 10,000 parts (raise the part size, or lower the store's volume_size), more
                than 5 TiB.
            StoreTransient: after the retries.
            whatever iterating ``chunks`` raises.
        """
        check_key(key, store=self.name)
        digest = hashlib.sha256()
        counter = [0]
        parts = self._parts(chunks, key, digest, counter)
        first = next(parts)
        second = next(parts) if len(first) == self.part_size else bytearray()
        if not second:  # the whole object fits in one part: one request
            stored = self._retry.call(
                self._op, "put_object", key,
                Bucket=self.bucket, Key=self._full(key), Body=first, StorageClass=storage_class,
                ChecksumAlgorithm="SHA256", ChecksumSHA256=_b64sha256(first),
                **self._object_params,
            )
        else:
            head = [first, second]
            del first, second  # only ``head`` may hold them, and it lets go once they are sent
            stored = self._multipart(key, storage_class, head, parts)
        # "null" is the version of a write to a bucket whose versioning is off or suspended
        # (moto answers it for a multipart upload to an unversioned bucket): the next write
        # replaces it, so it names nothing a reader could ask for later (S3 User Guide,
        # "Working with objects in a versioning-suspended bucket").
        version_id = stored.get("VersionId")
        if version_id == "null":
            version_id = None
        retain_until = None if self.lock is None else self._lock_version(key, version_id)
        return PutResult(size=counter[0], sha256=digest.hexdigest(), storage_class=storage_class,
                         version_id=version_id, retain_until=retain_until)

    def copy_within(self, source: S3Backend, key: str, *,
                    storage_class: str = "STANDARD") -> PutResult | None:
        """Copy ``key`` of store ``source`` (a store on this endpoint, reached with this
        store's credentials) to ``key`` of this store by one server-side CopyObject with
        ``ChecksumAlgorithm=SHA256``: no byte passes through this host, and S3 answers the
        new object's SHA-256, computed over the bytes it wrote (a single-part object, so a
        full-object checksum even when the source was a multipart upload; AWS S3 API
        reference, CopyObject "x-amz-checksum-algorithm"). The target's server-side
        encryption is sent (S3 applies no source setting to a copy's encryption) and, on a
        lock store, the new version is locked as :meth:`put` locks it.

        Returns:
            what was stored (``size`` from a HeadObject of the new object), or None when
            no checked copy was made, so the caller streams the object instead: it is over
            CopyObject's 5 GiB limit (UploadPartCopy answers only each part's checksum, never
            the whole object's), or S3 answered no full-object SHA-256 (an implementation
            that keeps none: the streamed put replaces the unchecked copy, and until then the
            catalog names it nowhere; docs/decisions.md#s3-to-s3-copies-stay-inside-s3).

        Raises:
            ObjectNotFound: ``key`` is not in ``source``; NeedsThaw: it is in a cold class.
            StorePermanent: access denied, an invalid storage class, as :meth:`put`.
            StoreTransient: after the retries.
        """
        check_key(key, store=self.name)
        size = source.stat(key).size
        if size > MAX_COPY_SIZE:
            return None
        answer = self._retry.call(
            self._op, "copy_object", key, Bucket=self.bucket, Key=self._full(key),
            CopySource={"Bucket": source.bucket, "Key": source._full(key)},
            StorageClass=storage_class, ChecksumAlgorithm="SHA256", **self._object_params)
        result = answer.get("CopyObjectResult", {})
        sha256 = _full_object_sha256(result)
        if sha256 is None:
            return None
        version_id = answer.get("VersionId")
        if version_id == "null":
            version_id = None
        retain_until = None if self.lock is None else self._lock_version(key, version_id)
        return PutResult(size=self.stat(key).size, sha256=sha256, storage_class=storage_class,
                         version_id=version_id, retain_until=retain_until)

    def get(self, key: str, *, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Send the GetObject now (so a missing or frozen object raises here, before any byte)
        and return an iterator of the body in chunks of at most ``chunk_size`` bytes.

        A connection lost mid-body is resumed with a ranged GET from the first byte not yet
        yielded (``If-Match`` the first answer's ETag, so a replaced object is not spliced
        in); after ``retry.attempts`` failures in a row without progress, the iterator raises
        ``StoreTransient``.

        Raises:
            ObjectNotFound, NeedsThaw (``InvalidObjectState``: a cold object not restored),
            StoreTransient, StorePermanent (also ``PreconditionFailed`` when the object was
            replaced during the read).
        """
        return self._get(key, {}, chunk_size)

    def get_version(self, key: str, version_id: str, *,
                    chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """:meth:`get` with ``VersionId`` (its ranged resumes too).

        Raises:
            as :meth:`get`; ObjectNotFound for a version that does not exist (NoSuchVersion).
        """
        return self._get(key, {"VersionId": version_id}, chunk_size)

    def _get(self, key: str, version: dict[str, str], chunk_size: int) -> Iterator[bytes]:
        check_key(key, store=self.name)
        response = self._retry.call(self._op, "get_object", key,
                                    Bucket=self.bucket, Key=self._full(key), **version)
        return self._stream(key, response, chunk_size, version)

    def stat(self, key: str) -> ObjectInfo:
        """HeadObject: size, class (absent means STANDARD), modified time and thaw state from
        the ``x-amz-restore`` header (``ongoing-request="true"`` is THAWING;
        ``ongoing-request="false", expiry-date="..."`` is THAWED until that date; a cold class
        without the header is FROZEN). With ``ChecksumMode=ENABLED`` S3 also answers the
        object's stored SHA-256 (``x-amz-checksum-sha256``, base64): ``sha256`` when it is
        a full-object checksum, None for a multipart object's composite one (``...-N``,
        ``ChecksumType`` COMPOSITE; AWS S3 user guide, "Checking object integrity") or none.

        Raises:
            ObjectNotFound (a HEAD 404; S3 answers 403 AccessDenied instead when the
            credentials may not list the bucket), StoreTransient, StorePermanent.
        """
        return self._stat(key, {})

    def stat_version(self, key: str, version_id: str) -> ObjectInfo:
        """:meth:`stat` with ``VersionId``.

        Raises:
            as :meth:`stat`.
        """
        return self._stat(key, {"VersionId": version_id})

    def retain_until(self, key: str, version_id: str) -> dt.datetime | None:
        """HeadObject of the version: its ``ObjectLockRetainUntilDate``
        (``Backend.retain_until``; the credential needs ``s3:GetObjectRetention``).

        Raises:
            as :meth:`stat`.
        """
        check_key(key, store=self.name)
        head = self._retry.call(self._op, "head_object", key, Bucket=self.bucket,
                                Key=self._full(key), VersionId=version_id)
        until = head.get("ObjectLockRetainUntilDate")
        return None if until is None else _utc(until)

    def _stat(self, key: str, version: dict[str, str]) -> ObjectInfo:
        check_key(key, store=self.name)
        head = self._retry.call(self._op, "head_object", key, Bucket=self.bucket,
                                Key=self._full(key), ChecksumMode="ENABLED", **version)
        storage_class = head.get("StorageClass") or "STANDARD"
        thaw, expires = _thaw_state(storage_class, head.get("Restore"))
        modified = _utc(head["LastModified"])
        return ObjectInfo(key=key, size=head["ContentLength"], storage_class=storage_class,
                          modified=modified, thaw=thaw, thaw_expires=expires,
                          sha256=_full_object_sha256(head), etag=_etag(head, modified))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """ListObjectsV2 under the store prefix + ``prefix``, in S3's key order (UTF-8 bytes).

        Pages are fetched one by one with the continuation token (what boto3's paginator does)
        so each page request is retried on its own. The listing has no restore information:
        cold objects are reported FROZEN (``stat`` tells THAWING/THAWED). Keys that are not
        valid zbak keys (a console's ``dir/`` marker, ``a//b``) are skipped.

        Raises:
            StoreTransient, StorePermanent (e.g. NoSuchBucket, AccessDenied).
        """
        check_prefix(prefix, store=self.name)
        yield from self._range(prefix)

    def list_outside(self, prefix: str, skip: Collection[str]) -> Iterator[ObjectInfo]:
        """:meth:`list` without the objects under the directories ``skip`` names (key
        prefixes ending in ``/``; ``Backend.list_outside``), whose keys are never requested.

        The directories holding a skipped one are listed by level (``Delimiter="/"``: one
        request per 1,000 entries); what lies between the skipped directories is listed as
        by :meth:`list`, one run of keys (``StartAfter``) per gap that level shows holds
        something. Listing a job's tree outside its 1,000 datasets' directories takes one
        request instead of one per 1,000 objects of the tree
        (docs/decisions.md#catalog-commands-stay-fast-at-100000-streams).

        Raises:
            StoreTransient, StorePermanent (e.g. NoSuchBucket, AccessDenied).
        """
        check_prefix(prefix, store=self.name)
        skipped = frozenset(skip)
        if under_any(prefix, skipped):
            return
        if (prefix and not prefix.endswith("/")) or not any(
                s.startswith(prefix) for s in skipped):
            yield from self._range(prefix, skipped=skipped)
            return
        above = {s[:at + 1] for s in skipped for at, c in enumerate(s) if c == "/"}
        yield from self._walk(prefix, skipped, above)

    def _walk(self, prefix: str, skipped: frozenset[str], above: set[str]
              ) -> Iterator[ObjectInfo]:
        """The objects under directory ``prefix`` outside ``skipped``, in key order: its
        level listed once, then the runs of keys between the subdirectories that are skipped
        (left out) or hold a skipped one (``above``: walked the same way)."""
        files, dirs = self._level(prefix)
        marks = [d for d in dirs if d in above]
        rest = sorted(files + [d for d in dirs if d not in above])
        after = None
        for mark in [*marks, None]:
            low = 0 if after is None else bisect.bisect_right(rest, after)
            high = len(rest) if mark is None else bisect.bisect_left(rest, mark)
            if low < high:
                yield from self._range(prefix, after=after, before=mark, skipped=skipped)
            if mark is None:
                return
            if mark not in skipped:
                yield from self._walk(mark, skipped, above)
            after = mark

    def _level(self, prefix: str) -> tuple[builtins.list[str], builtins.list[str]]:
        """The keys directly under directory ``prefix`` and its subdirectories (each ending
        in ``/``), relative to the store prefix, each list in key order."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix,
                                  "Delimiter": "/"}
        files: list[str] = []
        dirs: list[str] = []
        cut = len(self.prefix)
        while True:
            page = self._retry.call(self._op, "list_objects_v2", None, **params)
            files += [item["Key"][cut:] for item in page.get("Contents", ())]
            dirs += [item["Prefix"][cut:] for item in page.get("CommonPrefixes", ())]
            if not page.get("IsTruncated"):
                return files, dirs
            params["ContinuationToken"] = page["NextContinuationToken"]

    def _range(self, prefix: str, *, after: str | None = None, before: str | None = None,
               skipped: frozenset[str] = frozenset()) -> Iterator[ObjectInfo]:
        """The objects under ``prefix`` in key order, page by page: with ``after`` (a
        directory) only the keys past those under it, up to ``before`` (excluded), and
        none under ``skipped``."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
        if after is not None:
            # Past every key under AFTER: they all sort before AFTER + the last code point.
            params["StartAfter"] = self.prefix + after + "\U0010ffff"
        while True:
            page = self._retry.call(self._op, "list_objects_v2", None, **params)
            for item in page.get("Contents", ()):
                key = item["Key"][len(self.prefix):]
                if before is not None and key >= before:
                    return
                if (after is not None and key.startswith(after)) or (
                        skipped and under_any(key, skipped)):
                    continue
                try:
                    check_key(key, store=self.name)
                except StorePermanent:
                    log.debug("store %s: skipping object %r (not a zbak key)",
                              self.name, item["Key"])
                    continue
                storage_class = item.get("StorageClass") or "STANDARD"
                modified = _utc(item["LastModified"])
                yield ObjectInfo(
                    key=key, size=item["Size"], storage_class=storage_class, modified=modified,
                    thaw=Thaw.FROZEN if storage_class in COLD_CLASSES else Thaw.NOT_NEEDED,
                    etag=_etag(item, modified),
                )
            if not page.get("IsTruncated"):
                return
            params["ContinuationToken"] = page["NextContinuationToken"]

    @property
    def lock_policy(self) -> LockPolicy | None:
        """``lock``."""
        return self.lock

    def lock_version(self, key: str, version_id: str) -> dt.datetime:
        """PutObjectRetention of the version (``Backend.lock_version``).

        Raises:
            StoreTransient, StorePermanent: the call failed, or the store has no
                ``object_lock``.
        """
        if self.lock is None:
            raise self._no_versions(key)
        return self._lock_version(key, version_id)

    @property
    def keeps_versions(self) -> bool:
        """True with ``[stores.NAME.object_lock]`` (``zbak init`` checked the bucket keeps
        versions and locks them)."""
        return self.lock is not None

    def list_versions(self, prefix: str) -> Iterator[Version]:
        """ListObjectVersions under the store prefix + ``prefix``, page by page (KeyMarker,
        VersionIdMarker). S3 answers versions and delete markers in two lists; each page's
        are merged by key, newest first within a key ("Versions are sorted latest first",
        S3 API reference, ListObjectVersions), a key's markers placed by LastModified.
        Keys that are not zbak keys are skipped, as by :meth:`list`.

        Raises:
            StoreTransient, StorePermanent (e.g. AccessDenied without
            s3:ListBucketVersions).
        """
        check_prefix(prefix, store=self.name)
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
        cut = len(self.prefix)
        while True:
            page = self._retry.call(self._op, "list_object_versions", None, **params)
            entries = [(item, False) for item in page.get("Versions", ())]
            entries += [(item, True) for item in page.get("DeleteMarkers", ())]
            # Stable: within a key, versions keep S3's newest-first order; a marker goes by
            # its time, before the versions of the same second (it came later or is latest).
            entries.sort(key=lambda e: (e[0]["Key"], not e[0].get("IsLatest"),
                                        -e[0]["LastModified"].timestamp(), not e[1]))
            for item, marker in entries:
                key = item["Key"][cut:]
                try:
                    check_key(key, store=self.name)
                except StorePermanent:
                    continue
                modified = _utc(item["LastModified"])
                storage_class = item.get("StorageClass") or "STANDARD"
                info = ObjectInfo(
                    key=key, size=0 if marker else item["Size"], storage_class=storage_class,
                    modified=modified,
                    thaw=Thaw.FROZEN if storage_class in COLD_CLASSES else Thaw.NOT_NEEDED,
                    etag=None if marker else _etag(item, modified))
                yield Version(info, item["VersionId"], bool(item.get("IsLatest")), marker)
            if not page.get("IsTruncated"):
                return
            params["KeyMarker"] = page["NextKeyMarker"]
            params["VersionIdMarker"] = page["NextVersionIdMarker"]

    def delete(self, key: str) -> None:
        """DeleteObject; S3 answers 204 whether or not the key existed (idempotent).

        Raises:
            StoreTransient, StorePermanent.
        """
        check_key(key, store=self.name)
        try:
            self._retry.call(self._op, "delete_object", key,
                             Bucket=self.bucket, Key=self._full(key))
        except ObjectNotFound:
            pass

    def delete_version(self, key: str, version_id: str) -> None:
        """DeleteObject with ``VersionId`` (``Backend.delete_version``).

        Raises:
            StoreTransient, StorePermanent (AccessDenied: the version is still locked).
        """
        check_key(key, store=self.name)
        try:
            self._retry.call(self._op, "delete_object", key, Bucket=self.bucket,
                             Key=self._full(key), VersionId=version_id)
        except ObjectNotFound:
            pass

    def request_thaw(self, key: str, *, days: int, tier: str) -> Thaw:
        """RestoreObject for ``days`` days (>= 1) at ``tier`` for a GLACIER or DEEP_ARCHIVE
        object: THAWING for a new request (HTTP 202) or one in progress
        (RestoreAlreadyInProgress, 409), THAWED when a restored copy exists (HTTP 200: S3
        extends its expiry). Other classes need no thaw: NOT_NEEDED, without a RestoreObject.
        DEEP_ARCHIVE has no Expedited tier (S3 answers an error: StorePermanent).

        Raises:
            ObjectNotFound, StoreTransient, StorePermanent (also bad ``days``/``tier``).
        """
        info = self.stat(key)
        if info.storage_class not in COLD_CLASSES:
            return Thaw.NOT_NEEDED
        if tier not in RESTORE_TIERS or days < 1:
            raise StorePermanent(
                f"store {self.name}: thaw of {key!r}: tier must be one of"
                f" {', '.join(RESTORE_TIERS)}"
                f" and days >= 1 (got {tier!r}, {days})", store=self.name, key=key)
        try:
            response = self._retry.call(
                self._op, "restore_object", key, Bucket=self.bucket, Key=self._full(key),
                RestoreRequest={"Days": days, "GlacierJobParameters": {"Tier": tier}},
            )
        except _RestoreInProgress:
            return Thaw.THAWING
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return Thaw.THAWED if status == 200 else Thaw.THAWING

    def unfinished_uploads(self, prefix: str = "", *, sizes: bool = True) -> builtins.list[Unfinished]:
        """The multipart uploads of keys starting with ``prefix`` never completed nor
        aborted (ListMultipartUploads, 1,000 a request): uploads of a process killed
        mid-put, whose parts are billed but never visible. ``sizes``: their parts' bytes
        too (ListParts per upload; an upload gone meanwhile is left out).

        Raises:
            StoreTransient, StorePermanent (AccessDenied without
            s3:ListBucketMultipartUploads, or s3:ListMultipartUploadParts for ``sizes``).
        """
        check_prefix(prefix, store=self.name)
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._full(prefix)}
        found: list[Unfinished] = []
        while True:
            page = self._retry.call(self._op, "list_multipart_uploads", None, **params)
            for upload in page.get("Uploads", ()):
                key, ident = upload["Key"][len(self.prefix):], upload["UploadId"]
                found.append(Unfinished(key, ident, f"multipart upload {ident}", None,
                                        _utc(upload["Initiated"])))
            if not page.get("IsTruncated"):
                break
            params["KeyMarker"] = page["NextKeyMarker"]
            params["UploadIdMarker"] = page["NextUploadIdMarker"]
        if sizes:
            found = [u._replace(size=size) for u in found
                     if (size := self._retry.call(self._parts_size, u.key, u.ident)) is not None]
        return sorted(found)

    def _parts_size(self, key: str, upload_id: str) -> int | None:
        """The bytes of an upload's parts (ListParts, every page); None when the upload no
        longer exists (NoSuchUpload)."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key),
                                  "UploadId": upload_id}
        total: int = 0
        while True:
            page = self._upload_op("list_parts", key, **params)
            if page is None:
                return None
            total += sum(part["Size"] for part in page.get("Parts", ()))
            if not page.get("IsTruncated"):
                return total
            params["PartNumberMarker"] = page["NextPartNumberMarker"]

    def abort_upload(self, upload: Unfinished) -> bool:
        """AbortMultipartUpload of ``upload``; False when it no longer exists (completed or
        aborted by someone else: NoSuchUpload).

        Raises:
            StoreTransient, StorePermanent (AccessDenied without s3:AbortMultipartUpload).
        """
        return bool(self._retry.call(self._abort_if_open, upload.key, upload.ident))

    def _abort_if_open(self, key: str, upload_id: str) -> bool:
        """AbortMultipartUpload; False when the upload no longer exists (NoSuchUpload)."""
        return self._upload_op("abort_multipart_upload", key, Bucket=self.bucket,
                               Key=self._full(key), UploadId=upload_id) is not None

    def _upload_op(self, operation: str, key: str, **params: Any) -> dict[str, Any] | None:
        """``_op`` on a multipart upload, None when it no longer exists (NoSuchUpload:
        completed, or aborted by someone else)."""
        try:
            return self._op(operation, key, **params)
        except _NoSuchUpload:
            return None

    def probe(self) -> str:
        """HeadBucket with this backend's credential: S3 answers 200 when the bucket
        exists and the credential may list it, 404 or 403 otherwise (AWS S3 API reference,
        HeadBucket). On a lock store also GetBucketVersioning (``Status`` ``Enabled``) and
        GetObjectLockConfiguration (``ObjectLockEnabled`` ``Enabled``; a bucket without
        one answers ``ObjectLockConfigurationNotFoundError``). Retried as every call is.

        Raises:
            StoreNotLockable: a lock store whose bucket lacks versioning or Object Lock.
            StorePermanent: no such bucket (check url, endpoint, region), access denied.
            StoreTransient: the endpoint did not answer within the retries.
        """
        self._retry.call(self._op, "head_bucket", None, Bucket=self.bucket)
        if self.lock is None:
            return f"bucket {self.bucket} reachable"
        versioning = self._retry.call(self._op, "get_bucket_versioning", None,
                                      Bucket=self.bucket).get("Status") or "never enabled"
        try:
            found = self._retry.call(self._op, "get_object_lock_configuration", None,
                                     Bucket=self.bucket)["ObjectLockConfiguration"]
            enabled = found.get("ObjectLockEnabled") == "Enabled"
        except _NoLockConfiguration:
            enabled = False
        if versioning != "Enabled" or not enabled:
            raise StoreNotLockable(
                f"store {self.name}: bucket {self.bucket} cannot lock objects (versioning"
                f" {versioning.lower()}, Object Lock {'on' if enabled else 'off'}), which"
                f" [stores.{self.name}.object_lock] needs: use a bucket created with Object"
                " Lock enabled (it turns versioning on)", store=self.name)
        return (f"bucket {self.bucket} reachable, versioned, Object Lock on"
                f" ({self.lock.mode} for {_days(self.lock.period)})")

    def close(self) -> None:
        """Close the client's connection pool when this backend built the client."""
        if self._own_client:
            self._client.close()

    # -- put helpers --------------------------------------------------------------------------

    def _parts(self, chunks: Iterable[bytes], key: str, digest: hashlib._Hash,
               counter: builtins.list[int]) -> Iterator[bytearray]:
        """Cut ``chunks`` into parts of exactly ``part_size`` bytes, the last one shorter
        (possibly empty; ``parts.cut``); hash and count the bytes as they pass, and stop at
        S3's limits (5 TiB, 10,000 parts) before a part beyond them is sent."""

        def counted(total: int) -> None:
            counter[0] = total
            if total > MAX_OBJECT_SIZE:
                raise StorePermanent(
                    f"store {self.name}: object {key!r} exceeds S3's 5 TiB object limit:"
                    " lower the store's volume_size", store=self.name, key=key)
            if total > MAX_PARTS * self.part_size:
                raise StorePermanent(
                    f"store {self.name}: object {key!r} needs more than {MAX_PARTS} parts"
                    f" of {self.part_size} bytes (S3's multipart limit): raise the part"
                    " size or lower the store's volume_size", store=self.name, key=key)

        return cut(chunks, self.part_size, digest, counted)

    def _multipart(self, key: str, storage_class: str, head: builtins.list[bytearray],
                   rest: Iterator[bytearray]) -> dict[str, Any]:
        """Upload ``head`` then ``rest`` as the parts of one multipart upload; return the
        CompleteMultipartUpload answer (its ``VersionId`` on a versioned bucket)."""
        created = self._retry.call(
            self._op, "create_multipart_upload", key, Bucket=self.bucket, Key=self._full(key),
            StorageClass=storage_class, ChecksumAlgorithm="SHA256", **self._object_params,
        )
        upload_id = created["UploadId"]

        def all_parts() -> Iterator[bytearray]:
            while head:
                yield head.pop(0)  # pop: the list must not keep sent parts alive
            yield from rest

        def upload(number: int, part: bytearray) -> dict[str, Any]:
            return self._upload_part(key, upload_id, number, part)

        try:
            done = send_all(all_parts(), upload, concurrency=self.concurrency,
                            thread_name=f"zbak-s3-{self.name}")
            completed: dict[str, Any] = self._retry.call(self._complete, key, upload_id, done)
            return completed
        except BaseException:
            self._abort(key, upload_id)
            raise

    def _complete(self, key: str, upload_id: str,
                  parts: builtins.list[dict[str, Any]]) -> dict[str, Any]:
        """CompleteMultipartUpload, and check its answer: S3 may answer HTTP 200 and still
        fail, with an ``<Error>`` in the body ("a 200 OK response can contain either a
        success or an error", AWS S3 API reference, CompleteMultipartUpload; pgBackRest
        "error in success response of multipart upload"). botocore turns such a body into a
        500 ``ClientError`` for the S3 operations it knows (``_handle_200_error``); this check
        also catches an answer that parsed with an ``Error`` member or without the new
        object's ``ETag``, so no such answer is ever taken for a stored object.

        Raises:
            StoreTransient: the answer carried an error code retrying can fix, or no ETag.
            StorePermanent: the answer carried another error code.
        """
        response = self._op("complete_multipart_upload", key, Bucket=self.bucket,
                            Key=self._full(key), UploadId=upload_id,
                            MultipartUpload={"Parts": parts})
        error = response.get("Error")
        if error or not response.get("ETag"):
            raise self._map_client_error(botocore.exceptions.ClientError(
                cast(Any, {"Error": error or {"Code": "InternalError",
                                    "Message": "the answer names no ETag of the new object"},
                 "ResponseMetadata": response.get("ResponseMetadata", {})}),
                "CompleteMultipartUpload"), "complete_multipart_upload (HTTP 200)", key)
        return response

    def _lock_version(self, key: str, version_id: str | None) -> dt.datetime:
        """Lock version ``version_id`` of ``key`` until now + the lock period
        (PutObjectRetention: one call per version, S3 has no batch form); return the
        retain-until date (aware UTC).

        Raises:
            StoreNotLockable: S3 named no version (the bucket is not versioned).
            StoreTransient, StorePermanent: the call failed (the version stays unlocked).
        """
        assert self.lock is not None
        if version_id is None:
            raise StoreNotLockable(
                f"{self._where(key)}: the bucket returned no version id, so the object cannot"
                " be locked: the bucket needs versioning and Object Lock", store=self.name,
                key=key)
        until = self.lock.retain_until(dt.datetime.now(dt.UTC))
        self._retry.call(self._op, "put_object_retention", key, Bucket=self.bucket,
                         Key=self._full(key), VersionId=version_id,
                         Retention={"Mode": self.lock.mode, "RetainUntilDate": until})
        return until

    def _upload_part(self, key: str, upload_id: str, number: int,
                     data: bytearray) -> dict[str, Any]:
        checksum = _b64sha256(data)
        response = self._retry.call(
            self._op, "upload_part", key, Bucket=self.bucket, Key=self._full(key),
            UploadId=upload_id, PartNumber=number, Body=data,
            ChecksumAlgorithm="SHA256", ChecksumSHA256=checksum,
        )
        return {"PartNumber": number, "ETag": response["ETag"],
                "ChecksumSHA256": response.get("ChecksumSHA256") or checksum}

    def _abort(self, key: str, upload_id: str) -> None:
        try:
            self._retry.call(self._op, "abort_multipart_upload", key, Bucket=self.bucket,
                             Key=self._full(key), UploadId=upload_id)
        except StoreError as exc:
            log.warning(
                "store %s: could not abort the multipart upload %s of %r: %s (its parts are"
                " billed until a lifecycle rule AbortIncompleteMultipartUpload removes them)",
                self.name, upload_id, key, exc)

    # -- get helpers --------------------------------------------------------------------------

    def _stream(self, key: str, response: dict[str, Any], chunk_size: int,
                version: dict[str, str]) -> Iterator[bytes]:
        total = response["ContentLength"]
        etag = response.get("ETag")
        body = response["Body"]
        offset = 0
        failures = 0
        try:
            while True:
                try:
                    chunk = body.read(chunk_size)
                except _STREAM_ERRORS as exc:
                    body.close()
                    if offset >= total:
                        break  # every byte arrived; the error came after the last one
                    failures += 1
                    if failures >= self._retry.attempts:
                        raise StoreTransient(
                            f"store {self.name}: reading {key!r} failed at byte {offset} of"
                            f" {total}: {exc} (gave up after {failures} attempts)",
                            store=self.name, key=key) from exc
                    log.info("store %s: reading %r broke at byte %d of %d (%s); resuming",
                             self.name, key, offset, total, exc)
                    time.sleep(self._retry.backoff(failures))
                    params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key),
                                              "Range": f"bytes={offset}-", **version}
                    if etag:
                        params["IfMatch"] = etag
                    body = self._retry.call(self._op, "get_object", key, **params)["Body"]
                    continue
                except botocore.exceptions.FlexibleChecksumError as exc:
                    # The body did not match the object's stored checksum, found after the
                    # last byte was read: what was yielded is damaged, so no ranged resume.
                    raise StoreReadCorrupt(
                        f"store {self.name}: reading {key!r}: {exc} (the bytes read are"
                        " damaged; read the object again)", store=self.name, key=key) from exc
                except botocore.exceptions.BotoCoreError as exc:
                    raise StorePermanent(f"store {self.name}: reading {key!r}: {exc}",
                                         store=self.name, key=key) from exc
                if not chunk:
                    break
                failures = 0
                offset += len(chunk)
                yield chunk
        finally:
            body.close()
        if offset != total:
            raise StoreTransient(
                f"store {self.name}: reading {key!r} ended at byte {offset} of {total}",
                store=self.name, key=key)

    # -- calls and error mapping --------------------------------------------------------------

    def _full(self, key: str) -> str:
        return self.prefix + key

    def _op(self, operation: str, key: str | None, **params: Any) -> dict[str, Any]:
        """Call client.``operation``(**params); map every botocore error to a StoreError."""
        try:
            answer: dict[str, Any] = getattr(self._client, operation)(**params)
            return answer
        except botocore.exceptions.ClientError as exc:
            raise self._map_client_error(exc, operation, key) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise self._map_botocore_error(exc, operation, key) from exc

    def _where(self, key: str | None) -> str:
        target = f"s3://{self.bucket}/{self._full(key)}" if key is not None else self.url
        return f"store {self.name} ({target})"

    def _map_client_error(self, exc: botocore.exceptions.ClientError, operation: str,
                          key: str | None) -> StoreError:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        detail = f"{operation}: {code or status}: {error.get('Message') or exc}"
        where = self._where(key)
        kw: dict[str, Any] = {"store": self.name, "key": key}
        if code == "NoSuchBucket" or (operation == "head_bucket" and status == 404):
            return StorePermanent(f"{where}: bucket {self.bucket!r} does not exist (check the"
                                  f" store url, endpoint and region) [{detail}]", **kw)
        if key is not None and (code in ("NoSuchKey", "NoSuchVersion", "NotFound", "404") or (
                status == 404 and code != "NoSuchUpload")):
            return ObjectNotFound(f"{where}: no such object", **kw)
        if code == "InvalidObjectState":
            return NeedsThaw(f"{where}: the object is in a cold storage class and not restored:"
                             " request a thaw and read it once it is ready", **kw)
        if code == "NoSuchUpload":
            return _NoSuchUpload(f"{where}: {detail}", **kw)
        if code == "ObjectLockConfigurationNotFoundError":
            return _NoLockConfiguration(f"{where}: {detail}", **kw)
        if code == "RestoreAlreadyInProgress":
            return _RestoreInProgress(f"{where}: a restore is already in progress", **kw)
        if code in _TRANSIENT_CODES or status >= 500 or status == 429:
            return StoreTransient(f"{where}: {detail}", **kw)
        if code in _CREDENTIAL_CODES and operation == "delete_object":
            # Deletes are the pruner's (docs/security.md#prune-on-a-lock-store), and S3
            # answers AccessDenied for a locked version too.
            return StorePermanent(
                f"{where}: access denied [{detail}]: a delete needs s3:DeleteObject, and by"
                " version id s3:DeleteObjectVersion, in the credential of"
                f" [stores.{self.name}] prune_profile (else profile's); S3 also refuses a"
                " version whose Object Lock has not lapsed", **kw)
        if code in _CREDENTIAL_CODES:
            return StorePermanent(
                f"{where}: access denied [{detail}]: check the credentials of the AWS chain"
                " (AWS_* environment, profile, instance role) and the bucket policy", **kw)
        if code == "InvalidStorageClass":
            return StorePermanent(f"{where}: the store does not offer this storage class"
                                  f" [{detail}]", **kw)
        return StorePermanent(f"{where}: {detail}", **kw)

    def _map_botocore_error(self, exc: botocore.exceptions.BotoCoreError, operation: str,
                            key: str | None) -> StoreError:
        where = self._where(key)
        kw: dict[str, Any] = {"store": self.name, "key": key}
        if isinstance(exc, (botocore.exceptions.NoCredentialsError,
                            botocore.exceptions.PartialCredentialsError,
                            botocore.exceptions.CredentialRetrievalError,
                            botocore.exceptions.ProfileNotFound)):
            return StorePermanent(
                f"{where}: {operation}: {exc}: set credentials in the AWS chain (AWS_*"
                " environment, ~/.aws/credentials with the store's profile, instance role)", **kw)
        if (isinstance(exc, botocore.exceptions.SSLError)
                and "CERTIFICATE_VERIFY_FAILED" in str(exc)):
            return StorePermanent(f"{where}: {operation}: TLS certificate not trusted: {exc}", **kw)
        if isinstance(exc, (botocore.exceptions.ConnectionError,
                            botocore.exceptions.HTTPClientError,
                            botocore.exceptions.IncompleteReadError)):
            return StoreTransient(f"{where}: {operation}: {exc}", **kw)
        return StorePermanent(f"{where}: {operation}: {exc}", **kw)


def _b64sha256(data: bytes | bytearray) -> str:
    """The SHA-256 of ``data`` as S3's ``x-amz-checksum-sha256`` wants it (base64)."""
    return base64.b64encode(hashlib.sha256(data).digest()).decode("ascii")


def _etag(answer: Mapping[str, Any], modified: dt.datetime) -> str | None:
    """``ETAG@LASTMODIFIED`` of a HEAD answer or listing entry (``ObjectInfo.etag``), None
    when S3 sent no ETag."""
    etag = answer.get("ETag")
    return None if not etag else f"{etag.strip(chr(34))}@{modified.isoformat()}"


def _full_object_sha256(head: dict[str, Any]) -> str | None:
    """The whole object's SHA-256 (hex) from a HeadObject answer or a CopyObjectResult, or
    None when S3 keeps none or only a composite one (a multipart upload's checksum of part
    checksums).

    A multipart object is told by its ETag's ``-N`` part-count suffix as well as by the
    checksum's own ``-N`` and ``ChecksumType``: moto 5 answers the composite SHA-256 bare,
    without either mark."""
    value = head.get("ChecksumSHA256")
    multipart = "-" in (head.get("ETag") or "").strip('"')
    if (not value or multipart or "-" in value
            or head.get("ChecksumType") == "COMPOSITE"):
        return None
    try:
        digest = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return digest.hex() if len(digest) == 32 else None


def _days(period: dt.timedelta) -> str:
    """A lock period as a probe line says it: ``30d``, or ``36h``, ``90s`` when not whole
    days."""
    seconds = int(period.total_seconds())
    if seconds % 86400 == 0:
        return f"{seconds // 86400}d"
    return f"{seconds // 3600}h" if seconds % 3600 == 0 else f"{seconds}s"


def _utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC)


def _thaw_state(storage_class: str, restore: str | None) -> tuple[Thaw, dt.datetime | None]:
    """Map a class and an ``x-amz-restore`` header value (AWS S3 API reference, HeadObject,
    "x-amz-restore") to a thaw state and the expiry of the restored copy (aware UTC)."""
    if storage_class not in COLD_CLASSES:
        return Thaw.NOT_NEEDED, None
    match = _RESTORE_RE.search(restore or "")
    if not match:
        return Thaw.FROZEN, None
    if match["ongoing"] == "true":
        return Thaw.THAWING, None
    expires = None
    if match["expiry"]:
        try:
            expires = _utc(email.utils.parsedate_to_datetime(match["expiry"]))
        except (TypeError, ValueError):
            expires = None
    return Thaw.THAWED, expires
