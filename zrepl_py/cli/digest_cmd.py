"""``zbak digest SNAPSHOT``: print a snapshot's file manifest (what a drill compares) as JSON
lines (``zrepl_py.drill.manifest``). Reads no config file: a drill runs it on the host that
holds the snapshot (a replica host, a pull source)."""

from __future__ import annotations

import sys

import click

from zrepl_py.cli.common import Invocation, pass_invocation
from zrepl_py.errors import ExitStatus


@click.command("digest")
@click.argument("snapshot", metavar="POOL/PATH@SNAP")
@click.option("--zfs", "zfs_path", default="zfs", show_default=True, help="zfs to execute.")
@pass_invocation
def command(inv: Invocation, snapshot: str, zfs_path: str) -> ExitStatus:
    """Print every file, directory and link of SNAPSHOT on this machine with its mode,
    owner, size, mtime and SHA-256 (JSON lines, format zbak-files/1): what zbak drill
    compares between a restored copy and the source. The files are read through the
    snapshot directory (.zfs/snapshot), or a temporary read-only clone where that is
    missing."""
    from zrepl_py.drill.manifest import print_manifest
    from zrepl_py.proc.local import LocalExecutor
    from zrepl_py.zfs.client import Zfs
    from zrepl_py.zfs.names import SnapshotName

    print_manifest(Zfs(LocalExecutor(), zfs=zfs_path), SnapshotName(snapshot), sys.stdout)
    return ExitStatus.OK
