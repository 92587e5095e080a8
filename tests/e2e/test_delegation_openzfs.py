"""docs/reliability.md#r37-delegation-only on real OpenZFS 2.3: zbak's whole cycle as an
unprivileged user holding only the ``zfs allow`` sets of examples/zfs-allow.sh.

zfs-fuse has no working ``zfs allow``, so this runs in the QEMU guest (tests/support/openzfs.py).
The host's ``zfs`` command in the config is a wrapper that drops to ``nobody`` (uid 65534)
with util-linux ``setpriv`` before running zfs, so every zfs command zbak issues there, the
data path's ``zfs send``/``zfs receive`` included, runs as that user; ``zpool`` stays root
(zbak only reads pool properties with it).
"""

from __future__ import annotations

import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from support.cli import run_zbak
from support.common import hosts_table
from support.openzfs import COMMAND_TIMEOUT

from zrepl_py.errors import ExitStatus, PermissionDenied
from zrepl_py.zfs.client import Zfs

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "zfs-allow.sh"


def allow_argv(*args: str) -> list[str]:
    """The ``zfs allow`` command examples/zfs-allow.sh would run (``-n`` prints it)."""
    done = subprocess.run(["sh", str(SCRIPT), "-n", *args], capture_output=True, text=True,
                          check=True, timeout=30)
    return done.stdout.split()


def test_the_whole_cycle_runs_as_a_user_with_only_the_documented_delegation_and_more_is_denied(
        openzfs_vm, openzfs_executor, openzfs_pools, tmp_path, capsys, request):
    """docs/reliability.md#r37-delegation-only: as ``nobody`` with exactly ``zfs-allow.sh source``
    on the source and ``zfs-allow.sh target`` (no ``--rollback``) on the target, ``zbak snapshot``,
    ``replicate`` (full, then incremental with the hold and bookmark moved), and ``prune`` (source
    retention destroys old snapshots) succeed; operations outside the sets raise the typed
    ``PermissionDenied`` from the Zfs client: destroying a replica snapshot (needs ``destroy``,
    granted only with ``--rollback``) and creating a dataset outside the delegated one."""
    def guest(*argv: str, input: bytes | None = None) -> str:
        return openzfs_executor.run(list(argv), input=input, timeout=COMMAND_TIMEOUT).text

    zfs_path = guest("sh", "-c", "command -v zfs").strip()
    wrapper = f"/root/zfs-nobody-{openzfs_pools.source}"
    request.addfinalizer(lambda: openzfs_executor.run(["rm", "-f", wrapper], check=False))
    guest("dd", f"of={wrapper}", "status=none", input=(
        "#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups "
        f"{zfs_path} \"$@\"\n").encode())
    guest("chmod", "0755", wrapper)
    src, root = f"{openzfs_pools.source}/data", f"{openzfs_pools.target}/replicas"
    for dataset in (src, root, f"{openzfs_pools.target}/other"):
        guest("zfs", "create", dataset)
    guest("chmod", "0777", f"/{src}")  # the test writes files as root anyway
    openzfs_executor.run(allow_argv("source", "nobody", src), timeout=COMMAND_TIMEOUT)
    openzfs_executor.run(allow_argv("target", "nobody", root), timeout=COMMAND_TIMEOUT)
    assert guest(wrapper, "get", "-H", "-o", "value", "name", src).strip() == src

    config = tmp_path / "zbak.toml"
    config.write_text(
        f'state_dir = "{tmp_path / "state"}"\n'
        + hosts_table("vm", openzfs_vm.host_config(), connect_timeout=30, zfs=wrapper)
        + textwrap.dedent(f"""\
        [jobs.j]
        dataset = "vm:{src}"
        [jobs.j.snapshot]
        retention = {{ keep_last = 1 }}
        [jobs.j.replicate]
        targets = ["vm:{root}/data"]
    """))

    def zbak(*args: str) -> None:
        status, out, err = run_zbak("--config", str(config), *args)
        assert status == ExitStatus.OK, (args, out, err)

    zbak("init", "--no-checks")
    for n in range(3):
        guest("dd", "if=/dev/urandom", f"of=/{src}/f{n}", "bs=64K", "count=2", "status=none")
        zbak("snapshot")
        zbak("replicate")
        time.sleep(1.1)  # snapshot names have a one-second resolution
    zbak("prune")

    def snaps(dataset: str) -> dict[str, str]:
        out = guest("zfs", "get", "-Hp", "-d", "1", "-t", "snapshot", "-o", "name,value",
                    "guid", dataset)
        return {line.split("\t")[0].split("@")[1]: line.split("\t")[1]
                for line in out.splitlines()}

    source, replica = snaps(src), snaps(f"{root}/data")
    assert len(replica) == 3 and len(source) < 3, (source, replica)  # prune destroyed some
    assert all(replica[name] == guid for name, guid in source.items())

    as_nobody = Zfs(openzfs_executor, zfs=wrapper, timeout=COMMAND_TIMEOUT)
    newest = max(replica)
    with pytest.raises(PermissionDenied):
        as_nobody.destroy_snapshot(f"{root}/data@{newest}")
    with pytest.raises(PermissionDenied):
        as_nobody.create_filesystem(f"{openzfs_pools.target}/other/x")
    assert newest in snaps(f"{root}/data")
