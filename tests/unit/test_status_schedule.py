"""Next-run times follow crontab(5), not APScheduler 3's Monday-is-0 weekday numbering."""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.daemon.crontab import crontab_trigger
from zrepl_py.status.report import next_fire

UTC = dt.UTC
MONDAY = dt.datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday


@pytest.mark.parametrize("line, expected", [
    ("0 3 * * 0", dt.datetime(2026, 3, 8, 3, 0, tzinfo=UTC)),  # Sunday
    ("0 3 * * 7", dt.datetime(2026, 3, 8, 3, 0, tzinfo=UTC)),  # 7 is Sunday too
    ("0 3 * * sun", dt.datetime(2026, 3, 8, 3, 0, tzinfo=UTC)),
    ("0 3 * * 1-5", dt.datetime(2026, 3, 3, 3, 0, tzinfo=UTC)),  # Tuesday (Monday's 03:00 passed)
    ("0 3 * * 5-7", dt.datetime(2026, 3, 6, 3, 0, tzinfo=UTC)),  # Friday
    ("0 3 * * 0-6/2", dt.datetime(2026, 3, 3, 3, 0, tzinfo=UTC)),  # sun,tue,thu,sat
    ("0 3 * * */3", dt.datetime(2026, 3, 4, 3, 0, tzinfo=UTC)),  # sun,wed,sat
    ("30 2 * * *", dt.datetime(2026, 3, 3, 2, 30, tzinfo=UTC)),
    ("*/15 * * * *", dt.datetime(2026, 3, 2, 12, 0, tzinfo=UTC)),
    ("0 0 13 * 5", dt.datetime(2026, 3, 6, 0, 0, tzinfo=UTC)),  # the 13th OR a Friday
])
def test_next_fire_follows_crontab_weekdays_and_day_or_weekday(line, expected):
    assert next_fire(line, MONDAY) == expected


def test_no_schedule_has_no_next_run():
    assert next_fire(None, MONDAY) is None


@pytest.mark.parametrize("line", ["0 3 * *", "0 3 * * 8", "0 3 * * mon-sun-x", "0 3 * * 5-1"])
def test_a_bad_crontab_line_is_refused(line):
    with pytest.raises(ValueError):
        crontab_trigger(line)
