"""docs/decisions.md#datasets-are-selected-by-a-user-property and
docs/decisions.md#unchanged-datasets-skip-their-snapshot-atomically on real OpenZFS 2.3 (the QEMU
guest of tests/support/openzfs.py), through the CLI: ``min_change`` skips datasets whose ``written``
stayed under it (zbak runs ``zpool sync`` first: ``written`` lags until the txg syncs), the changed
ones are snapshotted together in one atomic multi-name ``zfs snapshot`` (one createtxg), and
replication and retention stay correct when some datasets of a recursive job skipped a snapshot; a
property received with ``zfs send -p``/``-R`` marks a replica that selection never takes. zfs-fuse
has neither ``written`` nor multi-name snapshots: this is the tier where those paths run.

zbak runs on this host; the source and the target are pools in the guest (``vm:``). What
zbak did is read back with plain ``zfs`` commands in the guest.
"""

from __future__ import annotations

import json
import textwrap
import time

import pytest
from support.cli import run_zbak
from support.common import hosts_table
from support.openzfs import COMMAND_TIMEOUT

from zrepl_py.errors import ExitStatus


class Guest:
    """Runs zbak against a config naming the guest ``vm``, and commands in the guest."""

    def __init__(self, vm, executor, tmp_path, capsys):
        self.vm, self.executor, self.capsys = vm, executor, capsys
        self.config = tmp_path / "zbak.toml"
        self.state = tmp_path / "state"

    def write_config(self, jobs: str) -> None:
        """Write the config with ``jobs`` and run ``zbak init`` (every check must pass)."""
        self.config.write_text(f'state_dir = "{self.state}"\n'
                               + hosts_table("vm", self.vm.host_config(), connect_timeout=30)
                               + textwrap.dedent(jobs))
        checks = self.zbak("init")["checks"]
        assert all(c["ok"] for c in checks), checks

    def zbak(self, *args: str):
        """``zbak --config CONFIG ARGS --json`` (a process); the parsed JSON output."""
        status, out, err = run_zbak("--config", str(self.config), *args, "--json")
        assert status == ExitStatus.OK, out + err
        return json.loads(out)

    def run(self, *argv: str) -> str:
        return self.executor.run(list(argv), timeout=COMMAND_TIMEOUT).text

    def write(self, path: str, kib: int) -> None:
        self.run("dd", "if=/dev/urandom", f"of={path}", "bs=1K", f"count={kib}", "status=none")

    def snaps(self, dataset: str) -> dict[str, tuple[int, int]]:
        """``{short: (guid, createtxg)}`` of the dataset's own snapshots ({} if it has none)."""
        done = self.executor.run(["zfs", "get", "-Hp", "-d", "1", "-t", "snapshot", "-o",
                                  "name,property,value", "guid,createtxg", dataset],
                                 check=False, timeout=COMMAND_TIMEOUT)
        found: dict[str, dict[str, int]] = {}
        for line in done.text.splitlines():
            name, prop, value = line.split("\t")
            found.setdefault(name.split("@", 1)[1], {})[prop] = int(value)
        return {short: (v["guid"], v["createtxg"]) for short, v in found.items()}


@pytest.fixture
def guest(openzfs_vm, openzfs_executor, tmp_path, capsys):
    return Guest(openzfs_vm, openzfs_executor, tmp_path, capsys)


def test_min_change_skips_unchanged_datasets_and_replication_and_retention_stay_correct(
    guest, openzfs_pools
):
    src, dst = openzfs_pools.source, openzfs_pools.target
    data = f"{src}/data"
    for name in (data, f"{data}/a", f"{data}/b", f"{data}/c"):
        guest.run("zfs", "create", name)
    guest.write_config(f"""
        [jobs.j]
        dataset = "vm:{data}"
        recursive = true
        [jobs.j.snapshot]
        min_change = "1"
        retention = {{ keep_last = 1 }}
        [jobs.j.replicate]
        targets = ["vm:{dst}/r"]
    """)
    everything = [data, f"{data}/a", f"{data}/b", f"{data}/c"]

    (first,) = guest.zbak("snapshot")
    assert sorted(first["datasets"]) == everything and first["atomic"]  # zfs snapshot -r
    guest.zbak("replicate")

    time.sleep(1.1)  # snapshot names have one-second resolution
    guest.write(f"/{data}/b/file", 256)  # no sync here: zbak's own `zpool sync` must see it
    (second,) = guest.zbak("snapshot")
    assert second["datasets"] == [f"{data}/b"]
    assert sorted(u["dataset"] for u in second["unchanged"]) == [data, f"{data}/a", f"{data}/c"]
    assert all("under min_change 1" in u["reason"] for u in second["unchanged"])

    time.sleep(1.1)
    guest.write(f"/{data}/a/file", 64)
    guest.write(f"/{data}/c/file", 64)
    (third,) = guest.zbak("snapshot")
    assert sorted(third["datasets"]) == [f"{data}/a", f"{data}/c"] and third["atomic"]
    # one multi-name `zfs snapshot`: both snapshots come from the same transaction group
    assert (guest.snaps(f"{data}/a")[third["snapshot"]][1]
            == guest.snaps(f"{data}/c")[third["snapshot"]][1])

    rows = guest.zbak("replicate")["rows"]
    assert all(not r["error"] for r in rows), rows
    for dataset in everything:
        replica = dataset.replace(data, f"{dst}/r")
        assert {s: g for s, (g, _) in guest.snaps(replica).items()} == {
            s: g for s, (g, _) in guest.snaps(dataset).items()}

    guest.zbak("prune")
    newest = {d: max(guest.snaps(d).items(), key=lambda kv: kv[1][1])[0] for d in everything}
    assert newest == {data: first["snapshot"], f"{data}/a": third["snapshot"],
                      f"{data}/b": second["snapshot"], f"{data}/c": third["snapshot"]}
    assert all(len(guest.snaps(d)) == 1 for d in everything)  # keep_last = 1 everywhere

    time.sleep(1.1)
    guest.write(f"/{data}/b/file2", 64)
    (fourth,) = guest.zbak("snapshot")
    assert fourth["datasets"] == [f"{data}/b"]
    rows = guest.zbak("replicate")["rows"]
    assert all(not r["error"] for r in rows), rows
    assert fourth["snapshot"] in guest.snaps(f"{dst}/r/b")


def test_a_property_received_with_send_p_or_r_marks_a_replica_selection_never_takes(
    guest, openzfs_pools
):
    src, dst = openzfs_pools.source, openzfs_pools.target
    guest.run("zfs", "create", f"{src}/data")
    guest.run("zfs", "create", f"{src}/data/sub")
    guest.run("zfs", "set", "zbak:nightly=true", f"{src}/data")
    guest.run("zfs", "snapshot", "-r", f"{src}/data@seed")
    guest.run("sh", "-c", f"zfs send -R {src}/data@seed | zfs receive {dst}/copy")
    guest.run("zfs", "create", f"{dst}/mine")
    guest.run("zfs", "set", "zbak:nightly=true", f"{dst}/mine")
    guest.write_config(f"""
        [jobs.j]
        dataset = "vm:{dst}"
        select = {{ property = "zbak:nightly" }}
        [jobs.j.snapshot]
        min_change = "1"
    """)

    rows = {r["dataset"]: r for r in guest.zbak("list", "datasets")}

    assert [d for d, r in rows.items() if r["selected"]] == [f"{dst}/mine"]
    assert "zbak:nightly was received (exclude_received)" in rows[f"{dst}/copy"]["reason"]
    assert f"was received from {dst}/copy" in rows[f"{dst}/copy/sub"]["reason"]
    (taken,) = guest.zbak("snapshot")
    assert taken["datasets"] == [f"{dst}/mine"] and taken["notes"] == []
    assert list(guest.snaps(f"{dst}/copy")) == ["seed"]
