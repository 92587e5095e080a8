"""A PostgreSQL catalog shared by several hosts (the fleet set-up of
``examples/fleet-postgresql.toml``), as real ``zbak`` processes on zfs-fuse pools and the test
session's PostgreSQL 15 cluster.

* The whole cycle on PostgreSQL: snapshot, replicate, archive (two chains), a deep audit,
  prune (source retention and the older chain), audit, restore from the store.
* Two hosts: two state directories and two configs sharing the one catalog (and one
  ``file://`` store). Different jobs run at once and lose nothing; the same job's dataset is
  never worked on by both: while one host's run holds it (its pre hook is held on a FIFO,
  an event, not a sleep), the other host's run exits 3 and does nothing.

What each test expects is read from the pools with ``zfs``, from the store's files and from
the catalog's tables with plain SQL, not through zbak.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.cli import (
    ZBAK_TIMEOUT,
    Ran,
    content_of,
    restored_content,
    run_zbak,
    start_zbak,
    zfs,
)

pytestmark = [pytest.mark.zfs, pytest.mark.pg, pytest.mark.slow]

LOCKED = 3


class Host:
    """One zbak host: its own state directory and config, the shared catalog and store."""

    def __init__(self, tmp: Path, name: str, catalog_url: str, store: Path, jobs: str):
        home = tmp / name
        home.mkdir()
        self.config = home / "zbak.toml"
        self.config.write_text(f'state_dir = "{home / "state"}"\n' + textwrap.dedent(f"""
            [catalog]
            url = "{catalog_url}"
            [stores.cold]
            url = "file://{store}"
            volume_size = "1MiB"
        """) + textwrap.dedent(jobs))

    def __call__(self, *args: str) -> Ran:
        return run_zbak("--config", str(self.config), *args)

    def ok(self, *args: str) -> str:
        """Run ``zbak ARGS``; it must exit 0; return its stdout."""
        status, out, err = self(*args)
        assert status == 0, f"zbak {' '.join(args)}: exit {status}\n{out}{err}"
        return out

    def start(self, *args: str):
        return start_zbak("--config", str(self.config), *args, text=True)


def fill(dataset: str, name: str, size: int = 3_000_000) -> None:
    """Write ``size`` random bytes to file ``name`` of ``dataset``."""
    with open(Path(zfs("get", "-Hp", "-o", "value", "mountpoint", dataset).strip()) / name,
              "wb") as handle:
        handle.write(os.urandom(size))


def rows(url: str, query: str) -> list[tuple]:
    """The rows of ``query`` on the catalog, with plain SQL."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.text(query))]
    finally:
        engine.dispose()


def chains(url: str) -> dict[str, list[tuple]]:
    """Per dataset, its streams as ``(kind, to_name, from_guid, parent's to_guid)`` in id
    order, so a chain's links can be followed."""
    found: dict[str, list[tuple]] = {}
    for name, kind, to_name, from_guid, parent_guid in rows(url, """
            SELECT d.name, s.kind, s.to_name, s.from_guid, p.to_guid
            FROM streams s JOIN datasets d ON d.id = s.dataset_id
            LEFT JOIN streams p ON p.id = s.parent_id ORDER BY s.id"""):
        found.setdefault(name, []).append((kind, to_name, from_guid, parent_guid))
    return found


def wait_for_fifo(path: Path, writer: subprocess.Popen[str]) -> str:
    """What ``writer``'s hook writes into FIFO ``path``: waits for it (no sleep), failing
    with the writer's output if it ends first."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # no writer yet: poll() waits for one
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll(1000):
            if writer.poll() is not None:
                out, err = writer.communicate()
                pytest.fail(f"exit {writer.returncode} before its hook ran:\n{out}{err}")
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


def snapshots(dataset: str) -> list[str]:
    out = zfs("list", "-H", "-t", "snapshot", "-o", "name", "-s", "createtxg", "-d", "1", dataset)
    return [line.split("@", 1)[1] for line in out.splitlines()]


def test_the_whole_cycle_runs_on_a_postgresql_catalog(make_pool, pg_url, tmp_path):
    src, bak = make_pool(), make_pool()
    data = f"{src.name}/data"
    zfs("create", data)
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    host = Host(tmp_path, "a", pg_url, store, f"""
        [jobs.data]
        dataset = "{data}"
        [jobs.data.snapshot]
        retention = {{ keep_last = 2 }}
        [jobs.data.replicate]
        targets = ["local:{bak.name}/replica"]
        [jobs.data.archive]
        store = "cold"
        keep_chains = 1
    """)
    host.ok("init", "--no-checks")
    for step in (1, 2, 3):
        fill(data, f"f{step}.bin")
        host.ok("snapshot")
        host.ok("replicate")
        host.ok("archive", *(["--full"] if step == 3 else []))
    first, second, third = snapshots(data)
    assert snapshots(f"{bak.name}/replica") == [first, second, third]
    assert [(k, n) for k, n, _, _ in chains(pg_url)[data]] == [
        ("full", first), ("incremental", second), ("full", third)]

    host.ok("audit", "--deep")  # verifies the newer full, so prune may drop the older chain
    plan = json.loads(host.ok("prune", "--json"))
    assert snapshots(data) == [second, third], plan
    assert [(k, n) for k, n, _, _ in chains(pg_url)[data]] == [("full", third)], plan
    assert not [p for p in store.rglob("*") if first in str(p)], "chain A's objects deleted"
    host.ok("audit")

    restored = f"{src.name}/restored"
    host.ok("restore", data, "--to", f"@{third}", "--into", restored, "--from", "cold", "--yes")
    assert restored_content(restored) == content_of(f"{data}@{third}", src.name, "cmp")

    recorded = rows(pg_url, "SELECT action, target, result FROM runs ORDER BY id")
    replica, archive = f"local:{bak.name}/replica", f"cold:{data}"
    assert recorded == [("snapshot", None, "ok"), ("replicate", replica, "ok"),
                        ("archive", archive, "ok")] * 3 + [
        ("audit", None, "ok"), ("prune", None, "ok"), ("prune", "archive:cold", "ok"),
        ("audit", None, "ok"), ("restore", f"local:{restored}", "ok")], recorded


def test_two_hosts_share_the_catalog_and_never_work_on_one_dataset_at_once(
        make_pool, pg_url, tmp_path):
    src = make_pool()
    for name in ("a", "b", "shared"):
        zfs("create", f"{src.name}/{name}")
        fill(f"{src.name}/{name}", "base.bin")
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    ready, go = tmp_path / "ready", tmp_path / "go"
    os.mkfifo(ready)
    os.mkfifo(go)
    gate = json.dumps(["/bin/sh", "-c", f"echo held > {ready}; read answer < {go}"])

    def job(name: str, hook: bool = False) -> str:
        held = f"[jobs.{name}.hooks.archive]\npre = {gate}\ntimeout = \"5m\"\n" if hook else ""
        return (f'[jobs.{name}]\ndataset = "{src.name}/{name}"\n'
                f'[jobs.{name}.archive]\nstore = "cold"\n' + held)

    one = Host(tmp_path, "one", pg_url, store, job("a") + job("shared", hook=True))
    two = Host(tmp_path, "two", pg_url, store, job("b") + job("shared"))
    one.ok("init", "--no-checks")
    two.ok("init", "--no-checks")

    # different jobs at once: each host snapshots and archives its own dataset
    for action in ("snapshot", "archive"):
        runs = [one.start(action, "a"), two.start(action, "b")]
        for proc in runs:
            out, err = proc.communicate(timeout=ZBAK_TIMEOUT)
            assert proc.returncode == 0, out + err

    # the same job on both hosts: host one holds the dataset (its pre hook waits on a FIFO)
    one.ok("snapshot", "shared")
    holder = one.start("archive", "shared")
    assert wait_for_fifo(ready, holder) == "held\n"  # the hook runs inside the lock
    for action in ("archive", "snapshot", "prune"):
        status, out, err = two(action, "shared")
        assert status == LOCKED, f"zbak {action}: exit {status}\n{out}{err}"
        assert f"locked by pid {holder.pid} (archive)" in err, err
    assert holder.poll() is None, "host one still holds the dataset"
    with open(go, "w") as release:
        release.write("go\n")
    out, err = holder.communicate(timeout=ZBAK_TIMEOUT)
    assert holder.returncode == 0, out + err

    # now host two continues the chain host one began
    fill(f"{src.name}/shared", "more.bin")
    two.ok("snapshot", "shared")
    two.ok("archive", "shared")

    found = chains(pg_url)
    for name in ("a", "b"):
        assert [k for k, *_ in found[f"{src.name}/{name}"]] == ["full"]
    shared = found[f"{src.name}/shared"]
    assert [k for k, *_ in shared] == ["full", "incremental"], shared
    assert shared[1][2] == shared[1][3] is not None, "the incremental follows the full"
    assert snapshots(f"{src.name}/shared") == [shared[0][1], shared[1][1]]
    one.ok("audit")
    two.ok("audit")
    recorded = rows(pg_url, "SELECT job, action, result FROM runs ORDER BY id")
    assert sorted(recorded) == sorted(
        [(j, a, "ok") for j in ("a", "b") for a in ("snapshot", "archive")]
        + [("shared", "snapshot", "ok"), ("shared", "archive", "ok")] * 2
        + [("shared", "hook", "ok")]  # host one's pre hook
        + [(j, "audit", "ok") for j in ("a", "shared", "b", "shared")]), recorded
