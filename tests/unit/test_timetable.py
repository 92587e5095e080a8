"""``bandwidth_limit`` as a timetable (``values.timetable``): the limit in force at a time and
when it next changes, table-driven, in UTC (docs/design.md#config-toml: one time-zone rule for
cron lines and timetables); and the config errors, which name the key and the file."""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.config.loading import load_config
from zrepl_py.errors import ConfigError
from zrepl_py.values.timetable import Timetable, parse_timetable

UTC = dt.UTC
OFFICE = {"mon-fri 08:00-18:00": "10M", "default": "off"}
NIGHT = {"22:00-06:00": "50M", "default": "5M"}  # every night, across midnight
WEEKEND = {"sun 22:00-02:00": "1M", "sat,sun 10:00-12:00": "2M", "fri-mon 03:00-04:00": 7}


def at(text: str) -> dt.datetime:
    """``2026-11-30T08:00`` as aware UTC (2026-11-30 is a Monday)."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(("table", "when", "limit", "window", "until"), [
    # office hours: the start is inclusive, the end exclusive
    pytest.param(OFFICE, "2026-11-30T07:59:59", None, None, "2026-11-30T08:00", id="before"),
    pytest.param(OFFICE, "2026-11-30T08:00:00", 10**7, "mon-fri 08:00-18:00",
                 "2026-11-30T18:00", id="at the start"),
    pytest.param(OFFICE, "2026-11-30T17:59:59.9", 10**7, "mon-fri 08:00-18:00",
                 "2026-11-30T18:00", id="just before the end"),
    pytest.param(OFFICE, "2026-11-30T18:00:00", None, None, "2026-12-01T08:00", id="at the end"),
    pytest.param(OFFICE, "2026-12-04T18:30:00", None, None, "2026-12-07T08:00",
                 id="friday evening: next on monday"),
    pytest.param(OFFICE, "2026-12-06T23:59:59", None, None, "2026-12-07T08:00",
                 id="sunday night: the week wraps"),
    # across midnight, every day
    pytest.param(NIGHT, "2026-11-30T23:00:00", 50 * 10**6, "22:00-06:00", "2026-12-01T06:00",
                 id="before midnight"),
    pytest.param(NIGHT, "2026-12-01T00:00:00", 50 * 10**6, "22:00-06:00", "2026-12-01T06:00",
                 id="at midnight"),
    pytest.param(NIGHT, "2026-11-30T05:59:00", 50 * 10**6, "22:00-06:00", "2026-11-30T06:00",
                 id="monday morning: sunday's night"),
    pytest.param(NIGHT, "2026-11-30T12:00:00", 5 * 10**6, None, "2026-11-30T22:00",
                 id="the default between"),
    # sunday across midnight into monday: the week wraps inside one window
    pytest.param(WEEKEND, "2026-12-06T23:30:00", 10**6, "sun 22:00-02:00", "2026-12-07T02:00",
                 id="sunday night"),
    pytest.param(WEEKEND, "2026-12-07T01:59:00", 10**6, "sun 22:00-02:00", "2026-12-07T02:00",
                 id="monday early: still sunday's window"),
    pytest.param(WEEKEND, "2026-12-07T02:00:00", None, None, "2026-12-07T03:00",
                 id="monday 02:00: default off"),
    pytest.param(WEEKEND, "2026-12-07T03:30:00", 7, "fri-mon 03:00-04:00", "2026-12-07T04:00",
                 id="a wrapping day range: monday"),
    pytest.param(WEEKEND, "2026-12-02T03:30:00", None, None, "2026-12-04T03:00",
                 id="wednesday is not in fri-mon"),
    pytest.param(WEEKEND, "2026-12-05T11:00:00", 2 * 10**6, "sat,sun 10:00-12:00",
                 "2026-12-05T12:00", id="a day list"),
    # adjacent windows with one limit are one stretch: the next change is past both
    pytest.param({"mon 08:00-12:00": "1M", "mon 12:00-14:00": "1M"}, "2026-11-30T09:00",
                 10**6, "mon 08:00-12:00", "2026-11-30T14:00", id="same limit adjacent"),
    pytest.param({"00:00-24:00": "3M"}, "2026-12-02T09:00", 3 * 10**6, "00:00-24:00", None,
                 id="all week: never changes"),
    # a plain value never changes
    pytest.param("10M", "2026-11-30T09:00", 10**7, None, None, id="plain size"),
    pytest.param("off", "2026-11-30T09:00", None, None, None, id="off"),
    pytest.param(0, "2026-11-30T09:00", None, None, None, id="plain 0 is no limit, as before"),
])
def test_the_limit_in_force_and_its_next_change(table, when, limit, window, until):
    found = parse_timetable(table).at(at(when))
    assert (found.limit, found.window) == (limit, window)
    assert found.until == (at(until) if until else None)


def test_a_time_in_another_zone_is_read_in_utc_and_a_naive_one_is_refused():
    table = parse_timetable(OFFICE)
    berlin = dt.timezone(dt.timedelta(hours=1))
    # 08:30 in UTC+1 is 07:30 UTC: outside the window
    assert table.at(dt.datetime(2026, 11, 30, 8, 30, tzinfo=berlin)).limit is None
    assert table.at(dt.datetime(2026, 11, 30, 9, 30, tzinfo=berlin)).limit == 10**7
    with pytest.raises(ValueError, match="aware"):
        table.at(dt.datetime(2026, 11, 30, 9, 30))


@pytest.mark.parametrize(("table", "message"), [
    ({"mon-fri 08:00-18:00": "10M", "fri 17:00-19:00": "1M"},
     "'mon-fri 08:00-18:00' and 'fri 17:00-19:00' overlap (both hold on fri 17:00 UTC)"),
    ({"22:00-06:00": "1M", "tue 05:00-07:00": "1M"}, "overlap (both hold on tue 05:00 UTC)"),
    ({"sun 23:00-01:00": "1M", "mon 00:30-02:00": "1M"}, "overlap (both hold on mon 00:30 UTC)"),
    ({"mon 8:00-9:00": "1M", "mon 08:30-10:00": "2M"}, "overlap"),
    ({"moon 08:00-09:00": "1M"}, "'moon' is not a day"),
    ({"mon 08:00-25:00": "1M"}, "25:00 is not a time of day"),
    ({"mon 24:00-02:00": "1M"}, "24:00 is not a time of day"),
    ({"mon 08:60-09:00": "1M"}, "08:60 is not a time of day"),
    ({"mon 08:00-08:00": "1M"}, "is empty"),
    ({"mon 08:00": "1M"}, 'expected "[DAYS] HH:MM-HH:MM"'),
    ({"mon 08:00-09:00": "fast"}, "expected a size"),
    ({"mon 08:00-09:00": "0"}, "write \"off\""),
    ({"mon 08:00-09:00": "1M", "default": "lots"}, "default: expected a size"),
])
def test_a_bad_timetable_is_refused_saying_why(table, message):
    with pytest.raises(ValueError) as caught:
        parse_timetable(table)
    assert message in str(caught.value)


def test_the_config_error_names_the_key_and_the_file(tmp_path):
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n'
                      '[jobs.j]\ndataset = "tank/d"\n[jobs.j.replicate]\ntargets = ["b:p/r"]\n'
                      'bandwidth_limit = { "mon-fri 08:00-18:00" = "10M",'
                      ' "fri 17:00-19:00" = "1M" }\n'
                      '[hosts.b]\naddress = "127.0.0.1"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    text = "\n".join(caught.value.lines())
    assert "jobs.j.replicate.bandwidth_limit" in text and str(config) in text
    assert "overlap" in text


def test_a_store_takes_a_timetable_for_its_uploads(tmp_path):
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n'
                      f'[stores.cold]\nurl = "file://{tmp_path}/store"\n'
                      'bandwidth_limit = { "mon-fri 08:00-18:00" = "2M", default = "off" }\n')
    loaded = load_config(config)
    limit = loaded.stores["cold"].bandwidth_limit
    assert isinstance(limit, Timetable) and limit.at(at("2026-11-30T09:00")).limit == 2 * 10**6
    assert str(limit) == '{ "mon-fri 08:00-18:00" = 2000000, default = "off" }'
