"""``s3://BUCKET[/PREFIX]``: a store in an S3 bucket (AWS, MinIO, Ceph RGW, ...), through boto3
(``zbak[s3]``; the backend is ``zrepl_py.stores.s3``).

Its own keys: ``endpoint``, ``region``, ``profile``, ``prune_profile``, ``encryption``,
``object_lock``.
Credentials come only from the standard AWS chain; no key is ever in the config.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Literal

from pydantic import field_validator, model_validator

from zrepl_py.errors import StorePermanent
from zrepl_py.runtime.extras import Extra
from zrepl_py.stores.base import Backend
from zrepl_py.stores.object_lock import LockPolicy
from zrepl_py.stores.scheme import Scheme, StoreEnv
from zrepl_py.stores.settings import StoreConfig
from zrepl_py.values.fields import Duration, Table

MiB = 1 << 20
_URL = re.compile(r"s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>.*))?")
"""A bucket name as S3 allows it (3-63 of lower-case letters, digits, dots and hyphens,
starting and ending with a letter or digit; AWS S3 user guide, "Bucket naming rules"), then
an optional key prefix (checked as a key when the store is opened, ``stores.keys``)."""


class StoreEncryption(Table):
    """Server-side encryption S3 applies to every object zbak writes (never a key in the
    config): ``sse = "AES256"`` (SSE-S3, S3-managed keys) or ``"aws:kms"`` (SSE-KMS, with
    ``kms_key_id``, a KMS key id, ARN or alias; without it, the account's ``aws/s3`` key).
    It protects the bucket's disks, not the data from whoever may read the bucket: that is
    sealed cold storage (``[stores.NAME.age]``, docs/sealed.md)."""

    sse: Literal["AES256", "aws:kms"] = "AES256"
    kms_key_id: str | None = None

    @model_validator(mode="after")
    def _key_needs_kms(self) -> StoreEncryption:
        if self.kms_key_id is not None and self.sse != "aws:kms":
            raise ValueError(f'kms_key_id needs sse = "aws:kms" (sse is {self.sse!r})')
        return self

    def request_params(self) -> dict[str, str]:
        """The parameters of every request that creates an object (PutObject,
        CreateMultipartUpload, CopyObject): ``ServerSideEncryption`` and ``SSEKMSKeyId``
        (AWS S3 API reference, PutObject "Request Syntax")."""
        params: dict[str, str] = {"ServerSideEncryption": self.sse}
        if self.kms_key_id is not None:
            params["SSEKMSKeyId"] = self.kms_key_id
        return params


class ObjectLockSettings(Table):
    """``[stores.NAME.object_lock]``: every object version zbak writes to the store is locked
    for ``period`` (S3 Object Lock; docs/design.md#object-lock). The bucket must
    have versioning and Object Lock (``zbak init`` checks).

    Attributes:
        mode: ``"compliance"`` (nobody can shorten or remove a lock) or ``"governance"``
            (a user with ``s3:BypassGovernanceRetention`` can).
        period: how long each version stays locked after it is written, e.g. ``"30d"``.
    """

    mode: Literal["compliance", "governance"]
    period: Duration

    @field_validator("period")
    @classmethod
    def _positive(cls, value: dt.timedelta) -> dt.timedelta:
        if value < dt.timedelta(seconds=1):
            raise ValueError("a lock period must be at least 1s")
        return value

    def policy(self) -> LockPolicy:
        """The policy the backend applies (the mode as S3 spells it)."""
        return LockPolicy(mode="COMPLIANCE" if self.mode == "compliance" else "GOVERNANCE",
                          period=self.period)


class S3StoreConfig(StoreConfig):
    """``[stores.NAME]`` with ``url = "s3://BUCKET[/PREFIX]"``."""

    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    """AWS profile name from the standard credential chain; keys are never in this file."""
    prune_profile: str | None = None
    """AWS profile whose credential makes every delete of this store (chain pruning, clean-up
    of partial uploads), so ``profile`` may be a writer without ``s3:DeleteObject``
    (docs/reliability.md#r42-least-privilege-s3-credentials). None: ``profile`` deletes
    too."""
    encryption: StoreEncryption | None = None
    object_lock: ObjectLockSettings | None = None
    """Rolling S3 Object Lock of every version written; None: nothing is locked."""

    @property
    def keeps_progress_locally(self) -> bool:
        """A sealed store's upload progress, and a lock store's, lives in the state
        directory: on a lock store no key is written twice
        (docs/design.md#object-lock)."""
        return self.age is not None or self.object_lock is not None

    @classmethod
    def check_url(cls, url: str) -> None:
        """Raises ValueError unless ``url`` is ``s3://`` and a valid bucket name, then
        optionally ``/`` and a prefix."""
        _bucket_and_prefix(url)

    @property
    def bucket(self) -> str:
        """The bucket: the URL's host part."""
        return _bucket_and_prefix(self.url)[0]

    @property
    def prefix(self) -> str:
        """The key prefix: the URL's path without its leading ``/`` (``""`` for the whole
        bucket)."""
        return _bucket_and_prefix(self.url)[1]


def inside_s3_refusal(source: S3StoreConfig, target: S3StoreConfig) -> str | None:
    """Why ``zbak copy`` cannot copy the volumes of store ``source`` into store ``target``
    inside S3 (CopyObject: docs/copies.md#s3-to-s3-inside-s3), one clause, or None when it
    can: both stores must be on one endpoint, in one region, reached with one credentials
    profile (a CopyObject is signed once, by the target's credential, which must read the
    source)."""
    for key in ("endpoint", "region", "profile"):
        mine, theirs = getattr(source, key), getattr(target, key)
        if mine != theirs:
            return f"their {key}s differ ({mine or 'the default'} and {theirs or 'the default'})"
    return None


def _bucket_and_prefix(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of an ``s3://`` URL: the one place it is parsed.

    Raises:
        ValueError: not ``s3://BUCKET[/PREFIX]`` with a valid bucket name.
    """
    match = _URL.fullmatch(url)
    if match is None:
        raise ValueError(f"expected {SCHEME.form!r}")
    return match["bucket"], match["prefix"] or ""


def _open(name: str, settings: S3StoreConfig, env: StoreEnv) -> Backend:
    """An ``S3Backend`` with the settings' endpoint, region, profile, upload concurrency,
    server-side encryption (``encryption``, sent with every object it writes) and Object Lock
    (``object_lock``, set on every object it writes);
    its part size is 8 MiB, or more when ``volume_size`` needs it to fit in S3's 10,000
    parts (rounded up to whole MiB). With ``prune_profile``, a ``PruneCredentialBackend``
    whose deletes use that profile's credential and everything else ``profile``'s.

    Raises:
        StorePermanent: a volume size beyond S3's 5 TiB object limit, an unknown AWS profile.
    """
    from zrepl_py.stores import s3
    from zrepl_py.stores.prune_credential import PruneCredentialBackend

    if settings.volume_size > s3.MAX_OBJECT_SIZE:
        raise StorePermanent(
            f"store {name}: volume_size {settings.volume_size} bytes exceeds S3's 5 TiB object"
            " limit", store=name)
    needed = math.ceil(settings.volume_size / s3.MAX_PARTS / MiB) * MiB
    part_size = min(s3.MAX_PART_SIZE, max(s3.DEFAULT_PART_SIZE, needed))

    def backend(profile: str | None, concurrency: int) -> s3.S3Backend:
        return s3.S3Backend(
            name, settings.bucket, settings.prefix, endpoint_url=settings.endpoint,
            region=settings.region, profile=profile, part_size=part_size,
            concurrency=concurrency, retry=env.retry,
            object_params=settings.encryption.request_params() if settings.encryption else None,
            lock=settings.object_lock.policy() if settings.object_lock else None,
        )

    writer = backend(settings.profile, settings.upload_concurrency)
    if settings.prune_profile is None:
        return writer
    return PruneCredentialBackend(writer, backend(settings.prune_profile, 1))


SCHEME = Scheme(name="s3", form="s3://bucket[/prefix]", settings=S3StoreConfig,
                extra=Extra("s3", "boto3"), open=_open)
