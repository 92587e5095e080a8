"""Disaster: a tree replicated several datasets at once 
(docs/decisions.md#datasets-of-a-tree-replicate-several-at-once) meets a transfer that fails in the
middle, and a ``kill -9`` of zbak mid-run.

What must hold: no dataset starts after a failed transfer; every snapshot that reached the
target has its hold and cursor and nothing else does; a killed run leaves no transfer
running; and the next run settles every base, whatever the previous one did not get to.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from support.cli import start_zbak, zfs
from support.tree import TreeRig, cursors, random_bytes, snapshot_guids, userrefs

from zrepl_py.errors import ExitStatus
from zrepl_py.zfs.protect import hold_tag

pytestmark = [pytest.mark.zfs, pytest.mark.ssh]

MIB = 1024 * 1024


def bookkeeping(rig: TreeRig, short: str) -> tuple[set[str], set[str], set[str]]:
    """Source datasets whose replica has ``@short`` with the right guid, whose ``@short`` is
    held, and whose cursor names ``short``."""
    source, replica = snapshot_guids(rig.src), snapshot_guids(rig.replica)
    refs, where = userrefs(rig.src), cursors(rig.config, "t")
    arrived, held, recorded = set(), set(), set()
    for dataset in rig.datasets:
        name = dataset[len(rig.src):] + f"@{short}"
        if replica.get(name) == source[name]:
            arrived.add(dataset)
        if refs.get(name):
            held.add(dataset)
        if where.get(dataset) == short:
            recorded.add(dataset)
    return arrived, held, recorded


def test_a_transfer_failing_mid_tree_keeps_every_finished_base_and_the_next_run_completes(
        make_pool, sshd, tmp_path, capsys):
    children = [f"c{i:02d}" for i in range(30)]
    rig = TreeRig(make_pool, sshd, tmp_path, capsys, children, target="q/tree",
                  extra='concurrency = 4\nmethod = "zfs"\n')
    zfs("create", "-o", "quota=4M", f"{rig.bak_pool.name}/q")  # the backup side runs full
    rig.write("c15", "big.bin", random_bytes(8 * MIB))
    rig.snapshot("s1")

    status, out, err = rig.zbak("replicate")

    assert status == ExitStatus.FAILED, out + err
    assert "c15" in out + err
    arrived, held, recorded = bookkeeping(rig, "s1")
    assert f"{rig.src}/c15" not in arrived
    assert rig.src in arrived, "the root came first and arrived"
    assert held == arrived and recorded == arrived, (
        "held or recorded without the snapshot on the target, or the reverse")

    zfs("set", "quota=none", f"{rig.bak_pool.name}/q")
    status, out, err = rig.zbak("replicate")
    assert status == ExitStatus.OK, out + err
    arrived, held, recorded = bookkeeping(rig, "s1")
    assert arrived == held == recorded == set(rig.datasets)


def test_a_full_received_before_its_incremental_failed_keeps_its_hold_and_cursor(
        make_pool, sshd, tmp_path, capsys):
    """A first run plans a full of @s1, then an incremental to @s2; the incremental fails
    (the backup side over quota). @s1 reached the target, so it is held and recorded: the
    next run sends from it, and no prune may take it."""
    rig = TreeRig(make_pool, sshd, tmp_path, capsys, ["c00"], target="q/tree",
                  extra='concurrency = 2\nmethod = "zfs"\n')
    zfs("create", "-o", "quota=4M", f"{rig.bak_pool.name}/q")
    rig.snapshot("s1")
    rig.write("c00", "big.bin", random_bytes(8 * MIB))
    rig.snapshot("s2")

    status, out, err = rig.zbak("replicate")

    assert status == ExitStatus.FAILED, out + err
    c00 = f"{rig.src}/c00"
    arrived, held, recorded = bookkeeping(rig, "s1")
    assert c00 in arrived, "the full reached the target"
    assert c00 in held and c00 in recorded, "the snapshot that arrived is held and recorded"
    assert c00 not in bookkeeping(rig, "s2")[0]


def has_tag(snapshot: str, tag: str) -> bool:
    """Whether ``snapshot`` carries the hold ``tag`` (zfs-fuse has no ``zfs holds``): a
    second ``zfs hold`` of a tag fails, and a hold that was absent is taken back."""
    done = subprocess.run(["zfs", "hold", tag, snapshot], capture_output=True, text=True)
    if done.returncode == 0:
        zfs("release", tag, snapshot)
        return False
    assert "tag already exists" in done.stderr, done.stderr
    return True


def live(pattern: str) -> list[str]:
    """Command lines of the processes whose argv holds ``pattern``."""
    found = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def test_a_tree_killed_mid_run_leaves_no_transfer_and_the_next_run_moves_every_base(
        make_pool, sshd, tmp_path, capsys):
    children = [f"c{i:02d}" for i in range(16)]
    rig = TreeRig(make_pool, sshd, tmp_path, capsys, children, pool_size="1G",
                  extra='concurrency = 4\nbandwidth_limit = "4MiB"\n')
    rig.snapshot("s1")
    status, out, err = rig.zbak("replicate")
    assert status == ExitStatus.OK, out + err
    for child in [""] + children:  # 17 MiB at 4 MiB/s: several seconds of transfers
        rig.write(child, "big.bin", random_bytes(MIB))
    rig.snapshot("s2")

    log = tmp_path / "killed.log"
    with open(log, "wb") as stderr:
        proc = start_zbak("--config", str(rig.config), "--debug", "replicate",
                          stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 120
        while len(bookkeeping(rig, "s2")[0]) < 4:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no dataset arrived: " + log.read_text()[-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    arrived_at_kill = bookkeeping(rig, "s2")[0]
    assert arrived_at_kill != set(rig.datasets), "the run ended before it was killed"
    # every pipeline's pv started at its part of the shared limit: 4 MiB/s over 4 at once
    assert f"'pv', '-q', '-C', '-L', '{MIB}'" in log.read_text()

    deadline = time.monotonic() + 60  # stages die with zbak (setpriv --pdeathsig), the
    while live(rig.replica) or live(f"{rig.src}@"):  # receivers of the stream's end
        assert time.monotonic() < deadline, live(rig.replica) + live(f"{rig.src}@")
        time.sleep(0.2)

    status, out, err = rig.zbak("replicate")
    assert status == ExitStatus.OK, out + err
    arrived, held, recorded = bookkeeping(rig, "s2")
    assert arrived == held == recorded == set(rig.datasets)
    assert snapshot_guids(rig.replica) == snapshot_guids(rig.src)
    # By zbak's tag, not by userrefs: zfs-fuse keeps the holds a killed zfs send placed on
    # its from- and to-snapshot (seen: @s1 1 and @s2 2 on the 4 datasets in flight).
    tag = hold_tag("t", f"backup:{rig.replica}")
    for dataset in rig.datasets:
        assert has_tag(f"{dataset}@s2", tag), dataset
        assert not has_tag(f"{dataset}@s1", tag), f"{dataset}@s1 is still held"


def test_datasets_received_but_not_settled_when_zbak_died_get_their_holds_and_cursors_next(
        make_pool, sshd, tmp_path, capsys):
    """The state a ``kill -9`` leaves between a receive and its batch, made on purpose: the
    replicas have @s2, the holds and cursors still name @s1. The next run finds the tree up to
    date, sends nothing, and moves every hold and cursor to @s2."""
    from zrepl_py.catalog.db import make_engine
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.config.loading import load_config

    children = [f"c{i}" for i in range(5)]
    rig = TreeRig(make_pool, sshd, tmp_path, capsys, children, extra="concurrency = 3\n")
    rig.snapshot("s1")
    assert rig.zbak("replicate")[0] == ExitStatus.OK
    catalog = Catalog(make_engine(load_config(rig.config).catalog_url))
    at_s1 = catalog.cursors("t")
    rig.snapshot("s2")
    assert rig.zbak("replicate")[0] == ExitStatus.OK
    tag = hold_tag("t", f"backup:{rig.replica}")
    for dataset in rig.datasets[::2]:  # these died before their batch
        zfs("hold", tag, f"{dataset}@s1")
        zfs("release", tag, f"{dataset}@s2")
    catalog.set_cursors([c for c in at_s1 if c.source_dataset in rig.datasets[::2]])
    arrived, held, recorded = bookkeeping(rig, "s2")
    assert held == recorded == set(rig.datasets[1::2]) and arrived == set(rig.datasets)

    status, out, err = rig.zbak("--debug", "replicate")

    assert status == ExitStatus.OK, out + err
    assert "pipeline stage" not in err, "nothing is sent again"
    arrived, held, recorded = bookkeeping(rig, "s2")
    assert arrived == held == recorded == set(rig.datasets)
    assert sum(userrefs(rig.src).values()) == len(rig.datasets), "the @s1 holds were released"
