"""Which actions ``zbak daemon --once`` runs (``daemon.once.due_entries``, pure): an action is
due when its schedule fired since its newest run started, or when it never ran; a fire
time older than ``misfire_grace_time`` does not count; missed fire times count once."""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.catalog.rows import RunRow
from zrepl_py.daemon.once import due_entries, last_starts
from zrepl_py.daemon.plan import Entry

UTC = dt.UTC
NOW = dt.datetime(2026, 12, 2, 10, 7, 30, tzinfo=UTC)
HOURLY = Entry("db", "snapshot", cron="0 * * * *")
NIGHTLY = Entry("db", "replicate", cron="30 1 * * *")
EVERY = Entry("db", "archive", every=300.0)


def run(action: str, started: dt.datetime, target: str | None = None) -> RunRow:
    return RunRow(id=1, job="db", action=action, target=target, started_at=started,
                  ended_at=started, result="ok", bytes=0, error=None)


@pytest.mark.parametrize(("entry", "last", "due"), [
    (HOURLY, None, True),
    (HOURLY, NOW.replace(minute=0, second=0), False),
    (HOURLY, NOW.replace(minute=0, second=1), False),
    (HOURLY, NOW.replace(hour=9, minute=59), True),
    (HOURLY, NOW - dt.timedelta(days=3), True),
    (NIGHTLY, NOW.replace(hour=1, minute=31), False),
    (NIGHTLY, NOW.replace(hour=1, minute=29), True),
    (NIGHTLY, NOW - dt.timedelta(days=1, hours=8), True),
    (EVERY, NOW.replace(minute=5, second=0), False),
    (EVERY, NOW.replace(minute=4, second=59), True),
], ids=lambda v: str(v))
def test_an_action_is_due_when_its_schedule_fired_since_its_newest_run_or_it_never_ran(
    entry, last, due
):
    started = {} if last is None else {(entry.job, entry.action): last}
    assert due_entries([entry], started, NOW, None) == ([entry] if due else [])


def test_a_fire_time_older_than_the_grace_does_not_count():
    started = {("db", "replicate"): NOW - dt.timedelta(days=1)}
    assert due_entries([NIGHTLY], started, NOW, dt.timedelta(hours=6)) == []
    assert due_entries([NIGHTLY], started, NOW, dt.timedelta(hours=9)) == [NIGHTLY]
    assert due_entries([HOURLY], {}, NOW, dt.timedelta(seconds=1)) == [HOURLY], \
        "an action that never ran is due whatever the grace"


def test_the_due_entries_keep_the_plans_order():
    assert due_entries([HOURLY, NIGHTLY, EVERY], {}, NOW, None) == [HOURLY, NIGHTLY, EVERY]


def test_the_newest_start_counts_over_all_targets_of_an_action():
    early, late = NOW - dt.timedelta(hours=3), NOW - dt.timedelta(minutes=3)
    starts = last_starts([run("replicate", early, "a"), run("replicate", late, "b"),
                          run("snapshot", early)])
    assert starts == {("db", "replicate"): late, ("db", "snapshot"): early}


def test_a_job_with_a_drill_section_is_drilled_on_sundays_at_six_utc_by_default():
    from zrepl_py.config.schema import Config
    from zrepl_py.daemon.plan import plan_entries

    config = Config.model_validate({"daemon": {"prune_schedule": None, "audit_schedule": None},
                                    "jobs": {"db": {"dataset": "p/db", "drill": {}},
                                             "manual": {"dataset": "p/m",
                                                        "drill": {"schedule": None}},
                                             "none": {"dataset": "p/n"}}})
    (drill,) = [e for e in plan_entries(config) if e.action == "drill"]
    assert (drill.id, drill.schedule) == ("db:drill", "cron 0 6 * * 0")
    sunday = dt.datetime(2026, 11, 29, 6, 0, tzinfo=UTC)  # the Sunday before NOW
    assert due_entries([drill], {}, NOW, None) == [drill], "never drilled: due"
    assert due_entries([drill], {("db", "drill"): sunday + dt.timedelta(seconds=5)},
                       NOW, None) == []
    assert due_entries([drill], {("db", "drill"): sunday - dt.timedelta(minutes=1)},
                       NOW, None) == [drill]


def test_a_copy_counts_per_store_it_copied_to():
    """docs/copies.md#the-copy-schedule: a copy run's target is ``STORE:DATASET``; its entry is
    ``copy:STORE``, due by that store's runs alone."""
    early, late = NOW - dt.timedelta(hours=3), NOW - dt.timedelta(minutes=3)
    starts = last_starts([run("copy", early, "b:tank/db"), run("copy", late, "c:tank/db")])
    assert starts == {("db", "copy:b"): early, ("db", "copy:c"): late}
    copy_b = Entry("db", "copy:b", cron="0 * * * *")
    assert due_entries([copy_b], starts, NOW, None) == [copy_b]
    assert due_entries([copy_b], {("db", "copy:b"): late}, NOW, None) == []
