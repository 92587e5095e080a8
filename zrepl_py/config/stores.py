"""``[stores.NAME]``: where archived streams are stored (``s3://`` or ``file://``)."""

from __future__ import annotations

import re
from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from zrepl_py.values.fields import ByteSize, Table

StorageClass = Literal[
    "STANDARD",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER_IR",
    "GLACIER",
    "DEEP_ARCHIVE",
]
S3_STORAGE_CLASSES: tuple[StorageClass, ...] = get_args(StorageClass)


class StorageClasses(Table):
    """Storage class per stream kind; manifests are always STANDARD (restorable metadata)."""

    full: StorageClass = "STANDARD"
    incremental: StorageClass = "STANDARD"


class StoreEncryption(Table):
    """Server-side encryption options passed to S3 (never a key in the config)."""

    sse: Literal["AES256", "aws:kms"] = "AES256"
    kms_key_id: str | None = None


class StoreConfig(Table):
    """``[stores.NAME]``: an object store (``s3://bucket/prefix``) or a directory (``file:///dir``)."""

    url: str
    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    """AWS profile name from the standard credential chain; keys are never in this file."""
    prune_profile: str | None = None
    """AWS profile whose credential makes every delete of this store (chain pruning, clean-up
    of partial uploads), so ``profile`` may be a writer without ``s3:DeleteObject``
    (docs/reliability.md#r42-least-privilege-s3-credentials). None: ``profile`` deletes too. S3 stores only."""
    storage_class: StorageClasses = StorageClasses()
    volume_size: ByteSize = 1024**3
    """Bytes per stored volume object; 1 GiB keeps any stream far inside S3 limits."""
    upload_concurrency: int = Field(4, ge=1, le=64)
    encryption: StoreEncryption | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value.startswith("file:///"):
            return value
        if re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", value):
            return value
        raise ValueError("expected 's3://bucket[/prefix]' or 'file:///absolute/dir'")

    @model_validator(mode="after")
    def _prune_profile(self) -> StoreConfig:
        if self.prune_profile is not None and not self.url.startswith("s3://"):
            raise ValueError("prune_profile applies to s3:// stores only")
        return self
