"""Retention arithmetic (``select_retained``), including DST (docs/reliability.md#r31-dst) and clock
steps (docs/reliability.md#r32-clock-goes-backwards)."""

from __future__ import annotations

import datetime as dt
import itertools
import zoneinfo
from pathlib import Path

import pytest

from zrepl_py.clock import UTC, FixedClock
from zrepl_py.config.retention import Retention
from zrepl_py.pruning.rules import Dated, rank_newest_first, select_retained
from zrepl_py.snapshots.naming import format_short_name, parse_short_name

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "golden" / "dst_vienna_retention.txt"
NOW = dt.datetime(2026, 3, 5, 12, 0, tzinfo=UTC)
DAY = dt.timedelta(days=1)


def at(text: str) -> dt.datetime:
    """``"2026-03-02T10:05"`` (UTC) -> aware datetime."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def items(*times: str) -> list[Dated]:
    """Items ``s1, s2, ...`` with createtxg 1, 2, ... in the order given (later = newer)."""
    return [Dated(f"s{n}", n, at(t)) for n, t in enumerate(times, start=1)]


CASES = [
    # (id, items, policy, now, expected {key: reasons})
    ("an empty list keeps nothing", [], Retention(keep_last=3, hourly=3), NOW, {}),
    ("an all-zero policy keeps nothing",
     items("2026-03-02T10:00", "2026-03-02T11:00"), Retention(), NOW, {}),
    # keep_last
    ("keep_last keeps the N newest",
     items("2026-03-02T10:00", "2026-03-02T11:00", "2026-03-02T12:00", "2026-03-02T13:00"),
     Retention(keep_last=2), NOW,
     {"s4": ["keep_last (1 of 2)"], "s3": ["keep_last (2 of 2)"]}),
    ("keep_last larger than the list keeps everything",
     items("2026-03-02T10:00", "2026-03-02T11:00"), Retention(keep_last=10), NOW,
     {"s2": ["keep_last (1 of 10)"], "s1": ["keep_last (2 of 10)"]}),
    # hourly
    ("hourly keeps the newest of each of the N newest UTC hours",
     items("2026-03-02T10:05", "2026-03-02T10:40", "2026-03-02T11:10", "2026-03-02T12:59",
           "2026-03-02T13:00"),
     Retention(hourly=3), NOW,
     {"s5": ["hourly 2026-03-02T13Z (1 of 3)"], "s4": ["hourly 2026-03-02T12Z (2 of 3)"],
      "s3": ["hourly 2026-03-02T11Z (3 of 3)"]}),
    ("hourly counts only hours that have a snapshot",
     items("2026-03-02T08:00", "2026-03-02T12:00"), Retention(hourly=2), NOW,
     {"s2": ["hourly 2026-03-02T12Z (1 of 2)"], "s1": ["hourly 2026-03-02T08Z (2 of 2)"]}),
    ("hourly buckets are UTC hours even in a half-hour-offset zone",
     items("2026-03-02T10:10", "2026-03-02T10:50"), Retention(hourly=2, timezone="Asia/Kolkata"),
     NOW, {"s2": ["hourly 2026-03-02T10Z (1 of 2)"]}),
    ("the local hour repeated at the end of DST is two hourly buckets",
     items("2026-10-25T00:30", "2026-10-25T01:30"), Retention(hourly=2, timezone="Europe/Vienna"),
     NOW, {"s2": ["hourly 2026-10-25T01Z (1 of 2)"], "s1": ["hourly 2026-10-25T00Z (2 of 2)"]}),
    # daily
    ("daily buckets follow the policy's local calendar",
     items("2026-03-02T12:00", "2026-03-02T22:30", "2026-03-02T23:30"),
     Retention(daily=2, timezone="Europe/Vienna"), NOW,
     {"s3": ["daily 2026-03-03 (1 of 2)"], "s2": ["daily 2026-03-02 (2 of 2)"]}),
    ("daily buckets are UTC days by default",
     items("2026-03-02T12:00", "2026-03-02T22:30", "2026-03-02T23:30"), Retention(daily=2), NOW,
     {"s3": ["daily 2026-03-02 (1 of 2)"]}),
    ("the 25-hour day at the end of DST is one daily bucket",
     items("2026-10-24T21:30", "2026-10-24T22:30", "2026-10-25T22:30"),
     Retention(daily=2, timezone="Europe/Vienna"), NOW,
     {"s3": ["daily 2026-10-25 (1 of 2)"], "s1": ["daily 2026-10-24 (2 of 2)"]}),
    # weekly
    ("weekly buckets are local ISO weeks, whose year can differ from the calendar year",
     items("2026-12-30T12:00", "2027-01-03T12:00", "2027-01-03T23:30"),
     Retention(weekly=2, timezone="Europe/Vienna"), NOW,
     {"s3": ["weekly 2027-W01 (1 of 2)"], "s2": ["weekly 2026-W53 (2 of 2)"]}),
    # monthly
    ("monthly buckets follow the local calendar",
     items("2026-09-15T12:00", "2026-10-31T12:00", "2026-10-31T23:30"),
     Retention(monthly=2, timezone="Europe/Vienna"), NOW,
     {"s3": ["monthly 2026-11 (1 of 2)"], "s2": ["monthly 2026-10 (2 of 2)"]}),
    # yearly
    ("yearly buckets follow the local calendar",
     items("2025-06-01T12:00", "2026-06-01T12:00", "2026-12-31T23:30"),
     Retention(yearly=2, timezone="Europe/Vienna"), NOW,
     {"s3": ["yearly 2027 (1 of 2)"], "s2": ["yearly 2026 (2 of 2)"]}),
    # combined
    ("combined rules list every reason in rule order",
     items("2026-03-01T12:00", "2026-03-02T10:00", "2026-03-02T10:30", "2026-03-02T11:15"),
     Retention(keep_last=1, hourly=2, daily=2, weekly=1, monthly=1, yearly=1), NOW,
     {"s4": ["keep_last (1 of 1)", "hourly 2026-03-02T11Z (1 of 2)", "daily 2026-03-02 (1 of 2)",
             "weekly 2026-W10 (1 of 1)", "monthly 2026-03 (1 of 1)", "yearly 2026 (1 of 1)"],
      "s3": ["hourly 2026-03-02T10Z (2 of 2)"],
      "s1": ["daily 2026-03-01 (2 of 2)"]}),
    # keep_within
    ("keep_within keeps everything created at or after now minus the duration",
     items("2026-03-04T11:59:59", "2026-03-04T12:00", "2026-03-05T11:00"),
     Retention(keep_within=DAY), NOW,
     {"s3": ["keep_within 1 day, 0:00:00"], "s2": ["keep_within 1 day, 0:00:00"]}),
    ("keep_within keeps a snapshot created in the future (the clock went back)",
     items("2026-03-01T12:00", "2026-03-05T13:00"), Retention(keep_within=DAY), NOW,
     {"s2": ["keep_within 1 day, 0:00:00 (created 2026-03-05T13:00:00Z, after now)"]}),
    ("keep_within unset keeps nothing by age",
     items("2026-03-05T11:59"), Retention(keep_within=None), NOW, {}),
    # ordering by createtxg (docs/reliability.md#r32-clock-goes-backwards)
    ("keep_last ranks by createtxg, not by created time",
     items("2026-03-02T12:00", "2026-03-02T11:00"), Retention(keep_last=1), NOW,
     {"s2": ["keep_last (1 of 1)"]}),
    ("a period keeps the highest-createtxg snapshot of a bucket even when an older one has a "
     "later time",
     items("2026-03-02T10:50", "2026-03-02T11:30", "2026-03-02T10:05"), Retention(hourly=2), NOW,
     {"s3": ["hourly 2026-03-02T10Z (1 of 2)"], "s2": ["hourly 2026-03-02T11Z (2 of 2)"]}),
]


@pytest.mark.parametrize("items_, policy, now, expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_retention_keeps_exactly_the_expected_items_with_reasons(items_, policy, now, expected):
    assert select_retained(items_, policy, now) == expected


def test_the_result_does_not_depend_on_input_order():
    base = items(*(f"2026-03-0{d}T{h:02d}:15" for d in (1, 2, 3) for h in (1, 9, 17)))
    policy = Retention(keep_last=2, hourly=4, daily=2, timezone="Europe/Vienna")
    expected = select_retained(base, policy, NOW)
    assert select_retained(list(reversed(base)), policy, NOW) == expected
    assert select_retained(base[::2] + base[1::2], policy, NOW) == expected


def test_a_clock_stepping_back_keeps_names_unique_and_keep_last_follows_createtxg():
    """docs/reliability.md#r32-clock-goes-backwards: a clock stepping back keeps names unique;
    keep_last follows createtxg."""
    clock = FixedClock(at("2026-03-02T10:00"))
    taken = []
    for step in (dt.timedelta(minutes=15), -dt.timedelta(hours=1), dt.timedelta(minutes=15), None):
        taken.append(Dated(format_short_name("zbak", clock.now()), len(taken) + 100, clock.now()))
        if step is not None:
            clock.advance(step)
    names = [d.key for d in taken]
    assert names == ["zbak_20260302T100000Z", "zbak_20260302T101500Z",
                     "zbak_20260302T091500Z", "zbak_20260302T093000Z"]
    assert len(set(names)) == len(names)
    assert max(names) != names[-1]  # name order is not creation order here
    assert select_retained(taken, Retention(keep_last=1), clock.now()) == {
        "zbak_20260302T093000Z": ["keep_last (1 of 1)"]
    }


@pytest.mark.parametrize("bad, message", [
    (lambda: select_retained([], Retention(), dt.datetime(2026, 3, 5)), "naive"),
    (lambda: Dated("s1", 1, dt.datetime(2026, 3, 5)), "naive"),
    (lambda: rank_newest_first([Dated("s1", 1, NOW), Dated("s1", 2, NOW)]), "duplicate key"),
    (lambda: rank_newest_first([Dated("s1", 1, NOW), Dated("s2", 1, NOW)]), "createtxg"),
], ids=["naive now", "naive created", "duplicate key", "duplicate createtxg"])
def test_bad_input_raises_value_error(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_dated_stores_created_as_utc():
    vienna = dt.datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("Europe/Vienna"))
    assert Dated("s", 1, vienna).created == at("2026-10-25T01:30")
    assert Dated("s", 1, vienna).created.tzinfo is UTC


# --- docs/reliability.md#r31-dst: DST end in Europe/Vienna (2026-10-25, 03:00 CEST -> 02:00 CET)
# ---

DST_START = at("2026-10-24T20:00")
DST_STEP = dt.timedelta(minutes=15)
DST_STEPS = 49  # 20:00Z .. 08:00Z: 12 hours, the DST change at 01:00Z in the middle
DST_POLICY = Retention(keep_last=2, hourly=10, daily=2, timezone="Europe/Vienna")


def take_dst_snapshots() -> list[Dated]:
    """One snapshot name per 15-minute step of a FixedClock across the end of DST."""
    clock = FixedClock(DST_START)
    taken = []
    for n in range(DST_STEPS):
        if n:
            clock.advance(DST_STEP)
        taken.append(Dated(format_short_name("zbak", clock.now()), 1000 + 7 * n, clock.now()))
    return taken


def render_dst_grid() -> list[str]:
    """The retention grid as golden-file lines: one per snapshot, oldest first."""
    taken = take_dst_snapshots()
    now = taken[-1].created
    retained = select_retained(taken, DST_POLICY, now)
    vienna = zoneinfo.ZoneInfo("Europe/Vienna")
    lines = []
    for d in taken:
        local = d.created.astimezone(vienna).isoformat(timespec="minutes")
        why = retained.get(d.key)
        lines.append(f"{d.key}  {local}  " + ("keep    " + "; ".join(why) if why else "destroy"))
    return lines


def test_dst_end_snapshot_names_are_unique_sorted_and_utc():
    """docs/reliability.md#r31-dst: 15-minute steps across the end of DST in Europe/Vienna give
    unique, sortable UTC names."""
    taken = take_dst_snapshots()
    names = [d.key for d in taken]
    assert len(set(names)) == len(names) == DST_STEPS
    assert sorted(names) == names
    for d in taken:
        assert d.key.endswith("Z")
        assert parse_short_name("zbak", d.key) == d.created
    # The run really crosses the change: local wall-clock labels would have collided.
    vienna = zoneinfo.ZoneInfo("Europe/Vienna")
    local = [d.created.astimezone(vienna).strftime("%Y%m%dT%H%M%S") for d in taken]
    assert len(set(local)) == DST_STEPS - 4  # 02:00, 02:15, 02:30, 02:45 happen twice


def test_dst_end_retention_grid_matches_the_golden_list():
    """docs/reliability.md#r31-dst: the retention grid across the end of DST matches the golden
    list."""
    golden = [
        line for line in GOLDEN.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    assert render_dst_grid() == golden


def test_catalog_timestamps_strictly_increase_when_the_clock_steps_back():
    """docs/reliability.md#r32-clock-goes-backwards: ``MonotonicClock`` over a FixedClock that steps
    back an hour and stands still: every reading is later than the previous one and than the floor
    (the newest timestamp already recorded), all aware UTC."""
    from zrepl_py.clock import MonotonicClock

    wall = FixedClock(at("2026-03-02T10:00"))
    clock = MonotonicClock(wall, floor=at("2026-03-02T10:00"))
    readings = [clock.now()]
    for step in (dt.timedelta(minutes=15), -dt.timedelta(hours=1), dt.timedelta(0),
                 dt.timedelta(minutes=10), dt.timedelta(hours=2)):
        wall.advance(step)
        readings.append(clock.now())
    assert all(b > a for a, b in itertools.pairwise(readings))
    assert readings[0] > at("2026-03-02T10:00")
    assert readings[-1] == wall.now(), "it follows the wall clock again once that is ahead"
    assert all(r.tzinfo is not None and r.utcoffset() == dt.timedelta(0) for r in readings)
