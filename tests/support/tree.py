"""A tree of many datasets replicated over the session's sshd: the rig of the concurrency
tests (docs/decisions.md#datasets-of-a-tree-replicate-several-at-once) and what they read back
(guids, holds, cursors, the order of transfers in zbak's debug log)."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

from support.cli import initialised, zfs
from support.common import hosts_table


class TreeRig:
    """A source pool with ``SRC/tree`` and ``children``, a backup pool reached as host
    ``backup`` over the session's sshd, and job ``t`` replicating the tree (recursive) to
    ``backup:BAK/<target>``.

    Args:
        children: dataset names relative to the tree's root (``"c1"``, ``"c1/g2"``), parents
            listed before their children; each gets a small file.
        extra: TOML lines appended to ``[jobs.t.replicate]``.
    """

    def __init__(self, make_pool, sshd, tmp_path: Path, capsys, children: list[str], *,
                 target: str = "tree", extra: str = "", pool_size: str = "512M"):
        self.src_pool, self.bak_pool = make_pool(pool_size), make_pool(pool_size)
        self.src = f"{self.src_pool.name}/tree"
        self.replica = f"{self.bak_pool.name}/{target}"
        self.children = children
        zfs("create", self.src)
        for child in children:
            zfs("create", f"{self.src}/{child}")
            (self.mount(child) / "f.txt").write_text(child)
        self.tmp = tmp_path
        self.zbak = initialised(tmp_path, hosts_table("backup", sshd.host_config(),
                                                      connect_timeout=10)
                                + textwrap.dedent(f"""
            [jobs.t]
            dataset = "{self.src}"
            recursive = true
            [jobs.t.replicate]
            targets = ["backup:{self.replica}"]
        """) + textwrap.dedent(extra), capsys)
        self.config = self.zbak.config

    @property
    def datasets(self) -> list[str]:
        """Every source dataset of the tree, the root first."""
        return [self.src] + [f"{self.src}/{child}" for child in self.children]

    def mount(self, child: str = "") -> Path:
        """Where the source dataset ``child`` (relative; "" for the root) is mounted."""
        return self.src_pool.mountpoint / "tree" / child

    def write(self, child: str, name: str, data: bytes) -> None:
        """A file into the source dataset ``child``."""
        (self.mount(child) / name).write_bytes(data)

    def snapshot(self, short: str) -> None:
        """``zfs snapshot -r`` of the whole tree."""
        zfs("snapshot", "-r", f"{self.src}@{short}")


def _per_snapshot(root: str, prop: str) -> dict[str, int]:
    """``{name relative to root: prop}`` of every snapshot under ``root`` (integers)."""
    out = zfs("get", "-Hp", "-r", "-o", "name,value", prop, root)
    rows = (line.split("\t") for line in out.splitlines())
    return {name[len(root):]: int(value) for name, value in rows if "@" in name}


def snapshot_guids(root: str) -> dict[str, int]:
    """``{name relative to root: guid}`` of every snapshot under ``root`` (none if missing)."""
    try:
        return _per_snapshot(root, "guid")
    except Exception:  # the replica may not exist yet
        return {}


def userrefs(root: str) -> dict[str, int]:
    """``{name relative to root: holds}`` of every snapshot under ``root`` (zfs-fuse has no
    ``zfs holds``; a killed ``zfs send`` may leave its own holds there)."""
    return _per_snapshot(root, "userrefs")


def cursors(config: Path, job: str) -> dict[str, str]:
    """``{source dataset: snapshot}`` of the job's replica cursors in the catalog."""
    from zrepl_py.catalog.db import make_engine
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.config.loading import load_config

    catalog = Catalog(make_engine(load_config(config).catalog_url))
    return {row.source_dataset: row.snapshot_name for row in catalog.cursors(job)}


SENDING = re.compile(r"sending (\S+)@\S+ -> \S+ \(\w+\)")
RECEIVED = re.compile(r"received (\S+)@\S+ -> \S+: \d+ bytes")


def transfers(log: str) -> list[tuple[str, str]]:
    """``[("start" | "end", source dataset)]`` in the order zbak's log shows its transfers."""
    events = []
    for line in log.splitlines():
        if found := SENDING.search(line):
            events.append(("start", found.group(1)))
        elif found := RECEIVED.search(line):
            events.append(("end", found.group(1)))
    return events


def most_at_once(events: list[tuple[str, str]]) -> int:
    """The most transfers running at the same time in ``transfers``' events."""
    running = most = 0
    for kind, _ in events:
        running += 1 if kind == "start" else -1
        most = max(most, running)
    return most


def random_bytes(size: int) -> bytes:
    """Incompressible data."""
    return os.urandom(size)
