"""Injectable UTC clock: no naive datetimes anywhere in zbak
(docs/style.md#utc-everywhere-and-order-by-createtxg)."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

UTC = dt.UTC


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


class MonotonicClock:
    """A clock whose readings strictly increase, even when the wall clock steps back (NTP,
    a wrong RTC): each ``now()`` is at least one microsecond after the previous one and
    after ``floor`` (borg ``manifest.write``; docs/reliability.md#r32-clock-goes-backwards).
    Timestamps it gives are for records (catalog rows, runs); ORDER still comes from createtxg/guid
    (docs/style.md#utc-everywhere-and-order-by-createtxg).

    Args:
        base: the clock to follow while it moves forward.
        floor: an instant every reading must follow (e.g. the newest timestamp the catalog
            already holds), aware; None: no floor.
    """

    TICK = dt.timedelta(microseconds=1)

    def __init__(self, base: Clock, floor: dt.datetime | None = None):
        if floor is not None and floor.tzinfo is None:
            raise ValueError("MonotonicClock needs an aware floor")
        self.base = base
        self._last = floor.astimezone(UTC) if floor is not None else None

    def now(self) -> dt.datetime:
        """Return ``base.now()``, or the previous reading plus one microsecond when that is
        not later (aware UTC)."""
        now = self.base.now().astimezone(UTC)
        if self._last is not None and now <= self._last:
            now = self._last + self.TICK
        self._last = now
        return now

    def raise_floor(self, floor: dt.datetime | None) -> None:
        """Make every later reading follow ``floor`` too (aware; None changes nothing)."""
        if floor is not None and (self._last is None or floor > self._last):
            self._last = floor.astimezone(UTC)


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
