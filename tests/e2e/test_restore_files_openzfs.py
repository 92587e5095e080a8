"""``zbak restore --path`` and ``zbak find`` of a dataset in the OpenZFS 2.3 guest (a pull
job's source over ssh), as the admin types them (a real ``zbak`` process).

OpenZFS has what zfs-fuse lacks: ``.zfs/snapshot`` (so no clone is made: the files are read
straight from the snapshot directory, docs/design.md#restoring-files), nanosecond mtimes
and extended attributes. The tree is made on this machine, carried into the guest by GNU tar
with ``--xattrs``, snapshotted there, and the restored copy must equal the original in every
field ``support.files.stat_of`` reads: content, mode with setuid and setgid bits, numeric
owner, mtime to the nanosecond, symlink target, binary extended attributes, hard links.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

from support.cli import run_zbak
from support.common import hosts_table
from support.files import NEWLINE, hard_linked, rich_tree, tree_state
from support.openzfs import COMMAND_TIMEOUT

from zrepl_py.files.snapshot_files import tar_argv


def test_files_of_an_openzfs_snapshot_come_back_from_its_snapdir_with_every_attribute(
        openzfs_vm, openzfs_executor, openzfs_pools, tmp_path):
    source = tmp_path / "src"
    rich_tree(source)
    data = f"{openzfs_pools.source}/data"

    def guest(*argv: str, input: bytes | None = None) -> str:
        return openzfs_executor.run(list(argv), input=input, timeout=COMMAND_TIMEOUT).text

    guest("zfs", "create", data)
    stream = subprocess.run(tar_argv(str(source), ["home"]), capture_output=True,
                            check=True).stdout
    guest("tar", "--extract", "--file=-", "--xattrs", "--xattrs-include=*", "--numeric-owner",
          "--same-permissions", "-C", f"/{data}", input=stream)
    guest("zfs", "snapshot", f"{data}@1")
    guest("dd", f"of=/{data}/home/alice/notes.txt", "status=none", input=b"changed\n")
    guest("zfs", "snapshot", f"{data}@2")
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n'
                      + hosts_table("vm", openzfs_vm.host_config(), connect_timeout=30)
                      + textwrap.dedent(f"""\
                          [jobs.j]
                          dataset = "vm:{data}"
                      """))
    assert run_zbak("--config", str(config), "init", "--no-checks")[0] == 0

    out = tmp_path / "out"
    status, stdout, err = run_zbak("--config", str(config), "restore", f"vm:{data}", "--to", "@1",
                                           "--path", "home", "--into-dir", str(out), "--yes")
    assert status == 0, stdout + err
    assert "through temporary clone" not in err  # read from /DATA/.zfs/snapshot/1
    assert tree_state(out, "home") == tree_state(source, "home")
    assert hard_linked(out / "home" / "alice", "notes.txt", "hard")
    assert os.getxattr(out / "home" / "alice" / "notes.txt", "user.binary") == (
        b"\x00\xff\n\x80zbak")
    assert (out / "home" / NEWLINE).read_bytes() == b"odd name"
    assert "zbak-view-" not in guest("zfs", "list", "-H", "-o", "name", "-r",
                                     openzfs_pools.source)

    status, stdout, err = run_zbak("--config", str(config), "find", f"vm:{data}",
                                           "home/alice/notes.txt", "--json")
    assert status == 0, stdout + err
    rows = json.loads(stdout)["versions"]
    assert [(r["snapshot"], r["version"], r["size"]) for r in rows] == [
        ("1", 1, 11000), ("2", 2, 8)]
    assert rows[0]["mtime"] == "2001-02-03T04:05:06.123456789Z"
    assert all(r["where"] == [f"vm:{data}"] for r in rows)
