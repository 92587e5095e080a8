"""Injectable UTC clock: no naive datetimes anywhere in zbak (house rule 8)."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

UTC = dt.timezone.utc


class Clock(Protocol):
    """Something that tells the current time as an aware UTC datetime."""

    def now(self) -> dt.datetime:
        """Return the current time, timezone-aware, in UTC."""
        ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> dt.datetime:
        """Return ``datetime.now(UTC)``."""
        return dt.datetime.now(UTC)


class FixedClock:
    """A clock for tests that returns a settable instant and can step."""

    def __init__(self, at: dt.datetime):
        if at.tzinfo is None:
            raise ValueError("FixedClock needs an aware datetime")
        self.at = at.astimezone(UTC)

    def now(self) -> dt.datetime:
        """Return the current fake instant (UTC)."""
        return self.at

    def advance(self, delta: dt.timedelta) -> None:
        """Move the fake instant by ``delta`` (may be negative: a clock stepping back)."""
        self.at = self.at + delta


def from_epoch(seconds: int | float) -> dt.datetime:
    """Convert Unix epoch seconds (as ``zfs get -Hp creation`` prints) to aware UTC."""
    return dt.datetime.fromtimestamp(seconds, UTC)


def ensure_utc(value: dt.datetime) -> dt.datetime:
    """Return ``value`` as aware UTC; a naive value is taken to be UTC already.

    Naive values only arrive from SQLite, which drops the offset; zbak always writes UTC.
    """
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
