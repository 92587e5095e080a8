"""Run rows on a real SQLite catalog: opened before the work, ended ``interrupted`` once their
process is gone (docs/decisions.md#a-killed-run-ends-interrupted), and the 0003 migration's way
down."""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import sys

import pytest
import sqlalchemy as sa

from zrepl_py.catalog import db
from zrepl_py.catalog.repository import Catalog
from zrepl_py.clock import FixedClock
from zrepl_py.observe.events import Event, register
from zrepl_py.observe.runlog import RunSet, recorded_run, sweep_interrupted
from zrepl_py.observe.transfers import process_start

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def events():
    seen: list[Event] = []
    unsubscribe = register(seen.append)
    yield seen
    unsubscribe()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_run_whose_process_is_gone_ends_interrupted_once_with_a_failure_alert(catalog, events):
    dead = catalog.start_run("data", "archive", "cold:tank/data", T0,
                             host=socket.gethostname(), pid=_dead_pid(), pid_start=1)
    alive = catalog.start_run("data", "replicate", "b:tank/r", T0, host=socket.gethostname(),
                              pid=os.getpid(), pid_start=process_start(os.getpid()))
    elsewhere = catalog.start_run("data", "prune", None, T0, host="other-host", pid=1)
    legacy = catalog.start_run("data", "audit", None, T0)
    swept = sweep_interrupted(catalog, FixedClock(T0 + dt.timedelta(minutes=5)))
    assert [r.id for r in swept] == [dead]
    results = {r.id: r.result for r in catalog.last_runs("data")}
    assert results == {dead: "interrupted", alive: "running", elsewhere: "running",
                       legacy: "running"}
    assert [e.kind for e in events] == ["failure"] and "interrupted" in events[0].message
    assert sweep_interrupted(catalog, FixedClock(T0)) == []


def test_runs_opened_together_fail_together_when_the_shared_preparation_fails(catalog, events):
    with pytest.raises(RuntimeError):
        with RunSet(catalog, FixedClock(T0), "data", "replicate", ["a:p/x", "b:p/y"]) as runs:
            runs.records["a:p/x"].bytes = 5
            runs.end("a:p/x")
            raise RuntimeError("dataset does not exist")
    by_target = {r.target: r for r in catalog.last_runs("data")}
    assert by_target["a:p/x"].result == "ok" and by_target["a:p/x"].bytes == 5
    assert by_target["b:p/y"].result == "failed"
    assert by_target["b:p/y"].error == "dataset does not exist"
    assert [(e.kind, e.target) for e in events] == [("failure", "b:p/y")]


def test_a_recorded_run_carries_its_process_and_an_ok_after_interrupted_is_a_recovery(
        catalog, events):
    catalog.start_run("data", "snapshot", None, T0, host=socket.gethostname(),
                      pid=_dead_pid(), pid_start=1)
    with recorded_run(catalog, FixedClock(T0 + dt.timedelta(hours=1)), "data", "snapshot"):
        pass
    (run,) = catalog.last_runs("data")
    assert (run.result, run.host, run.pid) == ("ok", socket.gethostname(), os.getpid())
    assert [e.kind for e in events] == ["failure", "recovery"]


def test_downgrading_0003_turns_interrupted_runs_into_failed_ones(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'down.sqlite'}")
    db.upgrade(engine)
    catalog = Catalog(engine)
    run = catalog.start_run("data", "archive", None, T0, host="h", pid=1)
    catalog.interrupt_run(run, now=T0, error="gone")
    db.downgrade(engine, "0002")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT result FROM runs")).scalar_one() == "failed"
    db.upgrade(engine)
    engine.dispose()


def test_downgrading_0004_deletes_the_hook_runs_and_keeps_the_others(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'down.sqlite'}")
    db.upgrade(engine)
    catalog = Catalog(engine)
    catalog.start_run("data", "hook", "pre-snapshot", T0, host="h", pid=1)
    catalog.start_run("data", "snapshot", None, T0, host="h", pid=1)
    db.downgrade(engine, "0003")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT action FROM runs")).scalars().all() == ["snapshot"]
        with pytest.raises(sa.exc.IntegrityError):
            conn.execute(sa.text("INSERT INTO runs (job, action, started_at, result, bytes)"
                                 " VALUES ('data', 'hook', '2026-11-01', 'ok', 0)"))
    db.upgrade(engine)
    assert Catalog(engine).start_run("data", "hook", "post-snapshot", T0) > 0
    engine.dispose()
