"""``zbak holds list`` and ``zbak holds release-stale`` against a real ``zfs holds`` (OpenZFS
2.3 in the QEMU guest of tests/support/openzfs.py; zfs-fuse cannot list hold tags), as real
``zbak`` processes.

A recursive job replicates ``vm:SRC/data`` (and its child ``c``) to ``vm:DST/replica``, so
zbak's own holds sit on both datasets' newest snapshot. The test then adds, with plain
``zfs hold`` in the guest: a stale zbak hold (on a snapshot that is no longer the base), the
hold of a job no longer configured, and foreign holds whose tags hold a tab, end in a tab,
hold a newline, or look like zbak's with a tab in the job's part. Expected values are read
with plain ``zfs holds`` in the guest, independently of the code under test.
"""

from __future__ import annotations

import ast
import json

import pytest
from support.cli import Ran, run_zbak
from support.common import replication_config
from support.openzfs import COMMAND_TIMEOUT

pytestmark = pytest.mark.slow

FOREIGN = ("for\teign", "tail\t", "new\nline", "zbak:go\tne:vm:x")
"""Tags of other software: a tab inside, a tab at the end, a newline, and one shaped like
zbak's whose job part holds a tab (no configured job can be named so)."""


class Rig:
    """Two guest pools, job ``j`` (recursive) replicating ``vm:SRC/data`` to
    ``vm:DST/replica``; ``zbak`` runs as a process on this host."""

    def __init__(self, vm, executor, pools, tmp_path):
        self.executor = executor
        self.data = f"{pools.source}/data"
        self.replica = f"{pools.target}/replica"
        self.tag = f"zbak:j:vm:{self.replica}"
        self.config = tmp_path / "zbak.toml"
        self.config.write_text(replication_config(
            tmp_path / "state", "vm", vm.host_config(), f"vm:{self.data}",
            [f"vm:{self.replica}"], connect_timeout=30, recursive=True))
        self.guest("zfs", "create", "-p", f"{self.data}/c")
        status, out, err = self.zbak("init", "--no-checks")
        assert status == 0, out + err

    def guest(self, *argv: str) -> str:
        """Run argv in the guest; return its stdout."""
        return self.executor.run(list(argv), timeout=COMMAND_TIMEOUT).text

    def holds(self, *snapshots: str) -> set[tuple[str, str]]:
        """``{(snapshot, tag)}`` of plain ``zfs holds -Hp``, split by hand: each record ends in
        a tab and the decimal timestamp, and begins with one of the named snapshots."""
        text = self.guest("zfs", "holds", "-Hp", *snapshots)
        found: set[tuple[str, str]] = set()
        while text:
            snap = next(s for s in snapshots if text.startswith(s + "\t"))
            rest = text[len(snap) + 1:]
            ends = [rest.index(f"\n{s}\t") for s in snapshots if f"\n{s}\t" in rest]
            record, text = (rest[:min(ends)], rest[min(ends) + 1:]) if ends else (rest, "")
            tag, stamp = record.rstrip("\n").rsplit("\t", 1)
            assert stamp.isdigit(), record
            found.add((snap, tag))
        return found

    def zbak(self, *args: str) -> Ran:
        return run_zbak("--config", str(self.config), *args)

    def json(self, *args: str) -> dict:
        status, out, err = self.zbak(*args, "--json")
        assert status == 0, out + err
        return json.loads(out)


@pytest.fixture
def rig(openzfs_vm, openzfs_executor, openzfs_pools, tmp_path):
    return Rig(openzfs_vm, openzfs_executor, openzfs_pools, tmp_path)


def test_holds_are_read_from_zfs_holds_and_only_the_stale_ones_are_released(rig):
    data, child = rig.data, f"{rig.data}/c"
    s1, s2, c1, c2 = f"{data}@s1", f"{data}@s2", f"{child}@s1", f"{child}@s2"
    every = (s1, s2, c1, c2)
    rig.guest("zfs", "snapshot", "-r", s1)
    status, out, err = rig.zbak("replicate")
    assert status == 0, out + err
    rig.guest("zfs", "snapshot", "-r", s2)
    assert rig.holds(*every) == {(s1, rig.tag), (c1, rig.tag)}, "zbak's bases, nothing else"

    gone = "zbak:gone:vm:old/replica"
    placed = {(s2, rig.tag): "stale",  # a run killed between its new hold and the release
              (c2, gone): "stale",  # a job no longer configured
              (s1, FOREIGN[0]): "foreign", (c2, FOREIGN[0]): "foreign",
              (s2, FOREIGN[1]): "foreign", (s1, FOREIGN[2]): "foreign",
              (c2, FOREIGN[3]): "foreign"}
    for snap, tag in placed:
        rig.guest("zfs", "hold", tag, snap)
    expected = {**placed, (s1, rig.tag): "current", (c1, rig.tag): "current"}
    assert rig.holds(*every) == set(expected)

    status, out, log = rig.zbak("--debug", "holds", "list", "--json")
    assert status == 0, out + log
    rows = json.loads(out)["holds"]
    assert {(r["snapshot"], r["tag"]): r["status"] for r in rows} == expected
    assert len(rows) == len(expected) and all(r["listed"] for r in rows), \
        "one row per hold, its tag read from zfs holds (not a candidate)"
    ran = [ast.literal_eval(line.split("run [vm]: ", 1)[1]) for line in log.splitlines()
           if "run [vm]: ['zfs', 'holds'" in line and "capability-probe" not in line]
    assert len(ran) == 1 and sorted(ran[0][3:]) == sorted(every), \
        f"one zfs holds for every held snapshot: {ran}"

    status, out, err = rig.zbak("holds", "list")
    assert status == 0, out + err
    assert len(out.splitlines()) == 2 + len(expected), f"one line per hold:\n{out}"
    assert "new\\nline" in out and "for\\teign" in out, "control characters shown escaped"

    done = rig.json("holds", "release-stale")["released"]
    assert {(r["snapshot"], r["tag"]) for r in done if r["released"]} == {(s2, rig.tag),
                                                                         (c2, gone)}
    assert rig.holds(*every) == {key for key, status in expected.items() if status != "stale"}, \
        "foreign holds and the current bases stay"
