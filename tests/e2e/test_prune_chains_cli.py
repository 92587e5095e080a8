"""``zbak prune`` end to end on zfs-fuse pools: archive chains in a ``file://`` store (whole
chains only, after a newer verified full, never a damaged chain), the archive base kept on the
source, and replica-side retention on a target reached over a real sshd."""

from __future__ import annotations

import datetime as dt
import json
import os
import textwrap
from pathlib import Path

import pytest
from support.cli import run_zbak, zfs
from support.common import hosts_table

from zrepl_py.catalog.db import make_engine
from zrepl_py.catalog.repository import Catalog
from zrepl_py.config.loading import load_config
from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs
HOLD = "zbak:data:archive:cold"


def snapshot_names(dataset: str) -> list[str]:
    out = zfs("get", "-Hp", "-r", "-o", "name,property,value", "createtxg", dataset)
    rows = [line.split("\t") for line in out.splitlines()]
    snaps = [(int(v), n.split("@", 1)[1]) for n, _, v in rows if n.startswith(dataset + "@")]
    return [n for _, n in sorted(snaps)]


def store_files(store: Path) -> set[str]:
    return {str(p.relative_to(store)) for p in store.rglob("*") if p.is_file()}


def day(n: int) -> str:
    return f"zbak_202601{n:02d}T000000Z"


class Cli:
    def __init__(self, config: Path, capsys):
        self.config, self.capsys = config, capsys

    def __call__(self, *args: str):
        return run_zbak("--config", str(self.config), *args)

    def json(self, *args: str):
        status, out, err = self(*args, "--json")
        assert status == ExitStatus.OK, out + err
        return json.loads(out)

    def catalog(self) -> Catalog:
        return Catalog(make_engine(load_config(self.config).catalog_url))


class Archived:
    """DATA on a pool, a file:// store, a job archiving it with keep_chains = 1."""

    def __init__(self, zpool, tmp_path: Path, capsys):
        self.data = f"{zpool.name}/data"
        zfs("create", self.data)
        self.mount = Path(zfs("get", "-Hp", "-o", "value", "mountpoint", self.data).strip())
        self.store = tmp_path / "store"
        self.store.mkdir()
        config = tmp_path / "zbak.toml"
        config.write_text(textwrap.dedent(f"""
            state_dir = "{tmp_path / 'state'}"
            [stores.cold]
            url = "file://{self.store}"
            volume_size = "256KiB"
            [jobs.data]
            dataset = "{self.data}"
            [jobs.data.snapshot]
            retention = {{ keep_last = 1 }}
            [jobs.data.archive]
            store = "cold"
            keep_chains = 1
        """))
        self.run = Cli(config, capsys)
        assert self.run("init", "--no-checks")[0] == ExitStatus.OK

    def snap(self, n: int) -> None:
        (self.mount / f"f{n}.bin").write_bytes(os.urandom(200_000))
        zfs("snapshot", f"{self.data}@{day(n)}")

    def archive(self, *extra: str) -> None:
        status, out, err = self.run("archive", *extra)
        assert status == ExitStatus.OK, out + err

    def streams(self, plan: dict) -> dict[str, dict]:
        """The prune plan's stream rows by ``full @SNAP`` / ``incremental @A -> @B`` (short
        day numbers)."""
        return {r["stream"].replace("zbak_202601", "").replace("T000000Z", ""): r
                for r in plan["streams"]}

    def verify(self, snap: int) -> None:
        catalog = self.run.catalog()
        (full,) = [s for s in catalog.streams(dataset=self.data)
                   if s.kind == "full" and s.to_name == day(snap)]
        catalog.set_stream_state(full.id, "verified", dt.datetime.now(dt.UTC))


@pytest.fixture
def arch(zpool, tmp_path, capsys):
    return Archived(zpool, tmp_path, capsys)


def test_a_single_full_is_kept_as_the_newest_chain(arch):
    arch.snap(1)
    arch.archive()
    before = store_files(arch.store)
    plan = arch.run.json("prune")
    rows = arch.streams(plan)
    assert list(rows) == ["full @01"]
    assert rows["full @01"]["action"] == "keep" and rows["full @01"]["reasons"] == ["newest chain"]
    assert store_files(arch.store) == before


def test_an_unverified_new_full_keeps_the_old_chain_and_verifying_it_releases_the_whole_chain(arch):
    for n in (1, 2, 3):
        arch.snap(n)
    arch.archive()                       # chain A: full @01, -I @01 -> @03
    arch.snap(4)
    arch.archive("--full")               # chain B: full @04
    old = {s.object_prefix for s in arch.run.catalog().streams(dataset=arch.data)
           if s.to_name in (day(1), day(3))}

    rows = arch.streams(arch.run.json("prune"))
    for label in ("full @01", "incremental @01 -> @03"):
        assert rows[label]["action"] == "keep"
        assert "not verified yet" in rows[label]["reasons"][0], rows[label]
    assert all(any(f.startswith(p) for f in store_files(arch.store)) for p in old)
    # the closed chain's tip @03 lost its archive hold, so source retention could take it
    assert snapshot_names(arch.data) == [day(4)]

    arch.verify(4)
    status, out, err = arch.run("prune", "--dry-run")
    assert status == ExitStatus.OK, out + err
    assert "dry run: nothing deleted" in out and "beyond keep_chains" in out
    assert all(any(f.startswith(p) for f in store_files(arch.store)) for p in old)
    plan = arch.run.json("prune")
    rows = arch.streams(plan)
    assert rows["full @01"]["action"] == rows["incremental @01 -> @03"]["action"] == "delete"
    assert rows["full @04"]["reasons"] == ["newest chain"]
    assert len(plan["archive"]["data"]["datasets"][arch.data]["deleted"]) == 2
    assert [s.to_name for s in arch.run.catalog().streams(dataset=arch.data)] == [day(4)]
    assert not any(f.startswith(p) for f in store_files(arch.store) for p in old)
    assert arch.streams(arch.run.json("prune", "--dry-run")) == {"full @04": rows["full @04"]}


@pytest.mark.parametrize("victim", ["old chain", "newer chain"])
def test_an_incremental_object_deleted_behind_zbaks_back_makes_prune_leave_the_chain_alone(arch, victim):
    """docs/reliability.md#r19-prune-refuses-on-an-inconsistent-store (E): a volume deleted from the
    store behind zbak's back makes ``zbak prune`` exit 1 naming the inconsistent store; no object or
    catalog row is deleted."""
    for n in (1, 2):
        arch.snap(n)
    arch.archive()                       # chain A: full @01, -I @01 -> @02
    arch.snap(3)
    arch.archive("--full")               # chain B: full @03, then -I @03 -> @04
    arch.snap(4)
    arch.archive()
    arch.verify(3)
    streams = {s.to_name: s for s in arch.run.catalog().streams(dataset=arch.data)}
    incremental = streams[day(2) if victim == "old chain" else day(4)]
    gone = arch.run.catalog().volumes(incremental.id)[0].key
    (arch.store / gone).unlink()
    before = store_files(arch.store)

    status, out, err = arch.run("prune", "--json")
    assert status == ExitStatus.FAILED, out + err
    assert "store is inconsistent" in err and "deletes nothing" in err
    rows = arch.streams(json.loads(out))
    assert all(r["action"] == "keep" for r in rows.values())
    assert rows["full @01"]["action"] == rows["incremental @01 -> @02"]["action"] == "keep"
    why = " ".join(rows["full @01"]["reasons"])
    if victim == "old chain":
        assert "damaged" in why and "run zbak audit" in why and gone in why
    else:
        assert "has a damaged or bad stream" in why
        assert "damaged" in " ".join(rows["incremental @03 -> @04"]["reasons"])
    assert store_files(arch.store) == before
    assert len(arch.run.catalog().streams(dataset=arch.data)) == 4


def test_the_archive_base_stays_on_the_source_even_when_its_hold_is_released(arch):
    """docs/reliability.md#r21-replication-safety-in-pruning (E): the archive base survives prune
    even without its hold."""
    for n in (1, 2):
        arch.snap(n)
    arch.archive()                       # the chain ends at @02: the next -I starts there
    arch.snap(3)
    zfs("release", HOLD, f"{arch.data}@{day(2)}")
    plan = arch.run.json("prune")
    decisions = {d["snapshot"].split("@")[1]: d for d in plan["decisions"]}
    assert decisions[day(2)]["action"] == "keep"
    assert decisions[day(2)]["reasons"] == ["archive base (store cold)"]
    assert decisions[day(1)]["action"] == "destroy"
    assert snapshot_names(arch.data) == [day(2), day(3)]
    arch.archive()
    assert [s.from_name for s in arch.run.catalog().streams(dataset=arch.data)][-1] == day(2)


@pytest.mark.ssh
def test_replica_retention_destroys_only_old_zbak_snapshots_on_the_target_one_by_one(
        make_pool, sshd, tmp_path, capsys):
    src, bak = make_pool(), make_pool()
    data, replica = f"{src.name}/data", f"{bak.name}/replica"
    zfs("create", data)
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n'
                      + hosts_table("backup", sshd.host_config(), connect_timeout=5)
                      + textwrap.dedent(f"""
        [jobs.data]
        dataset = "{data}"
        [jobs.data.snapshot]
        retention = {{ keep_last = 5 }}
        [jobs.data.replicate]
        targets = ["backup:{replica}"]
        retention = {{ keep_last = 2 }}
    """))
    run = Cli(config, capsys)
    assert run("init", "--no-checks")[0] == ExitStatus.OK
    for n in range(1, 6):
        zfs("snapshot", f"{data}@{day(n)}")
    zfs("snapshot", f"{data}@manual")
    status, out, err = run("replicate")
    assert status == ExitStatus.OK, out + err
    zfs("hold", "admin", f"{replica}@{day(1)}")
    expected_kept = [day(1), day(4), day(5), "manual"]
    try:
        plan = run.json("prune", "--dry-run")
        rows = {r["snapshot"].split("@")[1]: r for r in plan["replica"]}
        assert {n for n, r in rows.items() if r["action"] == "destroy"} == {day(2), day(3)}
        assert rows[day(1)]["reasons"] == ["held (1 user ref)"]
        assert rows["manual"]["reasons"][:1] == ["not a zbak snapshot (never pruned)"]
        assert any("replication base" in r for r in rows["manual"]["reasons"])
        assert any("replication cursor" in r for r in rows["manual"]["reasons"])
        assert snapshot_names(replica) == [day(n) for n in range(1, 6)] + ["manual"]

        plan = run.json("prune")
        assert sorted(plan["replica_outcome"]["data"][f"backup:{replica}"]["destroyed"]) == [
            f"{replica}@{day(2)}", f"{replica}@{day(3)}"]
        assert snapshot_names(replica) == expected_kept
        assert snapshot_names(data) == [day(n) for n in range(1, 6)] + ["manual"]
        zfs("snapshot", f"{data}@{day(6)}")
        status, out, err = run("replicate", "--json")
        assert status == ExitStatus.OK, out + err
        assert snapshot_names(replica) == expected_kept + [day(6)]
    finally:
        zfs("release", "admin", f"{replica}@{day(1)}")
