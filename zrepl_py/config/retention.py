"""Retention of zbak's own snapshots: counts per period (sources and replication targets)."""

from __future__ import annotations

import zoneinfo

from pydantic import Field, field_validator

from zrepl_py.values.fields import Duration, Table


class Retention(Table):
    """Count-per-period retention (sanoid/restic style); applies to zbak's own snapshots only.

    Each count keeps the newest snapshot of that many most recent periods that have one.
    Hourly buckets are UTC hours; daily and longer ones follow ``timezone``'s calendar.
    """

    keep_last: int = Field(0, ge=0)
    keep_within: Duration | None = None
    hourly: int = Field(0, ge=0)
    daily: int = Field(0, ge=0)
    weekly: int = Field(0, ge=0)
    monthly: int = Field(0, ge=0)
    yearly: int = Field(0, ge=0)
    timezone: str = "UTC"

    @field_validator("timezone")
    @classmethod
    def _tz(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r} (use an IANA name like 'Europe/Vienna')"
                             ) from None
        return value


DEFAULT_SNAPSHOT_RETENTION = Retention(keep_last=3, hourly=24, daily=14, weekly=8, monthly=12)
