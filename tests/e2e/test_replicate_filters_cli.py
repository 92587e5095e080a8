"""Snapshot filters per target (docs/decisions.md#snapshot-filters-keep-the-replication-base,
syncoid ``--include-snaps``/ ``--exclude-snaps``) through ``zbak replicate`` and ``zbak prune`` on
real zfs-fuse pools: a ZFS target and an rsync directory target each get only the snapshots their
filter admits, the replication base is used even when the filter excludes it, and a snapshot a
target never gets does not wait for it in retention. What arrived is read with plain ``zfs`` and
directory listings."""

from __future__ import annotations

import json
import time

import pytest
from support.cli import initialised, snapshots, zfs

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs

ORDER = ["a", "tmp1", "b", "tmp2", "tmp3", "c"]


def guid(snapshot: str) -> str:
    return zfs("get", "-Hp", "-o", "value", "guid", snapshot).strip()


@pytest.fixture
def rig(make_pool, tmp_path, capsys):
    src, bak = make_pool(), make_pool()
    data = f"{src.name}/data"
    zfs("create", data)
    for i, short in enumerate(ORDER):
        (src.mountpoint / "data" / f"f{i}").write_text(short)
        zfs("snapshot", f"{data}@{short}")
    tree = tmp_path / "tree"
    run = initialised(tmp_path, f"""
        [jobs.j]
        dataset = "{data}"
        [jobs.j.replicate]
        targets = ["{bak.name}/r", "local:{tree}"]
        [jobs.j.replicate.snapshot_filter."{bak.name}/r"]
        exclude = ["tmp*"]
        [jobs.j.replicate.snapshot_filter."local:{tree}"]
        include = ["b", "c", "d"]
    """, capsys)
    return run, src, data, f"{bak.name}/r", tree, run.config


def test_each_target_gets_only_the_snapshots_its_filter_admits(rig):
    run, _, data, replica, tree, _ = rig

    status, out, err = run("replicate", "--json")

    assert status == ExitStatus.OK, out + err
    assert snapshots(replica) == ["a", "b", "c"]
    assert all(guid(f"{replica}@{s}") == guid(f"{data}@{s}") for s in ("a", "b", "c"))
    assert sorted(p.name for p in (tree / "snapshots").iterdir()) == ["b", "c"]
    assert (tree / "snapshots" / "c" / "f5").read_text() == "c"
    plans = {r["target"]: r["plan"] for r in json.loads(out)["rows"]}
    assert "tmp" not in plans[f"local:{replica}"]


def test_the_base_is_used_when_a_changed_filter_excludes_it_and_replication_goes_on(rig):
    run, src, data, replica, _, config = rig
    assert run("replicate")[0] == ExitStatus.OK
    config.write_text(config.read_text().replace('exclude = ["tmp*"]',
                                                 'exclude = ["tmp*", "c"]'))
    for i, short in enumerate(["tmp4", "d"], start=len(ORDER)):
        (src.mountpoint / "data" / f"f{i}").write_text(short)
        zfs("snapshot", f"{data}@{short}")

    status, out, err = run("replicate", "--json")

    assert status == ExitStatus.OK, out + err
    assert snapshots(replica) == ["a", "b", "c", "d"]  # c stays: a filter removes nothing
    assert guid(f"{replica}@d") == guid(f"{data}@d")


def test_retention_does_not_keep_a_snapshot_for_a_target_whose_filter_excludes_it(
    make_pool, tmp_path, capsys
):
    src, bak = make_pool(), make_pool()
    data = f"{src.name}/data"
    zfs("create", data)
    run = initialised(tmp_path, f"""
        [jobs.j]
        dataset = "{data}"
        [jobs.j.snapshot]
        prefix = "often"
        retention = {{ keep_last = 1 }}
        [jobs.j.replicate]
        targets = ["{bak.name}/r"]
        snapshot_filter = {{ "{bak.name}/r" = {{ exclude = ["often_*"] }} }}
    """, capsys)
    assert run("snapshot")[0] == ExitStatus.OK
    time.sleep(1.1)  # snapshot names have one-second resolution
    assert run("snapshot")[0] == ExitStatus.OK
    older = f"{data}@{snapshots(data)[0]}"

    status, out, err = run("prune", "--json")

    assert status == ExitStatus.OK, out + err
    (decision,) = [d for d in json.loads(out)["decisions"] if d["snapshot"] == older]
    assert decision["action"] == "destroy", decision
    assert len(snapshots(data)) == 1
