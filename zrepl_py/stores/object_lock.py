"""The rolling S3 Object Lock of a store (``[stores.NAME.object_lock]``): which mode, and
how long each object version zbak writes stays locked (docs/design.md#object-lock).

Pure: the S3 backend (``stores.s3``) applies it with PutObjectRetention after every upload.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Literal

LockMode = Literal["COMPLIANCE", "GOVERNANCE"]
"""S3's retention modes (AWS S3 API reference, PutObjectRetention, ``Retention.Mode``): a
COMPLIANCE lock cannot be shortened or removed by anyone before it lapses; a GOVERNANCE lock
by a user with ``s3:BypassGovernanceRetention`` only."""


@dataclasses.dataclass(frozen=True)
class LockPolicy:
    """How a store locks what it writes.

    Attributes:
        mode: the retention mode of every lock.
        period: how long a version stays locked after it is written (or its lock extended),
            a positive timedelta.
    """

    mode: LockMode
    period: dt.timedelta

    def due(self, retain_until: dt.datetime, now: dt.datetime) -> bool:
        """Whether a lock until ``retain_until`` is extended at ``now`` (both aware UTC): once
        less than half the period is left (docs/design.md#immutable-cold-storage), so a
        daily archive or audit extends each lock about once per half period."""
        return retain_until - now < self.period / 2

    def retain_until(self, now: dt.datetime) -> dt.datetime:
        """The retain-until date of a lock set at ``now`` (aware UTC): ``now + period``,
        whole seconds (S3 keeps the date to the second), rounded up so the lock never
        ends before the period is over."""
        until = now + self.period
        return until.replace(microsecond=0) + dt.timedelta(seconds=bool(until.microsecond))
