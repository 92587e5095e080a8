"""Selecting a job's datasets by a ZFS user property 
(docs/decisions.md#datasets-are-selected-by-a-user-property), through the CLI on
real zfs-fuse pools: ``zbak list datasets``, ``init``, ``snapshot``, ``replicate``,
``archive``, ``audit``, ``prune`` and ``status`` all see the same datasets; a received value and another job's
replica target are never selected; ``min_change`` degrades on zfs-fuse (no ``written``).

The pool ``SRC`` is the job's root, as in zfs-autobackup's whole-pool model::

    SRC                 zbak:job=nightly (local)    selected
    SRC/db              inherited                   selected
    SRC/db/logs         inherited                   selected
    SRC/home/tmp        false                       left out
    SRC/home/tmp/keep   nightly (local)             selected again below a false parent
    SRC/other           weekly                      another job's
    SRC/rcv             nightly (received, send -p) a replica
    SRC/bk              inherited                   target of job ``pull``: a replica

Expected facts are read with plain ``zfs`` commands, independently of the code under test.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from support.cli import initialised, snapshots, zfs

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs

SELECTED = ["", "/db", "/db/logs", "/home", "/home/tmp/keep"]
LEFT_OUT = {"/home/tmp": "zbak:job=false", "/other": "zbak:job=weekly",
            "/rcv": "was received", "/bk": "a replica: target of job pull"}


@pytest.fixture
def rig(make_pool, tmp_path, capsys):
    src, bak = make_pool(), make_pool()
    root, backup = src.name, bak.name
    for child in ("db", "db/logs", "home", "home/tmp", "home/tmp/keep", "other", "bk"):
        zfs("create", f"{root}/{child}")
    zfs("create", f"{backup}/src")
    zfs("create", f"{backup}/seed")
    for name, value in ((root, "nightly"), (f"{root}/home/tmp", "false"),
                        (f"{root}/home/tmp/keep", "nightly"), (f"{root}/other", "weekly"),
                        (f"{backup}/seed", "nightly")):
        zfs("set", f"zbak:job={value}", name)
    zfs("snapshot", f"{backup}/seed@s")
    send = subprocess.Popen(["zfs", "send", "-p", f"{backup}/seed@s"], stdout=subprocess.PIPE)
    subprocess.run(["zfs", "receive", f"{root}/rcv"], stdin=send.stdout, check=True, timeout=60)
    assert send.wait(60) == 0
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    run = initialised(tmp_path, f"""
        [stores.cold]
        url = "file://{store}"
        [jobs.nightly]
        dataset = "{root}"
        select = {{ property = "zbak:job", value = "nightly" }}
        [jobs.nightly.snapshot]
        retention = {{ keep_last = 1 }}
        [jobs.nightly.replicate]
        targets = ["local:{backup}/r"]
        [jobs.nightly.archive]
        store = "cold"
        [jobs.pull]
        dataset = "{backup}/src"
        [jobs.pull.replicate]
        targets = ["local:{root}/bk"]
    """, capsys, checks=True)
    return run, root, backup, run.config


def test_list_datasets_shows_every_selected_dataset_and_why_each_other_one_is_left_out(rig):
    run, root, _, _ = rig

    status, out, err = run("list", "datasets", "nightly", "--json")

    assert status == ExitStatus.OK, err
    rows = {r["dataset"]: r for r in json.loads(out)}
    assert sorted(d for d, r in rows.items() if r["selected"]) == sorted(
        root + s for s in SELECTED)
    for child, why in LEFT_OUT.items():
        assert not rows[root + child]["selected"]
        assert why in rows[root + child]["reason"], rows[root + child]


def test_init_reports_what_the_job_selects(rig):
    run, _, _, _ = rig

    status, out, err = run("init", "--json")

    assert status == ExitStatus.OK, err
    (check,) = [c for c in json.loads(out)["checks"] if c["subject"] == "job nightly: selection"]
    assert check["ok"] and f"selects {len(SELECTED)} dataset(s)" in check["detail"]


def test_snapshot_replicate_prune_and_status_all_work_on_the_selected_datasets_only(rig):
    run, root, backup, _ = rig

    status, out, err = run("snapshot", "nightly", "--json")
    assert status == ExitStatus.OK, err
    (taken,) = json.loads(out)
    assert sorted(taken["datasets"]) == sorted(root + s for s in SELECTED)
    assert not taken["atomic"]  # zfs-fuse takes one name per `zfs snapshot`
    short = taken["snapshot"]
    for child in LEFT_OUT:
        assert short not in snapshots(root + child)

    status, out, err = run("replicate", "nightly", "--json")
    assert status == ExitStatus.OK, out + err
    for suffix in SELECTED:
        got = zfs("get", "-Hp", "-o", "value", "guid", f"{backup}/r{suffix}@{short}").strip()
        assert got == zfs("get", "-Hp", "-o", "value", "guid", f"{root}{suffix}@{short}").strip()
    listed = zfs("list", "-H", "-o", "name", "-r", f"{backup}/r").split()
    assert f"{backup}/r/other" not in listed and f"{backup}/r/rcv" not in listed
    assert f"{backup}/r/bk" not in listed
    assert snapshots(f"{backup}/r/home/tmp") == []  # only a parent for keep, nothing sent

    status, out, err = run("prune", "nightly", "--dry-run", "--json")
    assert status == ExitStatus.OK, err
    planned = {row["snapshot"].split("@")[0] for row in json.loads(out)["decisions"]}
    assert planned == {root + s for s in SELECTED}

    status, out, err = run("status", "nightly", "--json")
    assert status == ExitStatus.OK, err
    (state,) = json.loads(out)
    assert state["snapshots"] == len(SELECTED)
    (target,) = state["targets"]
    assert target["cursor"] == short
    assert {d["dataset"] for d in target["datasets"]} == {root + s for s in SELECTED}


def test_changing_the_property_changes_what_the_next_run_selects(rig):
    run, root, _, _ = rig
    zfs("set", "zbak:job=false", f"{root}/db")

    status, out, err = run("snapshot", "nightly", "--json")

    assert status == ExitStatus.OK, err
    (taken,) = json.loads(out)
    assert f"{root}/db" not in taken["datasets"] and f"{root}/db/logs" not in taken["datasets"]
    zfs("inherit", "zbak:job", f"{root}/db")
    status, out, err = run("list", "datasets", "nightly", "--json")
    assert {r["dataset"] for r in json.loads(out) if r["selected"]} >= {f"{root}/db"}


def test_min_change_on_zfs_fuse_snapshots_every_selected_dataset_and_says_why(rig):
    run, root, _, config = rig
    config.write_text(config.read_text().replace(
        "retention = { keep_last = 1 }", "retention = { keep_last = 1 }\nmin_change = \"1M\""))

    status, out, err = run("snapshot", "nightly", "--json")

    assert status == ExitStatus.OK, err
    (taken,) = json.loads(out)
    assert sorted(taken["datasets"]) == sorted(root + s for s in SELECTED)
    assert taken["unchanged"] == []
    assert any("no 'written' property" in note for note in taken["notes"])
    status, out, _ = run("init", "--json")
    (check,) = [c for c in json.loads(out)["checks"] if c["subject"] == "job nightly: selection"]
    assert "min_change cannot be applied" in check["detail"]


def test_a_selection_matching_nothing_snapshots_nothing_and_says_so(rig):
    run, root, _, config = rig
    config.write_text(config.read_text().replace('value = "nightly"', 'value = "nigthly"'))

    status, out, err = run("snapshot", "nightly", "--json")

    assert status == ExitStatus.OK, err
    (taken,) = json.loads(out)
    assert taken["datasets"] == []
    assert any("matches no dataset" in note for note in taken["notes"]), taken
    assert snapshots(root) == []


def test_archive_and_audit_work_on_the_selected_datasets_only(rig):
    run, root, _, _ = rig
    assert run("snapshot", "nightly")[0] == ExitStatus.OK

    status, out, err = run("archive", "nightly", "--json")
    assert status == ExitStatus.OK, out + err
    status, out, err = run("list", "streams", "nightly", "--json")

    assert status == ExitStatus.OK, err
    assert sorted({s["dataset"] for s in json.loads(out)}) == sorted(root + s for s in SELECTED)
    status, out, err = run("audit", "nightly", "--json")
    assert status == ExitStatus.OK, out + err
    (audited,) = json.loads(out)["jobs"]
    assert audited["streams"] == len(SELECTED)
