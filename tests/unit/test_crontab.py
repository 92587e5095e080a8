"""One crontab(5) parser for config validation, the daemon and ``zbak status``
(docs/decisions.md#cli-frictions-a-first-time-admin-met): what it accepts and when a line fires,
table-driven against what cron(8) does.

Expected times follow crontab(5) and Debian's cron(8) (Vixie cron ``entry.c``/``cron.c``):
day-of-week 0 and 7 are Sunday; with day of month and day of week both restricted a line
fires when either matches, unless one of the two fields starts with ``*`` (cron sets
DOM_STAR/DOW_STAR from the first character, and then both must match); the nicknames stand
for the five fields crontab(5) gives them.
"""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.daemon.crontab import crontab_trigger
from zrepl_py.values.cron import first_at_or_after, parse_crontab
from zrepl_py.values.units import parse_cron

UTC = dt.UTC


def at(month: int, day: int, hour: int = 0, minute: int = 0, year: int = 2026) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, tzinfo=UTC)


MON = at(3, 2, 12)  # Monday 2026-03-02 12:00 (Sunday is 03-01 and 03-08)
SAT = at(3, 7, 12)  # Saturday 2026-03-07 12:00

CRON_8 = [
    # line, from, first time cron(8) runs it at or after that
    ("0 4 * * 7", SAT, at(3, 8, 4)),  # 7 is Sunday
    ("0 4 * * 0", SAT, at(3, 8, 4)),  # and so is 0 (APScheduler 3 would say Monday)
    ("0 4 * * sun", SAT, at(3, 8, 4)),
    ("0 4 * * SUN", SAT, at(3, 8, 4)),
    ("0 4 * * 1", SAT, at(3, 9, 4)),  # 1 is Monday
    ("0 4 * * mon-fri", SAT, at(3, 9, 4)),
    ("0 4 * * 6-7", MON, at(3, 7, 4)),  # Saturday and Sunday
    ("0 4 * * 5-7", at(3, 7, 5), at(3, 8, 4)),
    ("0 4 * * 0-6/2", MON, at(3, 3, 4)),  # Sunday, Tuesday, Thursday, Saturday
    ("0 4 * * */3", MON, at(3, 4, 4)),  # Sunday, Wednesday, Saturday
    ("0 0 13 * 5", MON, at(3, 6)),  # the 13th OR a Friday
    ("0 0 1 * 1", at(3, 24, 1), at(3, 30)),  # the 1st OR a Monday: Monday 30th first
    ("0 0 1 * 1", at(3, 31), at(4, 1)),  # then Wednesday the 1st
    ("0 0 */2 * 1", at(3, 10), at(3, 23)),  # "*" first: odd days AND Mondays, not the 16th
    ("0 0 1 * */2", MON, at(8, 1)),  # "*" first: the 1st AND Sun/Tue/Thu/Sat
    ("30 2 * * *", MON, at(3, 3, 2, 30)),
    ("*/15 * * * *", MON, MON),  # at or after: the very minute
    ("0 12 * jan,jul *", MON, at(7, 1, 12)),
    ("0 0 29 2 *", MON, at(2, 29, year=2028)),
    ("@hourly", MON, MON),
    ("@daily", MON, at(3, 3)),
    ("@midnight", MON, at(3, 3)),
    ("@weekly", MON, at(3, 8)),  # Sunday midnight
    ("@monthly", MON, at(4, 1)),
    ("@yearly", MON, at(1, 1, year=2027)),
    ("@annually", MON, at(1, 1, year=2027)),
]


@pytest.mark.parametrize("line, start, expected", CRON_8)
def test_a_line_first_fires_when_cron_8_would_run_it(line, start, expected):
    assert first_at_or_after(line, start) == expected


@pytest.mark.parametrize("line, start, expected", CRON_8)
def test_the_daemon_trigger_and_config_validation_agree_with_the_table(line, start, expected):
    assert parse_cron(line) == line
    assert crontab_trigger(line).get_next_fire_time(None, start) == expected


def test_after_a_fire_time_the_trigger_answers_the_next_one_not_the_same():
    trigger = crontab_trigger("0 4 * * 7")
    first = trigger.get_next_fire_time(None, SAT)
    assert trigger.get_next_fire_time(first, first) == at(3, 15, 4)
    # Catching up after downtime walks every fire time since the previous one.
    assert trigger.get_next_fire_time(first, at(4, 30)) == at(3, 15, 4)


def test_a_time_inside_the_fire_second_is_past_it():
    assert first_at_or_after("0 4 * * *", at(3, 8, 4) + dt.timedelta(microseconds=1)) == at(3, 9, 4)


def test_a_nickname_expands_to_the_five_fields_crontab_5_gives_it():
    assert parse_crontab("@weekly") == "0 0 * * 0"
    assert parse_crontab(" 0  4 * *\t7 ") == "0 4 * * 7"


@pytest.mark.parametrize("line, why", [
    ("0 4 * * 8", "bad day of week"),
    ("60 * * * *", "bad minute"),
    ("0 24 * * *", "bad hour"),
    ("0 0 0 * *", "bad day of month"),
    ("0 0 * 13 *", "bad month"),
    ("0 0 31 2 *", "bad day of month"),  # never: February has no 31st
    ("0 0 5-1 * *", "bad day of month"),  # a range backwards
    ("*/0 * * * *", "bad minute"),
    ("0 4 * *", "expected 5 fields"),
    ("0 0 4 * * *", "expected 5 fields"),  # a seconds field is not crontab(5)
    ("", "expected 5 fields"),
    ("0 0 L * *", "bad day of month field"),  # Quartz/cronsim extensions, not cron(8)
    ("0 0 15W * *", "bad day of month field"),
    ("0 0 * * 5L", "bad day of week field"),
    ("0 0 * * 1#2", "bad day of week field"),
    ("0 0 ? * *", "bad day of month field"),
    ("H * * * *", "bad minute field"),
    ("0 4 * * mon-sun-x", "bad day of week field"),
    ("@reboot", "not a schedule"),
    ("@fortnightly", "unknown nickname"),
])
def test_a_line_cron_8_would_refuse_is_refused_by_validation_and_by_the_daemon(line, why):
    with pytest.raises(ValueError, match=why):
        parse_crontab(line)
    with pytest.raises(ValueError, match="invalid cron schedule"):
        parse_cron(line)
    with pytest.raises(ValueError):
        crontab_trigger(line)


def test_a_stored_trigger_pickles_as_its_line_and_fires_the_same_after_loading():
    import pickle

    trigger = pickle.loads(pickle.dumps(crontab_trigger("0 4 * * 7")))
    assert trigger.line == "0 4 * * 7" and str(trigger) == "crontab[0 4 * * 7]"
    assert trigger.get_next_fire_time(None, SAT) == at(3, 8, 4)
