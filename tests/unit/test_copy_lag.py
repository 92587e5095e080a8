"""How far a copy lags (zrepl_py/copying/lag.py, pure over catalog rows), its default limit
from the copy's schedule, and how ``--check`` and the metrics read it
(docs/copies.md#how-far-a-copy-lags)."""

from __future__ import annotations

import datetime as dt

from unit.test_last_copy import NOW, row
from unit.test_metrics_families import state

from zrepl_py.config.copies import CopyConfig
from zrepl_py.config.jobs import JobConfig
from zrepl_py.copying.lag import copy_lag, lag_limit
from zrepl_py.status.check import Health, judge
from zrepl_py.status.metrics import families
from zrepl_py.values.cron import longest_gap

HOUR = dt.timedelta(hours=1)


def job(**copy: object) -> JobConfig:
    """Job of dataset tank/d archived to store a, copied to b with ``copy``'s keys."""
    return JobConfig.model_validate({"dataset": "tank/d", "archive": {"store": "a"},
                                     "copy": {"b": copy}})


def test_the_lag_is_what_copy_would_copy_and_the_age_of_the_oldest_of_it():
    """b holds the full @1; a has @1, @1->@2, @3 and a bad @4: b lacks @1->@2 and @3 (the
    bad stream is never copied, so it is no lag), the oldest of them stored 10 days ago."""
    full = row("a", 1)
    a = [full, row("a", 2, full, age=10), row("a", 3, age=5), row("a", 4, state="bad", age=1)]
    lag = copy_lag(job(max_lag="7d"), "b", a + [row("b", 1, age=20)], NOW)
    assert lag is not None
    assert (lag.source, lag.streams, lag.bytes) == ("a", 2, 100)
    assert lag.oldest_missing == NOW - dt.timedelta(days=10)
    assert lag.lag_seconds == 10 * 86400 and lag.max_lag == 7 * 86400 and lag.lagging
    assert (lag.newest, lag.target_newest) == ("tank/d@3", "tank/d@1")
    assert lag.target_newest_time == NOW - dt.timedelta(days=20)


def test_a_chain_beyond_the_copy_stores_retention_is_no_lag():
    a = [row("a", 1, age=30), row("a", 2, age=1)]
    lag = copy_lag(job(retention={"keep_chains": 1}), "b", a, NOW)
    assert lag is not None and (lag.streams, lag.oldest_missing) == (1, a[1].created_at)
    caught_up = copy_lag(job(), "b", a + [row("b", 1), row("b", 2)], NOW)
    assert caught_up is not None
    assert (caught_up.streams, caught_up.bytes, caught_up.lag_seconds) == (0, 0, 0.0)
    assert caught_up.oldest_missing is None and not caught_up.lagging


def test_the_default_limit_is_twice_the_longest_gap_of_the_schedule():
    monday = dt.datetime(2026, 11, 23, 12, tzinfo=dt.UTC)
    assert longest_gap("30 4 * * *", monday) == 24 * HOUR
    assert longest_gap("0 3 * * 1-5", monday) == 72 * HOUR  # Friday to Monday
    copy = CopyConfig.model_validate
    assert lag_limit(copy({"schedule": "0 3 * * 1-5"}), monday) == 144 * HOUR
    assert lag_limit(copy({"schedule": "0 3 * * 1-5", "max_lag": "1h"}), monday) == HOUR
    assert lag_limit(copy({}), monday) is None  # no schedule: shown, not judged


def test_check_warns_of_a_lagging_copy_only_and_metrics_export_every_copy():
    lagging = copy_lag(job(max_lag="1d"), "b", [row("a", 1, age=3)], NOW)
    fine = copy_lag(job(max_lag="5d"), "b", [row("a", 1, age=3)], NOW)
    assert lagging is not None and fine is not None
    (problem,) = judge([], [], [("j", lagging), ("k", fine)])
    assert (problem.health, problem.job, problem.action, problem.target) == (
        Health.WARNING, "j", "copy", "b")
    assert problem.message == (
        "copy of job j to store b lags 3.0 d (max_lag 24.0 h): 1 stream(s), 50 B of store a"
        " not copied, the oldest since 2026-11-18 12:00Z")
    found = {(s.name, s.labels["store"]): s.value
             for family in families([state(copies=[lagging])]) for s in family.samples
             if s.name.startswith("zbak_copy_")}
    assert found == {("zbak_copy_lag_streams", "b"): 1, ("zbak_copy_lag_bytes", "b"): 50,
                     ("zbak_copy_lag_seconds", "b"): 3 * 86400,
                     ("zbak_copy_max_lag_seconds", "b"): 86400}
