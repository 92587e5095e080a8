"""Whole ``zbak`` CLI runs against real zfs-fuse pools: snapshot, prune, status, list, locks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time

import pytest
from support.cli import Zbak, zfs

from zrepl_py.errors import ExitStatus
from zrepl_py.locking import dataset_lock

pytestmark = pytest.mark.zfs


def destroy_when_not_busy(name: str) -> None:
    """zfs-fuse answers "dataset is busy" for a moment after an unmount
    (docs/testbed.md#zfs-fuse)."""
    for _ in range(20):
        if subprocess.run(["zfs", "destroy", name], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    zfs("destroy", name)


def snapshot_names(dataset: str) -> list[str]:
    out = zfs("get", "-Hp", "-r", "-o", "name,property,value", "createtxg", dataset)
    rows = [line.split("\t") for line in out.splitlines()]
    snaps = [(int(v), n) for n, _, v in rows if n.startswith(dataset + "@")]
    return [n for _, n in sorted(snaps)]


@pytest.fixture
def setup(zpool, tmp_path, capsys):
    """A pool with DATA (children ``a`` and ``scratch``), a config for it, and an initialised catalog."""
    data = f"{zpool.name}/data"
    for name in (data, f"{data}/a", f"{data}/scratch"):
        zfs("create", name)
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [jobs.main]
        dataset = "{data}"
        recursive = true
        exclude = ["scratch"]
        [jobs.main.snapshot]
        retention = {{ keep_last = 2 }}
        [jobs.flat]
        dataset = "{data}/a"
        [jobs.flat.snapshot]
        prefix = "flat"
        retention = {{ keep_last = 1 }}
    """))
    run = Zbak(config, capsys)
    status, out, err = run("init")
    assert status == ExitStatus.OK, out + err
    return run, data, tmp_path


def test_snapshot_takes_a_utc_named_snapshot_and_the_catalog_records_its_guid(setup):
    run, data, _ = setup
    status, out, err = run("snapshot", "flat")
    assert status == ExitStatus.OK, err
    (name,) = snapshot_names(f"{data}/a")
    assert re.fullmatch(rf"{data}/a@flat_\d{{8}}T\d{{6}}Z", name)
    status, out, _ = run("list", "snapshots", "flat", "--json")
    (row,) = json.loads(out)
    assert f"{row['dataset']}@{row['name']}" == name
    assert row["guid"] == int(zfs("get", "-Hp", "-o", "value", "guid", name))


def test_recursive_snapshot_covers_children_but_not_excluded_ones(setup):
    run, data, _ = setup
    assert run("snapshot", "main")[0] == ExitStatus.OK
    assert len(snapshot_names(data)) == 1
    assert len(snapshot_names(f"{data}/a")) == 1
    assert snapshot_names(f"{data}/scratch") == []


def test_prune_keeps_held_cloned_foreign_and_newest_snapshots_and_destroys_the_rest(setup):
    run, data, tmp_path = setup
    ds = f"{data}/a"
    own = [f"{ds}@flat_2026010{i}T000000Z" for i in range(1, 7)]
    for name in own[:3]:
        zfs("snapshot", name)
    zfs("snapshot", f"{ds}@before-upgrade")
    for name in own[3:]:
        zfs("snapshot", name)
    zfs("hold", "keep", own[0])
    zfs("clone", own[1], f"{data}/clone")
    try:
        status, out, err = run("prune", "flat", "--dry-run", "--json")
        assert status == ExitStatus.OK, err
        plan = {d["snapshot"]: d for d in json.loads(out)["decisions"]}
        assert len(snapshot_names(ds)) == 7, "a dry run destroys nothing"
        assert plan[own[0]]["action"] == "keep" and "held" in " ".join(plan[own[0]]["reasons"])
        assert plan[own[1]]["action"] == "keep" and "clone" in " ".join(plan[own[1]]["reasons"])
        assert plan[f"{ds}@before-upgrade"]["action"] == "keep"
        assert plan[own[5]]["action"] == "keep"
        assert {n for n, d in plan.items() if d["action"] == "destroy"} == {own[2], own[3], own[4]}

        status, out, err = run("prune", "flat")
        assert status == ExitStatus.OK, err
        assert snapshot_names(ds) == [own[0], own[1], f"{ds}@before-upgrade", own[5]]
        status, out, _ = run("list", "snapshots", "flat", "--all", "--json")
        destroyed = {f"{r['dataset']}@{r['name']}" for r in json.loads(out) if r["destroyed_at"]}
        assert destroyed == {own[2], own[3], own[4]}
    finally:
        destroy_when_not_busy(f"{data}/clone")
        zfs("release", "keep", own[0])


def test_a_second_run_on_a_locked_dataset_exits_3_at_once_and_touches_nothing(setup):
    """docs/reliability.md#r28-concurrent-runs (E): a locked dataset makes a second run exit 3 as a
    subprocess."""
    run, data, tmp_path = setup
    with dataset_lock(tmp_path / "state", f"local:{data}/a", "test"):
        proc = subprocess.run(
            [sys.executable, "-m", "zrepl_py", "--config", str(run.config), "snapshot", "flat"],
            capture_output=True, text=True, timeout=60,
        )
    assert proc.returncode == ExitStatus.LOCKED, proc.stderr
    assert "locked" in proc.stderr
    assert snapshot_names(f"{data}/a") == []


def test_status_reports_each_jobs_snapshots_and_last_runs(setup):
    run, data, _ = setup
    assert run("snapshot")[0] == ExitStatus.OK
    status, out, err = run("status", "--json")
    assert status == ExitStatus.OK, err
    jobs = {j["job"]: j for j in json.loads(out)}
    # data/a carries both jobs' snapshots; main also covers data (scratch is excluded)
    assert jobs["flat"]["snapshots"] == 2 and jobs["main"]["snapshots"] == 3
    runs = {(r["action"], r["result"]) for r in jobs["main"]["last_runs"]}
    assert ("snapshot", "ok") in runs
    assert jobs["main"]["next_runs"]["snapshot"]
    assert run("status")[0] == ExitStatus.OK


def test_an_unknown_job_is_a_usage_error(setup):
    run, _, _ = setup
    status, _, err = run("snapshot", "nope")
    assert status == ExitStatus.USAGE and "nope" in err


def test_a_failed_snapshot_is_recorded_as_a_failed_run_naming_the_dataset(setup):
    run, data, _ = setup
    with open(run.config, "a") as config:
        config.write(f'[jobs.ghost]\ndataset = "{data}/ghost"\n')
    status, _, err = run("snapshot", "ghost")
    assert status == ExitStatus.FAILED
    assert f"{data}/ghost" in err
    status, out, _ = run("status", "--json")
    ghost = {j["job"]: j for j in json.loads(out)}["ghost"]
    assert [(r["action"], r["result"]) for r in ghost["last_runs"]] == [("snapshot", "failed")]
