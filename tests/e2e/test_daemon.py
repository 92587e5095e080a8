"""``zbak daemon`` end to end: a real daemon process with a seconds-scale schedule over
zfs-fuse pools, its schedule kept in the SQLite catalog, stopped with SIGTERM."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.cli import run_zbak, wait_for_bytes, zfs

from zrepl_py.catalog.db import make_engine
from zrepl_py.clock import FixedClock
from zrepl_py.config.loading import load_config
from zrepl_py.daemon.store import scheduled_runs
from zrepl_py.errors import ExitStatus
from zrepl_py.locking import dataset_lock

UTC = dt.UTC
NEVER = "0 0 1 1 *"  # keeps the cron schedules of actions a test does not drive out of the way


def snapshots(dataset: str) -> list[str]:
    out = zfs("get", "-Hp", "-r", "-o", "name,value", "guid", dataset)
    return [line.split("\t")[0].split("@")[1] for line in out.splitlines() if "@" in line]


def guids(dataset: str) -> dict[str, str]:
    out = zfs("get", "-Hp", "-r", "-o", "name,value", "guid", dataset)
    return {n.split("@")[1]: g for n, g in (l.split("\t") for l in out.splitlines()) if "@" in n}


def processes(pattern: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


class DaemonProcess:
    """``python -m zrepl_py --config CFG daemon`` with its JSON log lines in a file."""

    def __init__(self, config: Path, log: Path):
        self.log = log
        self.handle = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "zrepl_py", "--config", str(config),
                                      "daemon"], stdout=self.handle, stderr=subprocess.STDOUT)

    def records(self) -> list[dict]:
        lines = self.log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def wait_for(self, predicate, timeout: float = 30.0, what: str = "") -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [r for r in self.records() if predicate(r)]
            if found:
                return found
            assert self.proc.poll() is None, f"daemon exited: {self.log.read_text()}"
            time.sleep(0.2)
        pytest.fail(f"no {what or 'matching'} log record within {timeout} s:\n{self.log.read_text()}")

    def stop(self, timeout: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.handle.close()


def done(action: str):
    return lambda r: r["action"] == action and r["message"].startswith("done in")


class Rig:
    """Source pool with SRC/data, backup pool, a config and a catalog made by `zbak init`."""

    def __init__(self, make_pool, tmp_path: Path, capsys):
        self.src, self.bak = make_pool(), make_pool()
        self.data, self.replica = f"{self.src.name}/data", f"{self.bak.name}/replica"
        zfs("create", self.data)
        self.mount = self.src.mountpoint / "data"
        self.tmp, self.capsys = tmp_path, capsys
        self.state = tmp_path / "state"
        self.config = tmp_path / "zbak.toml"
        self.logs = 0

    def write_config(self, *, every: str, replicate: str = "", snapshot_schedule: str = NEVER):
        self.config.write_text(self.head(every) + textwrap.dedent(f"""
            [jobs.j]
            dataset = "{self.data}"
            [jobs.j.snapshot]
            schedule = "{snapshot_schedule}"
            retention = {{ keep_last = 100 }}
            [jobs.j.replicate]
            targets = ["local:{self.replica}"]
            schedule = "{NEVER}"
        """) + textwrap.dedent(replicate))

    def head(self, every: str) -> str:
        """The config's ``state_dir`` and ``[daemon]`` table: JSON logs, prune and audit out
        of the way, ``every`` (the inside of its inline table)."""
        return textwrap.dedent(f"""
            state_dir = "{self.state}"
            [daemon]
            log_format = "json"
            prune_schedule = "{NEVER}"
            audit_schedule = "{NEVER}"
            stop_timeout = "20s"
            every = {{ {every} }}
        """)

    def cli(self, *args: str):
        return run_zbak("--config", str(self.config), *args)

    def daemon(self) -> DaemonProcess:
        self.logs += 1
        return DaemonProcess(self.config, self.tmp / f"daemon-{self.logs}.log")

    def schedule(self) -> dict[str, dt.datetime | None]:
        config = load_config(self.config)
        engine = make_engine(config.catalog_url)
        try:
            return {r.action: r.next_run for r in scheduled_runs(engine, config.daemon)}
        finally:
            engine.dispose()


@pytest.fixture
def rig(make_pool, tmp_path, capsys):
    r = Rig(make_pool, tmp_path, capsys)
    r.write_config(every='snapshot = "3s"')
    assert r.cli("init", "--no-checks")[0] == ExitStatus.OK
    return r


def test_runs_missed_while_the_daemon_was_down_are_caught_up_exactly_once_at_start(rig):
    """docs/reliability.md#r30-scheduler (E): missed runs coalesce into one late run."""
    first = rig.daemon()
    first.wait_for(done("snapshot"), what="first snapshot run")
    assert first.stop() == 0
    due = rig.schedule()["snapshot"]
    assert due is not None and set(rig.schedule()) >= {"snapshot", "replicate", "prune"}
    while dt.datetime.now(UTC) < due + dt.timedelta(seconds=7):  # fire times due, +3s, +6s pass
        time.sleep(0.2)
    launched = dt.datetime.now(UTC)

    second = rig.daemon()
    (missed,) = second.wait_for(lambda r: r["message"].startswith("missed while"), what="missed")
    assert missed["action"] == "snapshot" and int(missed["message"].split(": ")[1].split()[0]) >= 3
    second.wait_for(lambda r: len([x for x in second.records() if done("snapshot")(x)]) >= 2,
                    what="catch-up run and one scheduled run")
    assert second.stop() == 0

    starts = [dt.datetime.fromisoformat(r["scheduled"]) for r in second.records()
              if r["action"] == "snapshot" and r["message"].startswith("due at")]
    # Up to when the missed runs were counted (not the launch: a slow start-up lets another
    # fire time pass, which the catch-up run then covers too).
    reconciled = dt.datetime.fromisoformat(missed["time"])
    assert launched < reconciled
    assert len([s for s in starts if s <= reconciled]) == 1, "one catch-up for three missed runs"
    runs = [r for d in (first, second) for r in d.records() if done("snapshot")(r)]
    assert len(snapshots(rig.data)) >= len(runs) >= 3
    assert all(set(r) >= {"time", "level", "logger", "message", "job", "action"}
               for d in (first, second) for r in d.records())


def test_a_scheduled_run_that_finds_the_dataset_locked_is_skipped_and_logged(rig):
    with dataset_lock(rig.state, f"local:{rig.data}", "manual snapshot (test)"):
        daemon = rig.daemon()
        (skipped,) = daemon.wait_for(lambda r: r["message"].startswith("skipped"), what="skip")[:1]
        assert "manual snapshot (test)" in skipped["message"]
        assert snapshots(rig.data) == []
    daemon.wait_for(done("snapshot"), what="snapshot after the lock was released")
    assert daemon.stop() == 0
    assert len(snapshots(rig.data)) >= 1


def _start_slow_replication(rig, every: str = 'replicate = "2s"') -> DaemonProcess:
    (rig.mount / "big.bin").write_bytes(os.urandom(3_000_000))
    zfs("snapshot", f"{rig.data}@s1")
    rig.write_config(every=every, replicate="bandwidth_limit = 250000\n")
    daemon = rig.daemon()
    daemon.wait_for(lambda r: r["action"] == "replicate" and r["message"].startswith("started"),
                    what="replication start")
    deadline = time.monotonic() + 20
    while not processes(f"zfs send {rig.data}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes(f"zfs send {rig.data}"), daemon.log.read_text()
    return daemon


def test_a_manual_run_during_a_scheduled_replication_exits_3_at_once(rig):
    """docs/reliability.md#r28-concurrent-runs (E): a manual replicate during the daemon's exits 3
    at once."""
    daemon = _start_slow_replication(rig)
    try:
        for command in ("replicate", "snapshot"):
            status, out, err = rig.cli(command)
            assert status == ExitStatus.LOCKED and "locked by pid" in err, out + err
            # at once: the transfer it would have waited for (12 s at 250 kB/s) still runs
            assert processes(f"zfs send {rig.data}"), "the scheduled transfer went on"
    finally:
        assert daemon.stop() == 0


def test_sigterm_mid_replication_stops_the_transfer_exits_0_and_the_next_start_completes_it(rig):
    daemon = _start_slow_replication(rig)
    wait_for_bytes(rig.state, "replicate", daemon.proc)  # mid-stream
    stopped_at = dt.datetime.now(UTC)
    assert daemon.stop() == 0
    assert processes(f"zfs send {rig.data}") == [] and processes(rig.replica) == []
    assert any(r["message"].startswith("interrupted by shutdown") for r in daemon.records())
    assert rig.schedule()["replicate"] <= stopped_at, "the interrupted run is due again"
    assert "s1" not in (guids(rig.replica) if rig.replica in zfs("list", "-H", "-o", "name") else {})

    rig.write_config(every='replicate = "2s"')  # same schedule, no bandwidth limit
    again = rig.daemon()
    again.wait_for(done("replicate"), what="replication after restart")
    assert again.stop() == 0
    assert guids(rig.replica) == guids(rig.data)


def test_a_run_still_queued_behind_another_at_sigterm_is_due_again_and_runs_at_the_next_start(rig):
    both = 'replicate = "2s", prune = "2s"'  # due together: prune waits at the job's gate
    daemon = _start_slow_replication(rig, every=both)
    (queued,) = [r for r in daemon.records()
                 if r["action"] == "prune" and r["message"].startswith("due at")][:1]
    assert daemon.stop() == 0
    prune = [r["message"] for r in daemon.records() if r["action"] == "prune"]
    assert any(m.startswith("not started") for m in prune)
    assert not any(m.startswith("started") for m in prune), prune
    assert rig.schedule()["prune"] == dt.datetime.fromisoformat(queued["scheduled"]), \
        "the queued run's due time is stored, not a later tick"

    rig.write_config(every=both)  # same schedule, no bandwidth limit
    again = rig.daemon()
    again.wait_for(done("prune"), what="the queued prune run after the restart")
    assert again.stop() == 0
    assert any(r["action"] == "prune" and r["message"].startswith("missed while")
               for r in again.records())


def test_the_schedule_table_lives_in_the_catalog_and_alembic_leaves_it_alone(catalog_url, tmp_path):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from zrepl_py.catalog.models import metadata
    from zrepl_py.daemon.store import include_object

    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[catalog]\nurl = "{catalog_url}"\n'
                      '[daemon]\nlog_format = "json"\nname = "t1"\n')
    assert run_zbak("--config", str(config), "init", "--no-checks").status == ExitStatus.OK
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    daemon.wait_for(lambda r: r["message"].startswith("daemon started"), what="start")
    assert daemon.stop() == 0
    engine = make_engine(load_config(config).catalog_url)
    try:
        with engine.connect() as connection:
            plain = MigrationContext.configure(connection, opts={"compare_type": True})
            flagged = compare_metadata(plain, metadata)
            assert {d[0] for d in flagged} == {"remove_table", "remove_index"}  # without the hook
            hooked = MigrationContext.configure(
                connection, opts={"compare_type": True, "include_object": include_object})
            assert compare_metadata(hooked, metadata) == []
        assert sa.inspect(engine).has_table("zbak_schedule_t1")
    finally:
        engine.dispose()
    assert run_zbak("--config", str(config), "init", "--no-checks").status == ExitStatus.OK


def test_plan_has_one_entry_per_job_and_scheduled_action_and_every_replaces_cron():
    from zrepl_py.config.schema import Config
    from zrepl_py.daemon.plan import plan_entries

    config = Config.model_validate({
        "daemon": {"every": {"replicate": "5s"}, "audit_schedule": None},
        "jobs": {
            "a": {"dataset": "p/a", "replicate": {"targets": ["local:q/a"]}},
            "b": {"dataset": "p/b", "snapshot": {"schedule": None}},
        },
    })
    assert [(e.id, e.schedule) for e in plan_entries(config)] == [
        ("a:snapshot", "cron 0 * * * *"),
        ("a:replicate", "every 5s"),
        ("a:prune", "cron 0 4 * * *"),
        ("b:prune", "cron 0 4 * * *"),
    ]


def test_plan_has_one_copy_entry_per_copy_store_with_a_schedule_running_copy_to_that_store():
    """docs/copies.md#the-copy-schedule: ``copy:STORE`` per scheduled copy table, after the
    archive; ``every.copy`` replaces the cron line of scheduled copies only."""
    from zrepl_py.config.schema import Config
    from zrepl_py.daemon.child import action_argv
    from zrepl_py.daemon.plan import plan_entries, split_id

    def entries(every: dict[str, str]) -> list[tuple[str, str, int]]:
        config = Config.model_validate({
            "daemon": {"every": every, "prune_schedule": None, "audit_schedule": None},
            "stores": {n: {"url": f"file:///s/{n}"} for n in ("a", "b", "c")},
            "jobs": {"j": {"dataset": "p/j", "snapshot": {"schedule": None},
                           "archive": {"store": "a"},
                           "copy": {"b": {"schedule": "15 3 * * *"}, "c": {}}}},
        })
        return [(e.id, e.schedule, e.order) for e in plan_entries(config)]

    assert entries({}) == [("j:archive", "cron 30 2 * * *", 2),
                           ("j:copy:b", "cron 15 3 * * *", 3)]
    assert entries({"copy": "2s"})[1] == ("j:copy:b", "every 2s", 3)
    assert split_id("j:copy:b") == ("j", "copy:b")
    assert action_argv(Path("/z.toml"), "copy:b", "j")[-6:] == [
        "--config", "/z.toml", "copy", "j", "--to", "b"]


def test_the_daemon_runs_a_scheduled_copy_to_its_store_only(rig):
    """docs/copies.md#the-copy-schedule (E): ``every.copy`` fires the copy of the store with a
    ``schedule`` (b) within seconds: ``zbak copy j --to b`` runs as a child, logged under
    action ``copy:b``, and b holds the archived stream; c, without a schedule, is not copied."""
    stores = {n: rig.tmp / n for n in ("a", "b", "c")}
    for path in stores.values():
        path.mkdir()
    rig.config.write_text(rig.head('copy = "2s"') + "".join(f'[stores.{n}]\nurl = "file://{path}"\n' for n, path in stores.items())
        + textwrap.dedent(f"""
        [jobs.j]
        dataset = "{rig.data}"
        [jobs.j.snapshot]
        schedule = "{NEVER}"
        [jobs.j.archive]
        store = "a"
        schedule = "{NEVER}"
        [jobs.j.copy.b]
        schedule = "{NEVER}"
        [jobs.j.copy.c]
    """))
    (rig.mount / "f.bin").write_bytes(os.urandom(100_000))
    zfs("snapshot", f"{rig.data}@s1")
    assert rig.cli("archive").status == ExitStatus.OK
    daemon = rig.daemon()
    try:
        daemon.wait_for(done("copy:b"), what="a scheduled copy to b")
    finally:
        assert daemon.stop() == 0
    assert not [r for r in daemon.records() if r["action"] == "copy:c"]
    assert [p.parent.name for p in stores["b"].rglob("manifest.json")] == [
        p.parent.name for p in stores["a"].rglob("manifest.json")] != []
    assert list(stores["c"].iterdir()) == []
    (state,) = json.loads(rig.cli("status", "--json").out)
    assert ("copy", f"b:{rig.data}") in {(s["action"], s["target"]) for s in state["last_success"]}
    assert "copy:b" in state["next_runs"] and "copy:c" not in state["next_runs"], state
    assert rig.cli("status", "--check").status == ExitStatus.OK
    textfile = rig.tmp / "zbak.prom"
    assert rig.cli("status", "--prom-textfile", str(textfile)).status == ExitStatus.OK
    metrics = textfile.read_text()
    assert f'zbak_last_success_timestamp_seconds{{action="copy",job="j",target="b:{rig.data}"}}' \
        in metrics and 'zbak_stale_after_seconds{action="copy"} 180000' in metrics, metrics


def test_a_dataset_gate_lets_actions_due_together_in_action_order_and_frees_waiters_on_stop():
    import threading

    from zrepl_py.daemon.gate import Gate

    gate, stop, entered = Gate(), threading.Event(), []

    def run(order: int) -> None:
        if gate.acquire(order, stop):
            entered.append(order)
            time.sleep(0.1)
            gate.release()

    threads = [threading.Thread(target=run, args=(o,)) for o in (3, 0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert entered == [0, 1, 3]

    assert gate.acquire(0, stop)
    waiter = threading.Thread(target=run, args=(1,))
    waiter.start()
    stop.set()
    waiter.join(5)
    assert not waiter.is_alive() and entered == [0, 1, 3], "the waiter gave up without entering"


class _SchedulerNow(dt.datetime):
    """What ``datetime`` means inside ``apscheduler.schedulers.base``, which reads the time
    only through ``datetime.now``: the test's clock instead of the wall clock."""

    clock: FixedClock

    @classmethod
    def now(cls, tz=None):
        return cls.clock.now().astimezone(tz)


def test_a_day_of_week_7_job_fires_on_sunday_and_not_before_under_an_injected_clock(
        rig, monkeypatch, caplog):
    """docs/decisions.md#cli-frictions-a-first-time-admin-met: ``0 4 * * 7`` (crontab(5): 7 is
    Sunday) passes validation and the daemon runs it on Sunday 04:00. The scheduler's clock starts
    on Saturday 03:59:59, so a Monday-is-0 reading (APScheduler's own) would have fired within a
    second."""
    import threading

    import apscheduler.schedulers.base

    from zrepl_py.daemon.scheduler import Daemon

    saturday = dt.datetime(2026, 3, 7, 3, 59, 59, tzinfo=UTC)
    sunday = dt.datetime(2026, 3, 8, 4, tzinfo=UTC)
    rig.write_config(every="", snapshot_schedule="0 4 * * 7")  # load_config validates it
    _SchedulerNow.clock = FixedClock(saturday)
    # APScheduler reads the wall clock itself (docs/reliability.md#in-process-hooks-kept).
    monkeypatch.setattr(apscheduler.schedulers.base, "datetime", _SchedulerNow)
    caplog.set_level("INFO")
    daemon = Daemon(load_config(rig.config), rig.config)
    thread = threading.Thread(target=daemon.run, name="daemon under test")
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not any(r.getMessage().startswith("daemon started") for r in caplog.records):
            assert thread.is_alive() and time.monotonic() < deadline, caplog.text
            time.sleep(0.1)
        assert daemon.scheduler.get_job("j:snapshot").next_run_time == sunday
        _SchedulerNow.clock.advance(dt.timedelta(seconds=2))  # Saturday 04:00:01
        daemon.scheduler.wakeup()
        _SchedulerNow.clock.at = sunday
        daemon.scheduler.wakeup()
        while not any(r.getMessage().startswith("done in") for r in caplog.records):
            assert thread.is_alive() and time.monotonic() < deadline + 60, caplog.text
            time.sleep(0.2)
    finally:
        daemon.stop()
        thread.join(60)
    due = [r.getMessage() for r in caplog.records if r.getMessage().startswith("due at")]
    assert due == [f"due at {sunday.isoformat()}"], due
    assert len(snapshots(rig.data)) == 1
