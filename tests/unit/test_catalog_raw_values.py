"""Raw driver values of the catalog's large reads (``catalog.base.raw_rows``) converted to
zbak's types: times as aware UTC whatever form the driver hands them in."""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.catalog.base import utc_of

UTC = dt.UTC
NOON = dt.datetime(2026, 11, 25, 12, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize("raw", [
    "2026-11-25 12:00:00.123456",         # SQLite: the naive UTC text UtcDateTime writes
    "2026-11-25 14:00:00.123456+02:00",   # a text carrying its own offset
    dt.datetime(2026, 11, 25, 12, 0, 0, 123456),                       # naive: taken as UTC
    dt.datetime(2026, 11, 25, 7, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
])
def test_a_time_column_reads_as_aware_utc_whatever_the_driver_hands_back(raw):
    value = utc_of(raw)
    assert value == NOON
    assert value.tzinfo is UTC


def test_a_time_text_without_microseconds_reads_as_aware_utc():
    assert utc_of("2026-11-25 12:00:00") == NOON.replace(microsecond=0)


def test_a_null_time_stays_none():
    assert utc_of(None) is None
