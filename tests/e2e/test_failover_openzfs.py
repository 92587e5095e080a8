"""``zbak failover`` and ``zbak failback`` with the replica on the OpenZFS 2.3 guest
(tests/support/openzfs.py) and the master on a zfs-fuse pool (pool version 23, ZPL 4), as
the admin types them (a real ``zbak`` process; the guest has no zbak, so the replica's zfs
commands go over ssh one by one).

The replica the master's full stream made keeps its ZPL version 4 and can go back; a
dataset made on the live replica in the guest is ZPL 5, which zfs-fuse cannot receive: the
failback's plan says the version check and names it as a blocker before anything changes
(docs/failover.md#limits).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.cli import prop, tree_digest, write_synced, zfs
from support.common import hosts_table
from support.failover import zfs_pool
from support.openzfs import COMMAND_TIMEOUT

ZBAK = Path(sys.executable).with_name("zbak")
KiB = 1 << 10


def test_failover_to_an_openzfs_replica_and_back_with_the_version_check(
        openzfs_vm, openzfs_executor, openzfs_pools, make_pool, tmp_path):
    def guest(*argv: str) -> str:
        return openzfs_executor.run(list(argv), timeout=COMMAND_TIMEOUT).text

    src = make_pool()
    data, replica = f"{src.name}/data", f"{openzfs_pools.target}/rep/data"
    live = f"/{openzfs_pools.target}-live"
    zfs("create", data)
    zfs("create", f"{data}/kid")
    guest("zfs", "create", f"{openzfs_pools.target}/rep")
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n'
                      + hosts_table("vm", openzfs_vm.host_config(), connect_timeout=30)
                      + textwrap.dedent(f"""
                          [jobs.j]
                          dataset = "{data}"
                          recursive = true
                          [jobs.j.replicate]
                          targets = ["vm:{replica}"]
                          failover_mountpoint = "{live}"
                      """))

    def zbak(*args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(ZBAK), "--config", str(config), *args], text=True,
                              capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
        assert done.returncode == status, f"zbak {' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    zbak("init", "--no-checks")
    source_dir = Path(prop(data, "mountpoint"))
    write_synced(source_dir / "nightly", os.urandom(256 * KiB))
    zbak("snapshot")
    zbak("replicate")
    assert guest("zfs", "get", "-Hpo", "value", "version", replica).strip() == "4"
    zfs_pool("export", src.name)

    zbak("failover", "j")
    on_replica = os.urandom(128 * KiB)
    openzfs_executor.run(["sh", "-c", f"cat > {live}/on-replica"], input=on_replica,
                         timeout=COMMAND_TIMEOUT)
    guest("zfs", "create", f"{replica}/made-there")  # OpenZFS 2.3 makes ZPL 5
    zfs_pool("import", "-d", str(src.image.parent), src.name)

    failed = zbak("failback", "j", "--yes", status=1)
    blocked = failed.stdout + failed.stderr
    assert f"{replica}/made-there has ZPL version 5" in blocked, blocked
    assert f"version check: the replica's datasets are ZPL version 4, 5; the source's pool " \
           f"{src.name} writes up to version 4" in blocked, blocked
    marks = guest("zfs", "get", "-Hr", "-s", "local", "-o", "name", "zbak:failover", replica)
    assert marks.split() == [replica, f"{replica}/kid"], "nothing was changed"
    assert guest("zfs", "get", "-Hpo", "value", "readonly", replica).strip() == "off"

    # The admin moves it out of the job's tree (its files are copied by hand).
    guest("zfs", "rename", f"{replica}/made-there", f"{openzfs_pools.target}/made-there")
    done = zbak("failback", "j", "--yes").stdout
    assert "ZPL version 4; the source's pool" in done and "it can receive them" in done, done
    assert tree_digest(source_dir)["on-replica"] == hashlib.sha256(on_replica).hexdigest()
    assert guest("zfs", "get", "-Hr", "-s", "local", "-o", "name", "zbak:failover",
                 replica).split() == []
    assert guest("zfs", "get", "-Hpo", "value", "readonly,mounted", replica).split() \
        == ["on", "no"]
    write_synced(source_dir / "after", os.urandom(64 * KiB))
    zbak("snapshot")
    rows = json.loads(zbak("replicate", "--json").stdout)["rows"]
    assert all(r["plan"].startswith("incremental") for r in rows), rows
