"""Holds stay bounded when initial replications fail, and ``zbak holds release-stale`` frees
what no owner needs so pruning can proceed
(docs/reliability.md#r23-interrupted-initial-replication-leaves-no-unbounded-holds; zrepl
#288/#826): real zfs-fuse pools, a local ZFS target whose parent's quota makes the receive fail, the
CLI in-process.

zfs-fuse cannot list hold tags (``zfs holds`` fails), so holds are counted with ``userrefs``
and ``zbak holds list`` shows the tags it can name as candidates (``listed`` False)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
import support.cli
from support.cli import prop, zfs

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs
S1, S2 = "zbak_20260101T000000Z", "zbak_20260102T000000Z"


def userrefs(snapshot: str) -> int:
    return int(prop(snapshot, "userrefs"))


def snapshots(dataset: str) -> list[str]:
    out = zfs("get", "-Hp", "-r", "-o", "name,property,value", "createtxg", dataset)
    rows = [line.split("\t") for line in out.splitlines()]
    return [n.split("@", 1)[1] for n, _, v in sorted(rows, key=lambda r: int(r[2]))
            if n.startswith(dataset + "@")]


class Rig:
    def __init__(self, make_pool, tmp_path, capsys):
        self.src, self.bak = make_pool(), make_pool()
        self.data = f"{self.src.name}/data"
        zfs("create", self.data)
        zfs("create", f"{self.bak.name}/parent")
        self.target = f"{self.bak.name}/parent/replica"
        self.tmp = tmp_path
        self.config = tmp_path / "zbak.toml"
        self.write_config([self.target])
        self.run = support.cli.Zbak(self.config, capsys)
        assert self.run("init", "--no-checks")[0] == ExitStatus.OK
        mount = prop(self.data, "mountpoint")
        with open(os.path.join(mount, "a.bin"), "wb") as f:
            f.write(os.urandom(1_000_000))
        zfs("snapshot", f"{self.data}@{S1}")
        zfs("snapshot", f"{self.data}@{S2}")

    def write_config(self, targets):
        self.config.write_text(textwrap.dedent(f"""
            state_dir = "{self.tmp / 'state'}"
            [jobs.j]
            dataset = "{self.data}"
            [jobs.j.snapshot]
            retention = {{ keep_last = 1 }}
            [jobs.j.replicate]
            targets = {json.dumps(targets)}
        """))

    def holds_total(self) -> int:
        return sum(userrefs(f"{self.data}@{s}") for s in snapshots(self.data))

    def json(self, *args):
        status, out, err = self.run(*args, "--json")
        assert status == ExitStatus.OK, out + err
        return json.loads(out)


@pytest.fixture
def rig(make_pool, tmp_path, capsys):
    return Rig(make_pool, tmp_path, capsys)


def test_failed_initial_replications_leave_at_most_two_holds_and_release_stale_unblocks_prune(rig):
    """docs/reliability.md#r23-interrupted-initial-replication-leaves-no-unbounded-holds (Z): three
    initial replications refused by the target (quota) leave at most two zbak holds on the dataset
    (zbak leaves none); the successful run leaves one, on the base. A leftover hold on an older
    snapshot (a run killed between hold and release) blocks prune until ``zbak holds release-stale``
    releases it; the current base keeps its hold; then prune destroys the old snapshot."""
    zfs("set", "quota=256K", f"{rig.bak.name}/parent")
    for _ in range(3):
        status, out, err = rig.run("replicate")
        assert status != ExitStatus.OK, out + err
        assert rig.holds_total() <= 2
    assert rig.holds_total() == 0
    zfs("set", "quota=none", f"{rig.bak.name}/parent")
    status, out, err = rig.run("replicate")
    assert status == ExitStatus.OK, out + err
    tag = f"zbak:j:local:{rig.target}"
    assert userrefs(f"{rig.data}@{S2}") == 1 and rig.holds_total() == 1

    zfs("hold", tag, f"{rig.data}@{S1}")  # the leftover of a run killed mid-move
    rows = {(r["snapshot"].split("@")[1], r["tag"]): r for r in rig.json("holds", "list")["holds"]}
    assert rows[(S2, tag)]["status"] == "current"
    assert rows[(S1, tag)]["status"] == "stale"
    assert "not the current base" in rows[(S1, tag)]["reason"]

    rig.json("prune")
    assert snapshots(rig.data) == [S1, S2], "the held snapshot survives prune"

    plan = rig.json("holds", "release-stale", "--dry-run")
    assert [(r["snapshot"], r["tag"], r["released"]) for r in plan["released"]] == [
        (f"{rig.data}@{S1}", tag, False)]
    assert userrefs(f"{rig.data}@{S1}") == 1

    done = rig.json("holds", "release-stale")
    assert [(r["snapshot"], r["released"]) for r in done["released"]] == [(f"{rig.data}@{S1}", True)]
    assert userrefs(f"{rig.data}@{S1}") == 0 and userrefs(f"{rig.data}@{S2}") == 1
    assert rig.json("holds", "release-stale")["released"] == [], "idempotent"

    decisions = {d["snapshot"].split("@")[1]: d for d in rig.json("prune")["decisions"]}
    assert decisions[S1]["action"] == "destroy", decisions
    assert snapshots(rig.data) == [S2]


def test_the_hold_of_a_target_removed_from_the_config_is_stale_and_released(rig):
    """docs/reliability.md#r23-interrupted-initial-replication-leaves-no-unbounded-holds: once a
    target is no longer configured, its hold on the old base is stale (its owner is gone) and
    release-stale releases it; no hold of a configured owner is touched."""
    status, out, err = rig.run("replicate")
    assert status == ExitStatus.OK, out + err
    assert userrefs(f"{rig.data}@{S2}") == 1
    rig.write_config([f"{rig.bak.name}/other"])
    rows = rig.json("holds", "list")["holds"]
    old = [r for r in rows if r["tag"] == f"zbak:j:local:{rig.target}"]
    assert [(r["status"], r["snapshot"]) for r in old] == [("stale", f"{rig.data}@{S2}")]
    assert "not a target of job j any more" in old[0]["reason"]
    done = rig.json("holds", "release-stale")
    assert [r["released"] for r in done["released"]] == [True]
    assert rig.holds_total() == 0
