"""``[jobs.NAME.archive]``: the chain policy and the retention of one job's archive."""

from __future__ import annotations

import datetime as dt
from typing import cast

from pydantic import Field

from zrepl_py.stores.settings import S3_STORAGE_CLASSES, StorageClass, StorageClasses
from zrepl_py.values.fields import ByteSize, CronSchedule, Duration, Table

# Minimum storage duration per S3 storage class: an object deleted (or overwritten) earlier
# is billed as if stored that long ("early delete fee"). AWS S3 user guide, "Comparing the
# Amazon S3 storage classes" (docs.aws.amazon.com/AmazonS3/latest/userguide/
# storage-class-intro.html#sc-compare) and https://aws.amazon.com/s3/pricing/: STANDARD_IA
# and ONEZONE_IA 30 days, GLACIER_IR and GLACIER (Flexible Retrieval) 90 days, DEEP_ARCHIVE
# 180 days; STANDARD none; INTELLIGENT_TIERING none since AWS dropped its 30-day minimum in
# September 2021 ("Amazon S3 Intelligent-Tiering ... no minimum storage duration", AWS What's
# New, 2021-09-02). Override per class under [jobs.NAME.archive] min_storage_duration.
DEFAULT_MIN_STORAGE_DURATION: dict[str, dt.timedelta] = {
    "STANDARD": dt.timedelta(0),
    "STANDARD_IA": dt.timedelta(days=30),
    "ONEZONE_IA": dt.timedelta(days=30),
    "INTELLIGENT_TIERING": dt.timedelta(0),
    "GLACIER_IR": dt.timedelta(days=90),
    "GLACIER": dt.timedelta(days=90),
    "DEEP_ARCHIVE": dt.timedelta(days=180),
}


class ChainRetentionConfig(Table):
    """The retention of a job's chains in one store: ``[jobs.NAME.archive]``'s keys, and
    ``[jobs.NAME.copy.STORE] retention`` (docs/copies.md#retention-per-store).

    Retention (``zbak prune``, ``zrepl_py.pruning.chain_plan``) deletes whole chains only:
    the ``keep_chains`` newest chains are kept; with ``max_age``, a chain whose newest stream
    is older than that is no longer protected by ``keep_chains``; a chain is deleted only when
    a newer, undamaged full verified within ``reverify_after`` exists (its objects are
    checked against the catalog again right before the first delete), and (unless
    ``--accept-early-delete-fee``) only when none of its streams is younger than its class's
    ``min_storage_duration``.
    """

    keep_chains: int = Field(2, ge=1)
    max_age: Duration | None = None
    """A chain whose newest stream is older than this may be deleted even within
    ``keep_chains`` (never the newest verified chain); None: age deletes nothing."""
    min_storage_duration: dict[StorageClass, Duration] = {}
    """Overrides of DEFAULT_MIN_STORAGE_DURATION per storage class, e.g. ``{ GLACIER = "90d" }``."""
    reverify_after: Duration = Field(dt.timedelta(days=30), gt=dt.timedelta(0))
    """How long a stream's ``verified`` mark (``zbak audit --deep``) lets its chain release
    older chains; after that the chain releases nothing until re-verified: bytes verified
    once can rot later (docs/design.md#catalog-and-chain-validity)."""

    def min_storage(self, storage_class: str) -> dt.timedelta:
        """The minimum storage duration of ``storage_class``: the override, else S3's
        default, else zero for a class S3 does not name (``file://`` reports STANDARD)."""
        overrides = cast("dict[str, dt.timedelta]", self.min_storage_duration)  # str keys
        found = overrides.get(storage_class)
        if found is not None:
            return found
        return DEFAULT_MIN_STORAGE_DURATION.get(storage_class, dt.timedelta(0))

    def min_storage_durations(self) -> dict[str, dt.timedelta]:
        """Every known class's minimum storage duration, overrides applied."""
        return {cls: self.min_storage(cls) for cls in S3_STORAGE_CLASSES}


class ArchiveConfig(ChainRetentionConfig):
    """``[jobs.NAME.archive]``: the chain policy of one job's archive store and its retention
    there (``ChainRetentionConfig``'s keys)."""

    store: str
    schedule: CronSchedule | None = "30 2 * * *"
    full_every: Duration = dt.timedelta(days=30)
    max_chain_length: int = Field(30, ge=1)
    max_chain_bytes: ByteSize | None = None
    storage_class: StorageClasses | None = None
    """Overrides the store's classes for this job."""
    compression_level: int = Field(3, ge=1, le=22)
