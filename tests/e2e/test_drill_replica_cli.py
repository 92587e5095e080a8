"""A replica drilled on its own host, over the real sshd through ``zbak serve --allow-drill``
(docs/drills.md#a-replica-is-drilled-on-its-own-host), and a damaged replica.

The backup host's key runs ``zbak serve --root BAK/replicas --allow-drill``: the drill's copy
(``zfs send | zfs receive`` run by the backup host itself), its scratch's create, listing and
destroys, and ``zbak digest`` of the copy must all pass through it unchanged.

A replica is damaged by writing garbage into its pool's image file where one of its file's
blocks lies (found by the bytes the file holds), after the pool is exported, then importing
it again so nothing of it is cached. ZFS checksums every block: the replica host's own
``zfs send`` then fails with an I/O error, which the drill reports. Where ZFS does not
checksum the blocks (``checksum=off`` on the replica), the send succeeds with the right guid
and garbage inside, and only the file comparison sees it (docs/decisions.md#a-drill-is-a-restore-into-scratch).
"""

from __future__ import annotations

import json
import mmap
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.cli import Zbak, write_synced, zfs
from support.common import hosts_table
from support.receiver import Receiver
from support.served import served_pools

from zrepl_py.errors import ExitStatus

pytestmark = [pytest.mark.zfs, pytest.mark.ssh]

ZBAK = Path(sys.executable).with_name("zbak")
MARK = b"ZBAK-DRILL-BLOCK-"


class Rig:
    """Source pool SRC/data, backup pool BAK whose ``replicas`` a forced command serves with
    --allow-drill, a webhook receiver, and job ``j`` replicating to ``backup:BAK/replicas/data``
    with a drill."""

    def __init__(self, make_pool, sshd_factory, tmp_path, capsys, monkeypatch, *,
                 replicas_checksum: str = "on", allow_drill: bool = True):
        pools = served_pools(make_pool)
        self.src, self.bak, self.data = pools.src, pools.bak, pools.data
        self.root, self.replica = pools.root, pools.replica
        zfs("set", f"checksum={replicas_checksum}", self.root)
        self.log = tmp_path / "serve.log"
        flag = " --allow-drill" if allow_drill else ""
        server = sshd_factory(forced_command=f"{ZBAK} serve --root {self.root}{flag}"
                                             f" --log {self.log}")
        self.receiver = Receiver("/alerts")
        monkeypatch.setenv("ZBAK_TEST_ALERTS_AT", self.receiver.url)
        config = tmp_path / "zbak.toml"
        config.write_text(f'state_dir = "{tmp_path / "state"}"\n'
                          + hosts_table("backup", server.host_config(), connect_timeout=5)
                          + textwrap.dedent(f"""
            [jobs.j]
            dataset = "{self.data}"
            [jobs.j.replicate]
            targets = ["backup:{self.replica}"]
            [jobs.j.drill]
            [alerts.webhook]
            url = {{ env = "ZBAK_TEST_ALERTS_AT" }}
        """))
        self.run = Zbak(config, capsys)
        mount = self.src.mountpoint / "data"
        # 1.25 MB of numbered records: every 128 KiB block of the file is recognisable.
        write_synced(mount / "big.bin", b"".join(MARK + b"%08d" % i for i in range(50_000)))
        write_synced(mount / "small.txt", b"unchanged\n")
        zfs("snapshot", f"{self.data}@zbak_20260101T000000Z")
        assert self.run("init", "--no-checks")[0] == ExitStatus.OK
        status, out, err = self.run("replicate")
        assert status == ExitStatus.OK, out + err

    def drill(self) -> tuple[int, dict]:
        status, out, err = self.run("drill", "--json")
        (row,) = json.loads(out)["drills"] if out.strip() else [None]
        assert row is not None, out + err
        return status, row

    def damage_replica(self) -> None:
        """Write garbage over 16 bytes of one block of big.bin in the backup pool's image,
        exported meanwhile; import it again (nothing of it left in the cache)."""
        pool, image = self.bak.name, self.bak.image
        zfs_pool("export", pool)
        with open(image, "r+b") as handle, mmap.mmap(handle.fileno(), 0) as data:
            where = data.find(MARK + b"00030000")
            assert where > 0, "the replica's block is in the image"
            data[where:where + 16] = b"\x00GARBAGE\x00GARBAGE"
            data.flush()
        zfs_pool("import", "-d", str(image.parent), pool)

    def scratch_left(self) -> list[str]:
        out = zfs("list", "-H", "-o", "name", "-r", self.root)
        return [n for n in out.split() if "zbak-drill-" in n]


def zfs_pool(*args: str) -> None:
    subprocess.run(["zpool", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def rig(make_pool, sshd_factory, tmp_path, capsys, monkeypatch, request):
    made = Rig(make_pool, sshd_factory, tmp_path, capsys, monkeypatch,
               replicas_checksum=getattr(request, "param", "on"))
    yield made
    made.receiver.close()


def test_a_replica_is_restored_and_compared_on_its_own_host_through_zbak_serve(rig):
    status, row = rig.drill()
    assert status == ExitStatus.OK, row
    assert (row["source"], row["result"], row["files"]) == (f"backup:{rig.replica}", "ok", 2)
    assert row["bytes"] >= 1_250_000 and row["seconds"] > 0
    (item,) = row["datasets_restored"]
    assert item["into"].startswith(f"{rig.root}/zbak-drill-")
    assert rig.scratch_left() == []

    log = rig.log.read_text()
    allowed = [line for line in log.splitlines() if " ALLOWED " in line]
    assert any("zfs send" in line and "| zfs receive -u" in line and "zbak-drill-" in line
               for line in allowed), "the copy ran on the backup host, as one pipeline"
    assert any("zbak digest" in line and "zbak-drill-" in line for line in allowed)
    assert any("zfs destroy" in line and "zbak-drill-" in line for line in allowed)
    assert " REFUSED " not in log, log
    assert rig.receiver.posts == []


@pytest.mark.parametrize("rig, seen", [
    ("on", "Input/output error"),
    ("off", "big.bin: content (sha256)"),
], indirect=["rig"], ids=["zfs-checksums-the-block", "checksum-off-only-the-files-show-it"])
def test_a_damaged_replica_fails_its_drill_alerts_and_records_it(rig, seen):
    rig.damage_replica()

    status, row = rig.drill()
    assert (status, row["result"]) == (ExitStatus.FAILED, "failed"), row
    assert seen in row["detail"], row["detail"]
    assert "small.txt" not in row["detail"]
    assert rig.scratch_left() == [], "the scratch is destroyed after a failure too"
    (alert,) = [b for _, _, b in rig.receiver.posts if b["kind"] == "failure"]
    assert (alert["action"], alert["target"]) == ("drill", f"backup:{rig.replica}")
    assert seen in alert["message"]
    status, out, _ = rig.run("status", "--json", "--offline")
    (job,) = json.loads(out)
    (drill,) = job["drills"]
    assert drill["result"] == "failed" and seen in drill["detail"]
    assert job["drill_successes"] == [], "a failed drill is no success"


def test_a_serve_without_allow_drill_fails_the_drill_in_one_line_naming_the_scratch_left(
        make_pool, sshd_factory, tmp_path, capsys, monkeypatch):
    """A forced command without --allow-drill refuses the scratch's destroy: the drill fails
    (exit 1) with a line naming the scratch and what to do, never an internal error."""
    rig = Rig(make_pool, sshd_factory, tmp_path, capsys, monkeypatch, allow_drill=False)
    try:
        status, out, err = rig.run("drill", "--json")
    finally:
        rig.receiver.close()
    assert status == ExitStatus.FAILED, out + err
    assert "internal error" not in out + err
    (row,) = json.loads(out)["drills"]
    assert row["result"] == "failed"
    left = rig.scratch_left()
    assert left and f"the scratch backup:{left[0].split('/zbak-drill-')[0]}/zbak-drill-" in row[
        "detail"], row["detail"]
    assert "could not be destroyed" in row["detail"]


def test_a_drill_that_failed_and_left_its_scratch_names_both_the_failure_first(
        make_pool, sshd_factory, tmp_path, capsys, monkeypatch):
    """A damaged replica fails the drill and the forced command (no --allow-drill) refuses
    the scratch's destroy: the record names why the drill failed, then the scratch left."""
    rig = Rig(make_pool, sshd_factory, tmp_path, capsys, monkeypatch, allow_drill=False)
    try:
        rig.damage_replica()
        status, row = rig.drill()
    finally:
        rig.receiver.close()
    assert (status, row["result"]) == (ExitStatus.FAILED, "failed"), row
    failure, scratch = row["detail"].find("Input/output error"), row["detail"].find(
        "could not be destroyed")
    assert 0 <= failure < scratch, row["detail"]
    assert rig.scratch_left()
