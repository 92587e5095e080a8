"""The daemon's APScheduler job defaults behave as docs/reliability.md#r30-scheduler promises: a
real BackgroundScheduler (in-memory store) with ``daemon.scheduler.job_defaults``."""

from __future__ import annotations

import datetime as dt
import threading

from apscheduler.events import EVENT_JOB_MAX_INSTANCES
from apscheduler.schedulers.background import BackgroundScheduler

from zrepl_py.daemon.scheduler import job_defaults

UTC = dt.UTC


def scheduler() -> BackgroundScheduler:
    return BackgroundScheduler(timezone=UTC, job_defaults=job_defaults(None))


WAIT = 60
"""Seconds to wait for an event the scheduler must bring about (a loaded host is slow, a
broken default never brings it)."""


def test_a_run_longer_than_its_interval_never_gets_a_second_instance():
    """``max_instances=1`` (docs/reliability.md#r30-scheduler): a 0.2 s interval whose run
    lasts until APScheduler has refused a second instance: never two at once, and the
    skipped start is reported."""
    running, peak = [0], [0]
    lock = threading.Lock()
    skipped = threading.Event()

    def slow():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        skipped.wait(WAIT)  # the run outlasts its interval until a start was refused
        with lock:
            running[0] -= 1

    s = scheduler()
    s.add_listener(lambda e: skipped.set(), EVENT_JOB_MAX_INSTANCES)
    s.add_job(slow, "interval", seconds=0.2, id="slow")
    s.start()
    try:
        assert skipped.wait(WAIT), "APScheduler never refused a second instance"
    finally:
        s.shutdown(wait=True)
    assert peak[0] == 1


def test_a_late_run_still_runs_once_however_late_and_however_many_were_missed():
    """``misfire_grace_time=None, coalesce=True`` (docs/reliability.md#r30-scheduler): a job
    due a day ago every minute (1440 missed times) runs once at start, and its next run is
    then in the future: no missed time is left to run."""
    runs = []
    ran = threading.Event()
    s = scheduler()
    s.add_job(lambda: runs.append(1) or ran.set(), "interval", minutes=1, id="late",
              next_run_time=dt.datetime.now(UTC) - dt.timedelta(days=1))
    s.start()
    try:
        assert ran.wait(WAIT), "the late job never ran"
        assert s.get_job("late").next_run_time > dt.datetime.now(UTC)
    finally:
        s.shutdown(wait=True)
    assert runs == [1]


def test_the_defaults_are_exactly_one_instance_coalesced_and_no_grace_limit():
    """docs/reliability.md#r30-scheduler: the values themselves (APScheduler docs, "Missed job
    executions and coalescing")."""
    assert job_defaults(None) == {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
    assert job_defaults(60)["misfire_grace_time"] == 60
