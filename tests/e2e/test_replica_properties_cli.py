"""Replicas that survive a reboot of the backup host, and their properties 
(docs/decisions.md#replicas-are-received-unmounted-and-read-only,
docs/decisions.md#replica-properties-keep-a-failover-replica-faithful), on zfs-fuse pools pushed
over a real sshd to 127.0.0.1 with the CLI.

zfs-fuse (pool v23) is what a target without ``zfs receive -o/-x`` gets: no properties in
the stream (nothing could keep the source's mountpoint off the backup host), and the set
ones (``canmount=noauto``, ``readonly=on`` by default) with ``zfs set`` right after the full
receive; a replica made before (``canmount=on``) gets them at its next receive. The same
disasters on OpenZFS, where properties travel, are in test_replica_properties_openzfs.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.cli import Zbak, zfs
from support.common import replication_config

from zrepl_py.errors import ExitStatus

pytestmark = [pytest.mark.zfs, pytest.mark.ssh]


def value_and_source(dataset: str, prop: str) -> tuple[str, str]:
    """``(value, source)`` of one property, read with plain ``zfs get``."""
    value, source = zfs("get", "-H", "-o", "value,source", prop, dataset).strip().split("\t")
    return value, source


def guids(dataset: str) -> dict[str, str]:
    out = zfs("get", "-H", "-p", "-r", "-o", "name,value", "guid", dataset)
    return {n.split("@", 1)[1]: v for n, v in (line.split("\t") for line in out.splitlines())
            if n.startswith(dataset + "@")}


class Rig:
    """A source pool with ``SRC/data`` (its own mountpoint, atime off, a user property) and a
    backup pool; the config pushes it to ``backup:BAK/replicas/data``."""

    def __init__(self, make_pool, sshd, tmp_path, capsys):
        self.src, self.bak = make_pool(), make_pool()
        self.data = f"{self.src.name}/data"
        self.replica = f"{self.bak.name}/replicas/data"
        self.source_mount = tmp_path / "srv data"
        zfs("create", "-o", f"mountpoint={self.source_mount}", "-o", "atime=off",
            "-o", "com.example:owner=ops", self.data)
        (self.source_mount / "report.txt").write_text("quarterly numbers\n")
        self.tmp, self.sshd = tmp_path, sshd
        self.config = tmp_path / "zbak.toml"
        self.zbak = Zbak(self.config, capsys)
        self.write_config()

    def write_config(self, extra: str = "") -> None:
        self.config.write_text(replication_config(
            self.tmp / "state", "backup", self.sshd.host_config(), self.data,
            [f"backup:{self.replica}"], connect_timeout=5, extra=extra))

    def replicate(self) -> tuple[str, str]:
        """``zbak --debug replicate --json`` must succeed; return (the row's plan, stderr)."""
        status, out, err = self.zbak("--debug", "replicate", "--json")
        assert status == ExitStatus.OK, out + err
        (row,) = json.loads(out)["rows"]
        return row["plan"], err

    def snapshot(self, short: str) -> None:
        zfs("snapshot", f"{self.data}@{short}")


@pytest.fixture
def rig(make_pool, sshd, tmp_path, capsys):
    r = Rig(make_pool, sshd, tmp_path, capsys)
    assert r.zbak("init", "--no-checks")[0] == ExitStatus.OK
    return r


def reboot_mounts_everything() -> None:
    """What a backup host's boot does: ``zfs mount -a`` (every dataset whose canmount is on)."""
    zfs("mount", "-a")


def mounted(dataset: str) -> bool:
    return value_and_source(dataset, "mounted")[0] == "yes"


def test_after_the_backup_host_rebooted_and_mounted_everything_the_nightly_run_goes_on(rig):
    rig.snapshot("s1")
    plan, err = rig.replicate()
    assert plan == "full s1"
    assert value_and_source(rig.replica, "canmount") == ("noauto", "local")
    assert value_and_source(rig.replica, "readonly") == ("on", "local")
    # zfs-fuse has no receive -o: set right after the full receive, which was -u (unmounted)
    assert (f"canmount of {rig.replica} is not set yet (this zfs receive has no -o); running"
            " zfs set canmount=noauto") in err

    reboot_mounts_everything()
    assert not mounted(rig.replica), "canmount=noauto: never mounted at boot"
    # an admin looks at the replica by hand: read-only, so no write and no access time
    zfs("mount", rig.replica)
    where = Path(value_and_source(rig.replica, "mountpoint")[0])
    assert (where / "report.txt").read_text() == "quarterly numbers\n"
    with pytest.raises(OSError):
        (where / "stray.txt").write_text("x")

    (rig.source_mount / "report.txt").write_text("revised numbers\n")
    rig.snapshot("s2")
    plan, _ = rig.replicate()
    assert plan == "incremental -I s1 -> s2", "not stopped as diverged"
    assert guids(rig.replica) == guids(rig.data)


def test_the_source_mountpoint_and_properties_never_reach_a_target_without_receive_x(rig):
    """A v23 target gets no ``zfs send -p``: its receive could not keep the source's
    mountpoint (a path of the backup host, here one that exists) off the replica."""
    rig.write_config("""\
        [jobs.j.replicate.properties]
        set = { "com.example:role" = "replica" }
    """)
    rig.snapshot("s1")
    rig.snapshot("s2")
    plan, err = rig.replicate()
    assert plan == "full s1; incremental -I s1 -> s2"
    sends = [line for line in err.splitlines() if "zfs send" in line]
    assert sends and not any(" -p" in line for line in sends), sends
    assert value_and_source(rig.replica, "com.example:role") == ("replica", "local")
    assert value_and_source(rig.replica, "mountpoint")[1] != "received"
    assert value_and_source(rig.replica, "mountpoint")[0] != str(rig.source_mount)
    assert value_and_source(rig.replica, "com.example:owner") == ("-", "-")
    assert value_and_source(rig.replica, "atime")[1] != "received"


def test_a_replica_made_before_gets_canmount_and_readonly_at_its_next_receive(rig):
    """A replica an older zbak made (``canmount=on readonly=off``) is brought to the job's
    properties after its next receive, with a warning naming each change."""
    rig.snapshot("s1")
    zfs("create", "-p", rig.replica.rsplit("/", 1)[0])
    done = zfs_pipe(["zfs", "send", f"{rig.data}@s1"], ["zfs", "receive", "-u", rig.replica])
    assert done == 0
    assert value_and_source(rig.replica, "canmount") == ("on", "default")

    rig.snapshot("s2")
    plan, err = rig.replicate()
    assert plan == "incremental -I s1 -> s2"
    assert value_and_source(rig.replica, "canmount") == ("noauto", "local")
    assert value_and_source(rig.replica, "readonly") == ("on", "local")
    assert f"canmount of {rig.replica} was on (default); running zfs set canmount=noauto" in err
    reboot_mounts_everything()
    assert not mounted(rig.replica)


def zfs_pipe(send: list[str], receive: list[str]) -> int:
    """Run ``send | receive`` by hand (what an older zbak or an admin did); return the
    receiver's exit status."""
    sender = subprocess.Popen(send, stdout=subprocess.PIPE)
    receiver = subprocess.run(receive, stdin=sender.stdout, capture_output=True, timeout=120)
    sender.stdout.close()
    sender.wait(timeout=120)
    return receiver.returncode
