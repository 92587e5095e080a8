"""Retention arithmetic: which items a ``Retention`` policy keeps, and why (PURE).

Semantics (docs/design.md#snapshots, docs/reliability.md#r31-dst and
docs/reliability.md#r32-clock-goes-backwards):

- Items are ranked newest-first by ``createtxg``, never by ``created`` or by name: a clock
  that stepped back gives a newer snapshot an older time, and it is still the newest.
- ``keep_last=N`` keeps the N newest items.
- A period count N (``hourly``, ``daily``, ``weekly``, ``monthly``, ``yearly``) walks the
  items newest-first, puts each in a bucket by its ``created`` time, and keeps the first
  (newest) item of each distinct bucket until N buckets have one kept. Buckets with no item
  do not count, so N buckets may span more than N periods (restic/sanoid style).
- Hourly buckets are UTC hours: the local hour repeated at the end of DST is two buckets.
  Daily, weekly (ISO 8601 week), monthly and yearly buckets follow the calendar of
  ``policy.timezone``, so a day is a local day even when it has 23 or 25 hours.
- ``keep_within=D`` keeps every item with ``created >= now - D``; an item created in the
  future (the clock went backwards since) counts as within.
- A count of 0 (or ``keep_within=None``) keeps nothing by that rule.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import zoneinfo
from collections.abc import Callable, Hashable, Sequence

from zrepl_py.clock import UTC
from zrepl_py.config.retention import Retention


@dataclasses.dataclass(frozen=True)
class Dated:
    """One thing retention can keep: a snapshot, usually.

    Attributes:
        key: identifies the item in the result (e.g. the snapshot name); unique per call.
        createtxg: the ZFS transaction group it was created in; decides order (higher = newer).
        created: aware creation time; decides the bucket only. Converted to UTC.

    Raises:
        ValueError: ``created`` is naive.
    """

    key: Hashable
    createtxg: int
    created: dt.datetime

    def __post_init__(self) -> None:
        if self.created.tzinfo is None or self.created.utcoffset() is None:
            raise ValueError(f"{self.key!r}: created time is naive")
        object.__setattr__(self, "created", self.created.astimezone(UTC))


def _hour(at: dt.datetime, _tz: zoneinfo.ZoneInfo) -> str:
    return f"{at:%Y-%m-%dT%H}Z"


def _day(at: dt.datetime, tz: zoneinfo.ZoneInfo) -> str:
    return at.astimezone(tz).date().isoformat()


def _week(at: dt.datetime, tz: zoneinfo.ZoneInfo) -> str:
    # ISO year, not calendar year: 2027-01-01 belongs to 2026-W53.
    iso = at.astimezone(tz).isocalendar()
    return f"{iso.year:04d}-W{iso.week:02d}"


def _month(at: dt.datetime, tz: zoneinfo.ZoneInfo) -> str:
    return f"{at.astimezone(tz):%Y-%m}"


def _year(at: dt.datetime, tz: zoneinfo.ZoneInfo) -> str:
    return f"{at.astimezone(tz).year:04d}"


_PERIODS: tuple[tuple[str, Callable[[dt.datetime, zoneinfo.ZoneInfo], str]], ...] = (
    ("hourly", _hour),
    ("daily", _day),
    ("weekly", _week),
    ("monthly", _month),
    ("yearly", _year),
)
"""Period rules in the order their reasons are listed."""


def rank_newest_first(items: Sequence[Dated]) -> list[Dated]:
    """Return ``items`` sorted by ``createtxg``, highest (newest) first.

    Raises:
        ValueError: two items share a key or a createtxg (ZFS gives each snapshot of a
            dataset its own txg, so a tie means the input mixes datasets or is corrupt).
    """
    keys: set[Hashable] = set()
    txgs: set[int] = set()
    for item in items:
        if item.key in keys:
            raise ValueError(f"duplicate key {item.key!r}")
        if item.createtxg in txgs:
            raise ValueError(f"{item.key!r}: createtxg {item.createtxg} is not unique")
        keys.add(item.key)
        txgs.add(item.createtxg)
    return sorted(items, key=lambda i: i.createtxg, reverse=True)


def select_retained(
    items: Sequence[Dated], policy: Retention, now: dt.datetime
) -> dict[Hashable, list[str]]:
    """Apply ``policy`` to ``items`` and say why each kept item is kept.

    Args:
        items: the candidates, in any order (see the module doc for the rules).
        policy: counts per rule and the IANA time zone for daily and longer buckets.
        now: aware current time; only ``keep_within`` uses it.

    Returns:
        ``{key: reasons}`` for kept items only, newest first; reasons are in rule order
        (keep_last, keep_within, hourly .. yearly), e.g. ``["keep_last (1 of 3)",
        "hourly 2026-10-25T01Z (1 of 24)", "daily 2026-10-25 (1 of 7)"]``. An item not in
        the result is not kept by retention.

    Raises:
        ValueError: ``now`` is naive, or keys/createtxgs are not unique (see
            ``rank_newest_first``).
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now is naive; pass an aware datetime")
    ranked = rank_newest_first(items)
    tz = zoneinfo.ZoneInfo(policy.timezone)
    reasons: dict[Hashable, list[str]] = {item.key: [] for item in ranked}

    for n, item in enumerate(ranked[: policy.keep_last], start=1):
        reasons[item.key].append(f"keep_last ({n} of {policy.keep_last})")

    if policy.keep_within is not None:
        since = now - policy.keep_within
        for item in ranked:
            if item.created > now:
                reasons[item.key].append(
                    f"keep_within {policy.keep_within} (created {item.created:%Y-%m-%dT%H:%M:%SZ},"
                    f" after now)"
                )
            elif item.created >= since:
                reasons[item.key].append(f"keep_within {policy.keep_within}")

    for rule, bucket_of in _PERIODS:
        count: int = getattr(policy, rule)
        seen: set[str] = set()
        for item in ranked:
            if len(seen) >= count:
                break
            bucket = bucket_of(item.created, tz)
            if bucket not in seen:
                seen.add(bucket)
                reasons[item.key].append(f"{rule} {bucket} ({len(seen)} of {count})")

    return {key: why for key, why in reasons.items() if why}
