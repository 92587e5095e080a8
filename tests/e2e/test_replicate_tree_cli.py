"""``zbak replicate`` of a tree of 101 datasets over sshd, several datasets at once 
(docs/decisions.md#datasets-of-a-tree-replicate-several-at-once): parents before children, every
snapshot, hold and cursor in place, and a nightly cycle that moves every base."""

from __future__ import annotations

import json

import pytest
from support.cli import zfs
from support.tree import TreeRig, cursors, most_at_once, snapshot_guids, transfers, userrefs

from zrepl_py.errors import ExitStatus

pytestmark = [pytest.mark.zfs, pytest.mark.ssh]

# 10 children with 9 children each: a root and 100 datasets below it, three levels deep.
CHILDREN = [name for c in range(10)
            for name in [f"c{c}"] + [f"c{c}/g{g}" for g in range(9)]]


def test_a_tree_of_a_hundred_datasets_replicates_several_at_once_parents_first_every_base_held(
        make_pool, sshd, tmp_path, capsys):
    rig = TreeRig(make_pool, sshd, tmp_path, capsys, CHILDREN, extra="concurrency = 4\n")
    rig.snapshot("s1")
    for child in CHILDREN[::7]:
        rig.write(child, "more.txt", child.encode() * 100)
    rig.snapshot("s2")

    status, out, err = rig.zbak("--debug", "replicate", "--json")

    assert status == ExitStatus.OK, out[-2000:] + err[-4000:]
    assert snapshot_guids(rig.replica) == snapshot_guids(rig.src)
    rows = [r for r in json.loads(out)["rows"] if r["dataset"]]
    assert [r["dataset"] for r in rows] == rig.datasets, "outcomes in tree order"
    events = transfers(err)
    assert sorted(d for kind, d in events if kind == "start") == sorted(rig.datasets * 2)
    for dataset in rig.datasets[1:]:  # a new dataset's first receive needs its parent
        parent = dataset.rsplit("/", 1)[0]
        first = events.index(("start", dataset))
        last_of_parent = max(i for i, e in enumerate(events) if e == ("end", parent))
        assert last_of_parent < first, f"{dataset} started before {parent} was received"
    assert 1 < most_at_once(events) <= 4
    refs = userrefs(rig.src)
    assert {name: n for name, n in refs.items() if name.endswith("@s2")} == {
        d[len(rig.src):] + "@s2": 1 for d in rig.datasets}, "every new base is held"
    assert not any(n for name, n in refs.items() if name.endswith("@s1"))
    assert cursors(rig.config, "t") == {d: "s2" for d in rig.datasets}
    # zfs-fuse has no receive -o: the replicas' properties were set in batches, all of them
    got = zfs("get", "-H", "-r", "-o", "name,value,source", "readonly", rig.replica)
    assert {line.split("\t")[2] for line in got.splitlines() if "@" not in line} == {"local"}
    holds = err.count("run [local]: ['zfs', 'hold'")
    assert holds < len(rig.datasets), f"{holds} zfs hold commands: the holds were not batched"

    for child in [""] + CHILDREN:  # the nightly cycle: a little new data everywhere
        rig.write(child, "night.txt", b"x" * 4096)
    rig.snapshot("s3")
    status, out, err = rig.zbak("replicate", "--json")
    assert status == ExitStatus.OK, out[-2000:] + err[-4000:]
    rows = [r for r in json.loads(out)["rows"] if r["dataset"]]
    assert {r["plan"] for r in rows} == {"incremental -I s2 -> s3"}
    assert snapshot_guids(rig.replica) == snapshot_guids(rig.src)
    refs = userrefs(rig.src)
    assert sum(refs.values()) == len(rig.datasets), "one hold per dataset: the old ones released"
    assert all(refs[d[len(rig.src):] + "@s3"] == 1 for d in rig.datasets)
    assert cursors(rig.config, "t") == {d: "s3" for d in rig.datasets}


def test_one_dataset_at_a_time_when_concurrency_is_one(make_pool, sshd, tmp_path, capsys):
    children = [f"c{i}" for i in range(6)]
    rig = TreeRig(make_pool, sshd, tmp_path, capsys, children, extra="concurrency = 1\n")
    rig.snapshot("s1")
    status, out, err = rig.zbak("--debug", "replicate")
    assert status == ExitStatus.OK, out + err
    assert most_at_once(transfers(err)) == 1
    assert snapshot_guids(rig.replica) == snapshot_guids(rig.src)
