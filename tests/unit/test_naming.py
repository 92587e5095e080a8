"""zbak's snapshot names: ``PREFIX_YYYYMMDDTHHMMSSZ`` in UTC, and recognising its own."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from zrepl_py.clock import UTC
from zrepl_py.errors import InvalidName
from zrepl_py.snapshots.naming import format_short_name, is_own, parse_short_name
from zrepl_py.zfs.names import SnapshotName

VIENNA = zoneinfo.ZoneInfo("Europe/Vienna")

ROUND_TRIP = [
    # (prefix, aware time, expected short name)
    ("zbak", dt.datetime(2026, 10, 25, 1, 30, tzinfo=UTC), "zbak_20261025T013000Z"),
    ("zbak", dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "zbak_20260102T030405Z"),
    ("nightly.v2", dt.datetime(2030, 12, 31, 23, 59, 59, tzinfo=UTC),
     "nightly.v2_20301231T235959Z"),
    ("a-b:c", dt.datetime(999, 1, 1, tzinfo=UTC), "a-b:c_09990101T000000Z"),
    # 02:30 local happens twice on 2026-10-25 in Vienna; the names differ because they are UTC.
    ("zbak", dt.datetime(2026, 10, 25, 2, 30, tzinfo=VIENNA, fold=0), "zbak_20261025T003000Z"),
    ("zbak", dt.datetime(2026, 10, 25, 2, 30, tzinfo=VIENNA, fold=1), "zbak_20261025T013000Z"),
    ("zbak", dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
     "zbak_20260301T170000Z"),
]


@pytest.mark.parametrize("prefix, at, short", ROUND_TRIP)
def test_names_are_utc_and_parse_back_to_the_same_instant(prefix, at, short):
    assert format_short_name(prefix, at) == short
    parsed = parse_short_name(prefix, short)
    # Compare in UTC: PEP 495 makes an ambiguous (DST-fold) time unequal to every other zone's.
    assert parsed == at.astimezone(UTC)
    assert parsed.utcoffset() == dt.timedelta(0)
    assert is_own(prefix, short)
    SnapshotName.of("tank/data", short)  # a valid ZFS snapshot name


def test_sub_second_precision_is_dropped_from_names():
    at = dt.datetime(2026, 5, 6, 7, 8, 9, 999_999, tzinfo=UTC)
    short = format_short_name("zbak", at)
    assert short == "zbak_20260506T070809Z"
    assert parse_short_name("zbak", short) == at.replace(microsecond=0)


NOT_OURS = [
    # (prefix, short name, why it is not zbak's own with this prefix)
    ("zbak", "manual-before-upgrade", "user snapshot"),
    ("zbak", "0", "user snapshot named like a number"),
    ("zbak", "zbak", "prefix alone"),
    ("zbak", "zbak_", "prefix and separator alone"),
    ("zbak", "zbak_garbage", "garbage after the prefix"),
    ("zbak", "other_20261025T013000Z", "another prefix"),
    ("zbak", "zbak_hourly_20261025T013000Z", "a longer prefix that starts with ours"),
    ("zbak_hourly", "zbak_20261025T013000Z", "a shorter prefix than ours"),
    ("zbak", "ZBAK_20261025T013000Z", "prefix in another case"),
    ("zbak", "zbak-20261025T013000Z", "wrong separator"),
    ("zbak", "zbak_20261025T013000", "no Z: not marked UTC"),
    ("zbak", "zbak_20261025t013000z", "lower-case markers"),
    ("zbak", "zbak_20261025T0130Z", "no seconds"),
    ("zbak", "zbak_20261025T013000Z.1", "trailing text"),
    ("zbak", "zbak_20261025T013000Z\n", "trailing newline"),
    ("zbak", " zbak_20261025T013000Z", "leading space"),
    ("zbak", "zbak_2026-10-25T01:30:00Z", "ISO punctuation"),
    ("zbak", "zbak_+2026102T013000Z", "sign instead of a digit"),
    ("zbak", "zbak_\u0662\u00320261025T013000Z", "non-ASCII digits"),
    ("zbak", "zbak_20261325T013000Z", "month 13"),
    ("zbak", "zbak_20260230T013000Z", "30 February"),
    ("zbak", "zbak_20261025T243000Z", "hour 24"),
    ("zbak", "zbak_20261025T013060Z", "second 60 (leap seconds do not occur in UTC names)"),
    ("zbak", "zbak_00001025T013000Z", "year 0"),
]


@pytest.mark.parametrize("prefix, short, why", NOT_OURS, ids=[row[2] for row in NOT_OURS])
def test_names_that_are_not_exactly_ours_parse_to_none(prefix, short, why):
    assert parse_short_name(prefix, short) is None
    assert not is_own(prefix, short)


def test_a_naive_time_is_refused_with_value_error():
    with pytest.raises(ValueError, match="naive"):
        format_short_name("zbak", dt.datetime(2026, 10, 25, 1, 30))


@pytest.mark.parametrize("prefix", ["", "-zbak", "zb@k", "zb/ak", "zbäk"])
def test_an_invalid_prefix_is_refused_with_invalid_name(prefix):
    with pytest.raises(InvalidName):
        format_short_name(prefix, dt.datetime(2026, 10, 25, tzinfo=UTC))


def test_names_sort_in_time_order_within_one_prefix():
    times = [dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(minutes=37 * i) for i in range(500)]
    names = [format_short_name("zbak", t) for t in times]
    assert sorted(names) == names
    assert len(set(names)) == len(names)
