"""The daemon's APScheduler job defaults behave as docs/reliability.md#r30-scheduler promises: a
real BackgroundScheduler (in-memory store) with ``daemon.scheduler.job_defaults``."""

from __future__ import annotations

import datetime as dt
import threading
import time

from apscheduler.events import EVENT_JOB_MAX_INSTANCES
from apscheduler.schedulers.background import BackgroundScheduler

from zrepl_py.daemon.scheduler import job_defaults

UTC = dt.UTC


def scheduler() -> BackgroundScheduler:
    return BackgroundScheduler(timezone=UTC, job_defaults=job_defaults(None))


def test_a_run_longer_than_its_interval_never_gets_a_second_instance():
    """docs/reliability.md#r30-scheduler (max_instances=1): a 0.2 s interval whose run takes 0.9 s:
    never two at once, and APScheduler reports the skipped starts."""
    running, peak, skipped = [0], [0], []
    lock = threading.Lock()

    def slow():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.9)
        with lock:
            running[0] -= 1

    s = scheduler()
    s.add_listener(lambda e: skipped.append(e), EVENT_JOB_MAX_INSTANCES)
    s.add_job(slow, "interval", seconds=0.2, id="slow")
    s.start()
    try:
        time.sleep(1.5)
    finally:
        s.shutdown(wait=True)
    assert peak[0] == 1 and skipped


def test_a_late_run_still_runs_once_however_late_and_however_many_were_missed():
    """docs/reliability.md#r30-scheduler (misfire_grace_time=None, coalesce=True): a job due a day
    ago every minute (1440 missed times) runs exactly once at start."""
    runs = []
    s = scheduler()
    s.add_job(lambda: runs.append(1), "interval", minutes=1, id="late",
              next_run_time=dt.datetime.now(UTC) - dt.timedelta(days=1))
    s.start()
    try:
        time.sleep(0.8)
    finally:
        s.shutdown(wait=True)
    assert runs == [1]


def test_the_defaults_are_exactly_one_instance_coalesced_and_no_grace_limit():
    """docs/reliability.md#r30-scheduler: the values themselves (APScheduler docs, "Missed job
    executions and coalescing")."""
    assert job_defaults(None) == {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
    assert job_defaults(60)["misfire_grace_time"] == 60
