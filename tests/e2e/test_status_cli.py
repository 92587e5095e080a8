"""``zbak status`` end to end on real zfs-fuse pools: last successes, lag in time and
snapshots, archive chain lengths, held bytes, runs in progress, transfers in progress (a real
rate-limited replication in the background) and next scheduled runs."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from support.cli import run_zbak, start_zbak, zfs

from zrepl_py.catalog import db
from zrepl_py.catalog.repository import Catalog
from zrepl_py.errors import ExitStatus
from zrepl_py.observe.transfers import RunningTransfer, Slot

pytestmark = pytest.mark.zfs
UTC = dt.UTC


def put(path, data: bytes) -> None:
    """Write and fsync: zfs-fuse sees page-cached FUSE writes only once they are flushed."""
    with open(path, "wb") as f:
        f.write(data)
        os.fsync(f.fileno())


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def parse(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


@pytest.fixture
def rig(make_pool, tmp_path, capsys):
    src, bak = make_pool(), make_pool()
    data, replica = f"{src.name}/data", f"{bak.name}/replica"
    zfs("create", data)
    zfs("create", f"{data}/child")
    (tmp_path / "store").mkdir()
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [hosts.gone]
        address = "127.0.0.1"
        port = {closed_port()}
        connect_timeout = "3s"
        known_hosts = "{tmp_path / 'known_hosts'}"
        [stores.cold]
        url = "file://{tmp_path / 'store'}"
        [jobs.j]
        dataset = "{data}"
        recursive = true
        [jobs.j.snapshot]
        schedule = "*/15 * * * *"
        [jobs.j.replicate]
        targets = ["local:{replica}"]
        schedule = "15 * * * *"
        [jobs.j.archive]
        store = "cold"
        schedule = "30 2 * * *"
        [jobs.remote]
        dataset = "gone:tank/away"
        [jobs.remote.snapshot]
        schedule = "0 3 * * 0"
    """))
    (tmp_path / "known_hosts").write_text("")

    def run(*args, ok=True):
        status, out, err = run_zbak("--config", str(config), *args)
        if ok:
            assert status == ExitStatus.OK, out + err
        return status, out, err

    run("init", "--no-checks")
    run.src, run.data, run.replica, run.state = src, data, replica, tmp_path / "state"
    return run


def catalog_of(rig) -> Catalog:
    return Catalog(db.make_engine(f"sqlite:///{rig.state / 'catalog.sqlite'}"))


def test_status_json_reports_successes_lag_chains_held_bytes_running_runs_and_next_runs(rig):
    put(rig.src.mountpoint / "data" / "old.bin", os.urandom(300_000))
    put(rig.src.mountpoint / "data" / "child" / "c.bin", os.urandom(50_000))
    rig("snapshot", "j")
    rig("replicate", "j")
    rig("archive", "j")
    (rig.src.mountpoint / "data" / "old.bin").unlink()
    os.sync()
    time.sleep(1.1)  # snapshot names have one-second resolution
    rig("snapshot", "j")
    time.sleep(1.1)
    rig("snapshot", "j")
    catalog = catalog_of(rig)
    started = dt.datetime.now(UTC).replace(microsecond=0)
    catalog.start_run("j", "archive", f"cold:{rig.data}", started)

    before = dt.datetime.now(UTC)
    status, out, _ = rig("status", "--json", "j")
    (job,) = json.loads(out)
    assert job["job"] == "j" and job["snapshots"] == 6, "three snapshots of data and of child"

    (target,) = job["targets"]
    assert target["target"] == f"local:{rig.replica}" and target["last_result"] == "ok"
    assert before - dt.timedelta(minutes=5) < parse(target["last_success"]) <= before
    assert target["lag_snapshots"] == 2 and target["lag_seconds"] >= 2
    assert [d["dataset"] for d in target["datasets"]] == [rig.data, f"{rig.data}/child"]
    assert all(d["lag_snapshots"] == 2 for d in target["datasets"])

    chains = {c["dataset"]: c for c in job["chains"]}
    assert set(chains) == {rig.data, f"{rig.data}/child"}
    assert chains[rig.data]["length"] == 1 and chains[rig.data]["chains"] == 1
    assert chains[rig.data]["store"] == "cold" and chains[rig.data]["stored_bytes"] > 0

    successes = {(s["action"], s["target"]) for s in job["last_success"]}
    assert {("snapshot", None), ("replicate", f"local:{rig.replica}"),
            ("archive", f"cold:{rig.data}")} <= successes

    assert job["held_error"] is None
    assert sorted(job["held_snapshots"]) == sorted(
        f"{d}@{n}" for d in (rig.data, f"{rig.data}/child")
        for n in [target["datasets"][0]["cursor"]])
    assert 300_000 <= job["held_bytes"] < 1_000_000, "the replicated snapshot pins old.bin"

    (running,) = job["running"]
    assert running["action"] == "archive" and running["target"] == f"cold:{rig.data}"
    assert parse(running["started_at"]) == started and running["seconds"] >= 0

    nxt = {a: parse(t) for a, t in job["next_runs"].items()}
    assert set(nxt) == {"snapshot", "replicate", "archive", "prune", "audit"}, "as the daemon plans"
    assert (nxt["audit"].weekday(), nxt["audit"].hour) == (6, 5), "[daemon] 0 5 * * 0: Sunday"
    assert nxt["snapshot"].minute % 15 == 0 and nxt["snapshot"] - before <= dt.timedelta(minutes=15)
    assert nxt["replicate"].minute == 15 and nxt["replicate"] - before <= dt.timedelta(hours=1)
    assert (nxt["archive"].hour, nxt["archive"].minute) == (2, 30)
    assert dt.timedelta(0) < nxt["archive"] - before <= dt.timedelta(days=1)


def test_status_tables_show_every_section_and_offline_reads_no_host(rig):
    put(rig.src.mountpoint / "data" / "f.bin", os.urandom(20_000))
    rig("snapshot", "j")
    rig("replicate", "j")
    rig("archive", "j")
    status, out, _ = rig("status")
    for title in ("jobs", "last runs", "replication targets", "archive chains"):
        assert title in out
    assert f"local:{rig.replica}" in out and "0 s" in out, "an up-to-date target lags 0"

    status, out, _ = rig("status", "--json", "--offline", "j")
    (job,) = json.loads(out)
    assert job["held_bytes"] is None and job["held_snapshots"] is None


def test_an_unreachable_source_host_is_reported_in_held_error_and_status_still_answers(rig):
    catalog = catalog_of(rig)
    catalog.sync_snapshots("gone", "tank/away", [], dt.datetime.now(UTC))
    catalog.set_cursor("remote", "local:bak/x", "gone", "tank/away", "bak/x", "zfs", "s1", 7, 10,
                       dt.datetime.now(UTC))
    started = time.monotonic()
    status, out, _ = rig("status", "--json", "remote")
    (job,) = json.loads(out)
    assert job["held_bytes"] is None and "cannot read held bytes on gone" in job["held_error"]
    assert time.monotonic() - started < 30
    assert parse(job["next_runs"]["snapshot"]).weekday() == 6, "Sunday 03:00 UTC"


def test_an_unknown_job_is_a_usage_error(rig):
    status, _, err = rig("status", "nope", ok=False)
    assert status == ExitStatus.USAGE and "nope" in err


def test_a_running_replication_shows_its_growing_bytes_rate_and_pid_and_is_gone_after_the_run(
        rig, tmp_path):
    config = tmp_path / "zbak.toml"
    config.write_text(config.read_text().replace(
        'schedule = "15 * * * *"', 'schedule = "15 * * * *"\nbandwidth_limit = 250000'))
    # 20 s at the limit: status runs (a process each, seconds on a loaded host) see it often
    put(rig.src.mountpoint / "data" / "big.bin", os.urandom(5_000_000))
    rig("snapshot", "j")
    (snap,) = [line.split("@")[1] for line in
               zfs("list", "-H", "-t", "snapshot", "-o", "name", "-d", "1", rig.data).split()]
    referenced = int(zfs("get", "-Hp", "-o", "value", "referenced", f"{rig.data}@{snap}"))
    # A file left by a zbak killed earlier: a PID that has exited.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = Slot(rig.state, "archive", "j", "cold")
    left.path.parent.mkdir(parents=True, exist_ok=True)
    left.path.write_bytes(RunningTransfer(
        "archive", "j", "cold", rig.data, None, "old", 5, None, None, None,
        dt.datetime.now(UTC), dt.datetime.now(UTC), dead.pid, None).to_json())

    proc = start_zbak("--config", str(config), "replicate", "j", text=True)
    seen, stale, table = [], [], ""
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            _, out, _ = rig("status", "--json", "--offline", "j")
            (job,) = json.loads(out)
            stale += job["stale_transfers"]
            mine = [t for t in job["transfers"] if t["dataset"] == rig.data]
            if mine and not table:
                table = rig("status", "--offline", "j")[1]
            seen += mine
            time.sleep(0.3)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == ExitStatus.OK, out + err

    (dropped,) = stale
    assert dropped["transfer"]["pid"] == dead.pid and "gone" in dropped["reason"]
    assert not left.path.exists(), "status removed the stale file"
    assert len(seen) >= 3, f"the 20 s transfer was seen {len(seen)} times"
    first, last = seen[0], seen[-1]
    for t in seen:
        assert (t["kind"], t["job"], t["where"]) == ("replicate", "j", f"local:{rig.replica}")
        assert (t["from_snapshot"], t["to_snapshot"]) == (None, snap), "a full of the snapshot"
        assert t["pid"] == proc.pid and t["rate_limit"] == 250000
        # zfs-fuse has no zfs send -nP: a full's expected size is its snapshot's referenced
        # (docs/design.md#running-transfers)
        assert (t["expected_bytes"], t["expected_source"]) == (referenced, "referenced")
        assert parse(t["started_at"]).utcoffset() == dt.timedelta(0)
    assert last["bytes"] > first["bytes"] and last["bytes"] <= 5_500_000
    rates = [t["rate"] for t in seen if t["rate"]]
    assert rates and all(50_000 < r < 750_000 for r in rates), f"about 250 kB/s: {rates}"
    etas = [t["eta_seconds"] for t in seen if t["eta_seconds"] is not None]
    assert etas and etas[-1] < etas[0], f"an ETA once the rate is known, falling: {etas}"
    assert "transfers" in table and str(proc.pid) in table and rig.data in table

    _, out, _ = rig("status", "--json", "--offline", "j")
    (job,) = json.loads(out)
    assert job["transfers"] == [] and job["stale_transfers"] == []
    assert list((rig.state / "running").iterdir()) == [rig.state / "running" / "queues"]
    assert list((rig.state / "running" / "queues").iterdir()) == [], "the run removed its files"
