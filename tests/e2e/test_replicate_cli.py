"""``zbak replicate`` end to end on real zfs-fuse pools, pushed over a real sshd to 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from support.cli import run_zbak, start_zbak, wait_for_bytes, zfs
from support.common import hosts_table

from zrepl_py.errors import ExitStatus

pytestmark = [pytest.mark.zfs, pytest.mark.ssh]


def guids(dataset: str) -> dict[str, int]:
    out = zfs("get", "-Hp", "-r", "-o", "name,property,value", "guid", dataset)
    return {n.split("@", 1)[1]: int(v) for n, _, v in (l.split("\t") for l in out.splitlines())
            if n.startswith(dataset + "@")}


def userrefs(snapshot: str) -> int:
    return int(zfs("get", "-Hp", "-o", "value", "userrefs", snapshot).strip())


def write(path: Path, size: int, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size) if seed < 0 else bytes([seed % 256]) * size)


class Rig:
    """A source and a backup pool, a config replicating SRC/data to backup:BAK/replica."""

    def __init__(self, make_pool, sshd, tmp_path, capsys, *, recursive=False, extra="",
                 targets=None, port=None):
        self.src, self.bak = make_pool(), make_pool()
        self.data = f"{self.src.name}/data"
        self.replica = f"{self.bak.name}/replica"
        self.mount = self.src.mountpoint / "data"
        zfs("create", self.data)
        self.tmp, self.capsys, self.sshd = tmp_path, capsys, sshd
        self.config = tmp_path / "zbak.toml"
        self.write_config(recursive=recursive, extra=extra, targets=targets, port=port)

    def write_config(self, *, recursive=False, extra="", targets=None, port=None):
        targets = targets or [f"backup:{self.replica}"]
        self.config.write_text(textwrap.dedent(f"""
            state_dir = "{self.tmp / 'state'}"
        """) + hosts_table("backup", self.sshd.host_config(port=port or self.sshd.port),
                           connect_timeout=5) + textwrap.dedent(f"""
            [jobs.j]
            dataset = "{self.data}"
            recursive = {str(recursive).lower()}
            [jobs.j.snapshot]
            retention = {{ keep_last = 1 }}
            [jobs.j.replicate]
            targets = {json.dumps(targets)}
        """) + textwrap.dedent(extra))

    def __call__(self, *args: str):
        return run_zbak("--config", str(self.config), *args)

    def snapshot(self, short: str) -> None:
        zfs("snapshot", "-r", f"{self.data}@{short}")


@pytest.fixture
def rig(make_pool, sshd, tmp_path, capsys):
    r = Rig(make_pool, sshd, tmp_path, capsys)
    assert r("init", "--no-checks")[0] == ExitStatus.OK
    return r


def test_first_run_is_full_then_incremental_with_equal_guids_and_a_moving_hold(rig):
    write(rig.mount / "a.bin", 300_000, -1)
    rig.snapshot("zbak_20260101T000000Z")
    write(rig.mount / "b.bin", 200_000, -1)
    rig.snapshot("zbak_20260102T000000Z")
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    plan = json.loads(out)["rows"][0]["plan"]
    assert plan.startswith("full zbak_20260101T000000Z") and "-I zbak_20260101T000000Z" in plan
    assert guids(rig.replica) == guids(rig.data)
    tag = f"zbak:j:backup:{rig.replica}"
    assert userrefs(f"{rig.data}@zbak_20260102T000000Z") == 1

    write(rig.mount / "c.bin", 100_000, 7)
    rig.snapshot("zbak_20260103T000000Z")
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["rows"][0]["plan"] == "incremental -I zbak_20260102T000000Z -> zbak_20260103T000000Z"
    assert guids(rig.replica) == guids(rig.data)
    assert userrefs(f"{rig.data}@zbak_20260103T000000Z") == 1
    assert userrefs(f"{rig.data}@zbak_20260102T000000Z") == 0, f"old {tag} hold released"

    status, out, _ = rig("replicate", "--json")
    assert json.loads(out)["rows"][0]["plan"] == "up to date"
    status, out, _ = rig("status", "--json")
    (target,) = json.loads(out)[0]["targets"]
    assert target["cursor"] == "zbak_20260103T000000Z" and target["lag_snapshots"] == 0
    runs = {(r["action"], r["result"]) for r in json.loads(out)[0]["last_runs"]}
    assert ("replicate", "ok") in runs


def test_an_old_hold_zfs_will_not_release_fails_the_run_after_the_cursors_moved(
        rig, tmp_path, monkeypatch):
    """A ``zfs release`` of the old bases refused (a delegated user without ``release``, a
    lost connection) leaves one hold too many, never one too few: the new bases are held
    and the cursors moved (it aborted the settle, so no cursor of the batch moved and the
    rest of the run stopped); the run fails naming ``zbak holds release-stale``, which then
    releases it."""
    write(rig.mount / "a.bin", 100_000, -1)
    rig.snapshot("zbak_20260101T000000Z")
    assert rig("replicate")[0] == ExitStatus.OK
    rig.snapshot("zbak_20260102T000000Z")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "zfs").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = release ]; then
            echo "cannot release hold: permission denied" >&2; exit 1
        fi
        exec {shutil.which("zfs")} "$@"
    """))
    (bin_dir / "zfs").chmod(0o755)
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", f"{bin_dir}:{path}")
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.FAILED, out + err
    assert "zbak holds release-stale" in out + err and "permission denied" in out + err
    assert guids(rig.replica) == guids(rig.data)
    assert userrefs(f"{rig.data}@zbak_20260102T000000Z") == 1, "the new base is held"
    assert userrefs(f"{rig.data}@zbak_20260101T000000Z") == 1, "the old hold stays"
    status, out, _ = rig("status", "--json")
    (target,) = json.loads(out)[0]["targets"]
    assert target["cursor"] == "zbak_20260102T000000Z", "the cursor moved"

    monkeypatch.setenv("PATH", path)
    status, out, err = rig("holds", "release-stale")
    assert status == ExitStatus.OK, out + err
    assert userrefs(f"{rig.data}@zbak_20260101T000000Z") == 0
    assert userrefs(f"{rig.data}@zbak_20260102T000000Z") == 1


def test_a_recursive_job_replicates_a_child_created_after_the_first_run(make_pool, sshd, tmp_path, capsys):
    rig = Rig(make_pool, sshd, tmp_path, capsys, recursive=True)
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    zfs("create", f"{rig.data}/old child")
    rig.snapshot("s1")
    assert rig("replicate")[0] == ExitStatus.OK
    zfs("create", f"{rig.data}/new:child")
    rig.snapshot("s2")
    status, out, err = rig("replicate")
    assert status == ExitStatus.OK, out + err
    for child in ("", "/old child", "/new:child"):
        assert guids(rig.replica + child) == guids(rig.data + child)


def test_a_transfer_whose_sender_is_killed_mid_stream_is_completed_by_the_next_run(
        make_pool, sshd, tmp_path, capsys):
    """docs/reliability.md#r1-interrupted-full-send-resumes."""
    rig = Rig(make_pool, sshd, tmp_path, capsys, extra="bandwidth_limit = 300000\n")
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    write(rig.mount / "big.bin", 3_000_000, -1)
    rig.snapshot("s1")
    proc = start_zbak("--config", str(rig.config), "replicate", text=True)
    sender = None
    deadline = time.monotonic() + 60  # zbak's start-up and checks took over 10 s at a load of 6
    while time.monotonic() < deadline:
        # zfs-fuse's zfs rewrites its own argv: "zfs send POOL/data s1", no "@"
        found = subprocess.run(["pgrep", "-f", f"zfs send {rig.data}"], capture_output=True, text=True)
        if found.stdout.strip():
            sender = int(found.stdout.split()[0])
            break
        time.sleep(0.1)
    if sender is None:
        proc.kill()
        pytest.fail("the sender never started: " + "".join(proc.communicate()))
    wait_for_bytes(rig.tmp / "state", "replicate", proc)  # mid-stream: bytes have moved
    os.kill(sender, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitStatus.FAILED, out + err
    assert "send" in err
    assert not guids(rig.replica) if zfs_exists(rig.replica) else True
    status, out, err = rig("replicate")
    assert status == ExitStatus.OK, out + err
    assert guids(rig.replica) == guids(rig.data)
    assert subprocess.run(["pgrep", "-f", f"zfs send .*{rig.data}"], capture_output=True).returncode == 1


def zfs_exists(name: str) -> bool:
    return subprocess.run(["zfs", "get", "-H", "guid", name], capture_output=True).returncode == 0


def test_source_prune_while_the_target_is_offline_keeps_the_base_and_the_next_run_is_incremental(rig, sshd):
    rig.snapshot("zbak_20260101T000000Z")
    assert rig("replicate")[0] == ExitStatus.OK
    for day in ("02", "03", "04"):
        rig.snapshot(f"zbak_202601{day}T000000Z")
    rig.write_config(port=1)  # the backup host is offline
    status, out, err = rig("replicate")
    assert status == ExitStatus.FAILED
    status, out, err = rig("prune", "--json")
    assert status == ExitStatus.OK, err
    decisions = {d["snapshot"].split("@")[1]: d for d in json.loads(out)["decisions"]}
    assert decisions["zbak_20260101T000000Z"]["action"] == "keep"
    assert any("replication base" in r for r in decisions["zbak_20260101T000000Z"]["reasons"])
    assert all(d["action"] == "keep" for d in decisions.values()), "nothing newer was replicated yet"
    rig.write_config()
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["rows"][0]["plan"].startswith("incremental -I zbak_20260101T000000Z")
    assert guids(rig.replica) == guids(rig.data)
    status, out, err = rig("prune")
    assert status == ExitStatus.OK
    assert list(guids(rig.data)) == ["zbak_20260104T000000Z"], "base moved, old ones pruned"


def test_a_diverged_target_is_refused_and_nothing_on_it_is_destroyed(rig):
    rig.snapshot("s1")
    assert rig("replicate")[0] == ExitStatus.OK
    zfs("snapshot", f"{rig.replica}@admin-made")
    rig.snapshot("s2")
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.FAILED
    assert "admin-made" in out and "diverged" in out
    assert set(guids(rig.replica)) == {"s1", "admin-made"}


def test_a_replica_written_since_its_newest_snapshot_is_refused_as_diverged_until_rollback_is_chosen(rig):
    """docs/design.md#replication, "modified since": the receiver's refusal becomes Diverged with
    what to do, nothing on the replica changes; on_divergence = "rollback" discards the writes.
    Replicas are readonly=on (docs/decisions.md#replicas-are-received-unmounted-and-read-only), so
    an admin turned that off to write."""
    rig.snapshot("s1")
    assert rig("replicate")[0] == ExitStatus.OK
    zfs("set", "readonly=off", rig.replica)
    zfs("mount", rig.replica)
    stray = Path(zfs("get", "-H", "-o", "value", "mountpoint", rig.replica).strip()) / "stray.txt"
    stray.write_text("written on the backup host")
    rig.snapshot("s2")

    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.FAILED
    assert "modified since its newest snapshot @s1" in out and "readonly=on" in out, out + err
    assert list(guids(rig.replica)) == ["s1"] and stray.exists()

    rig.write_config(extra='on_divergence = "rollback"\n')
    status, out, err = rig("replicate")
    assert status == ExitStatus.OK, out + err
    assert guids(rig.replica) == guids(rig.data)
    assert not stray.exists(), "the rollback discarded the write"


def test_the_rsync_fallback_keeps_a_point_in_time_tree_per_snapshot(make_pool, sshd, tmp_path, capsys):
    target_dir = tmp_path / "nas dir"
    rig = Rig(make_pool, sshd, tmp_path, capsys, targets=[f"backup:{target_dir}"])
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    write(rig.mount / "keep.txt", 1000, 1)
    write(rig.mount / "change.txt", 1000, 2)
    rig.snapshot("s1")
    write(rig.mount / "change.txt", 1000, 3)
    rig.snapshot("s2")
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    s1, s2 = target_dir / "snapshots/s1", target_dir / "snapshots/s2"
    assert (s1 / "change.txt").read_bytes() == bytes([2]) * 1000
    assert (s2 / "change.txt").read_bytes() == bytes([3]) * 1000
    assert (s1 / "keep.txt").stat().st_ino == (s2 / "keep.txt").stat().st_ino
    assert (target_dir / "current").resolve() == s2.resolve()
    status, out, _ = rig("status", "--json")
    assert json.loads(out)[0]["targets"][0]["cursor"] == "s2"


def test_a_pull_job_replicates_from_a_remote_source_into_a_local_pool(make_pool, sshd, tmp_path, capsys):
    rig = Rig(make_pool, sshd, tmp_path, capsys)
    replica = f"{rig.bak.name}/pulled"
    text = rig.config.read_text().replace(f'dataset = "{rig.data}"', f'dataset = "backup:{rig.data}"')
    rig.config.write_text(text.replace(f'targets = ["backup:{rig.replica}"]', f'targets = ["local:{replica}"]'))
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    write(rig.mount / "a.bin", 200_000, -1)
    rig.snapshot("s1")
    write(rig.mount / "b.bin", 200_000, -1)
    rig.snapshot("s2")
    status, out, err = rig("replicate")
    assert status == ExitStatus.OK, out + err
    assert guids(replica) == guids(rig.data)
    assert userrefs(f"{rig.data}@s2") == 1, "the remote source's base is held over ssh"


def test_rollback_is_opt_in_and_never_destroys_a_snapshot_zbak_did_not_make(make_pool, sshd, tmp_path, capsys):
    rig = Rig(make_pool, sshd, tmp_path, capsys, extra='on_divergence = "rollback"\n')
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    rig.snapshot("zbak_20260101T000000Z")
    rig.snapshot("zbak_20260102T000000Z")
    assert rig("replicate")[0] == ExitStatus.OK
    # The admin rolls the source back: the target now has a zbak snapshot the source lost.
    zfs("release", f"zbak:j:backup:{rig.replica}", f"{rig.data}@zbak_20260102T000000Z")
    zfs("destroy", f"{rig.data}@zbak_20260102T000000Z")
    rig.snapshot("zbak_20260103T000000Z")
    zfs("snapshot", f"{rig.replica}@admin-made")
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.FAILED, "a foreign snapshot on the target blocks the rollback"
    assert "admin-made" in out
    assert "admin-made" in guids(rig.replica)
    zfs("destroy", f"{rig.replica}@admin-made")  # the admin decides
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert "rollback" in json.loads(out)["rows"][0]["plan"]
    assert guids(rig.replica) == guids(rig.data)


def test_method_auto_falls_back_to_rsync_when_the_target_host_has_no_zfs(make_pool, sshd, tmp_path, capsys):
    rig = Rig(make_pool, sshd, tmp_path, capsys)
    name = f"zbakfallback{os.getpid()}/replica"
    text = rig.config.read_text().replace(f'targets = ["backup:{rig.replica}"]', f'targets = ["backup:{name}"]')
    rig.config.write_text(text.replace('connect_timeout = 5', 'connect_timeout = 5\nzfs = "/nonexistent/zfs"\n'
                                       'zpool = "/nonexistent/zpool"'))
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    write(rig.mount / "f.txt", 1000, 5)
    rig.snapshot("s1")
    directory = Path("/") / name
    try:
        status, out, err = rig("replicate", "--json")
        assert status == ExitStatus.OK, out + err
        assert "no zfs on backup" in out
        assert (directory / "snapshots/s1/f.txt").read_bytes() == bytes([5]) * 1000
        status, out, _ = rig("status", "--json")
        assert json.loads(out)[0]["targets"][0]["cursor"] == "s1"
    finally:
        import shutil
        shutil.rmtree(directory.parent, ignore_errors=True)


def test_a_push_goes_through_an_mbuffer_on_the_receiving_host_and_arrives_whole(rig):
    write(rig.mount / "a.bin", 3_000_000, -1)
    rig.snapshot("s1")
    status, out, err = rig("--debug", "replicate")
    assert status == ExitStatus.OK, out + err
    assert "mbuffer -q -v 1 -s 128k -m 65536k | zfs receive" in err
    assert guids(rig.replica) == guids(rig.data)


def test_in_a_tree_only_a_dataset_storing_16_mib_or_more_is_received_through_the_buffer(
        make_pool, sshd, tmp_path, capsys):
    """A small dataset's stream goes straight into ``zfs receive`` (a shell and an mbuffer
    fewer per dataset, zfs_target.SMALL_DATASET); a large one keeps the buffer; both arrive
    whole, and the next run's incrementals follow the same rule."""
    rig = Rig(make_pool, sshd, tmp_path, capsys, recursive=True)
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    for child in ("big", "small"):
        zfs("create", f"{rig.data}/{child}")
    write(rig.mount / "big" / "a.bin", 20 * 1024 * 1024, -1)
    write(rig.mount / "small" / "a.bin", 100_000, -1)
    for snapshot in ("s1", "s2"):
        rig.snapshot(snapshot)
        status, out, err = rig("--debug", "replicate")
        assert status == ExitStatus.OK, out + err
        receives = [line for line in err.splitlines() if "pipeline stage ssh backup" in line]
        assert len(receives) == 3, receives
        assert [line for line in receives if f"{rig.replica}/big" in line
                and "mbuffer -q -v 1 -s 128k -m 65536k | zfs receive" in line]
        assert [line for line in receives if f"{rig.replica}/small" in line
                and "mbuffer" not in line]
        assert [line for line in receives if f"{rig.replica}/" not in line
                and "mbuffer" not in line]  # the parent, which stores a few KiB
        for child in ("", "/big", "/small"):
            assert guids(rig.replica + child) == guids(rig.data + child)
        write(rig.mount / "small" / "b.bin", 100_000, -1)
        write(rig.mount / "big" / "b.bin", 100_000, -1)


def test_a_receiving_host_without_mbuffer_gets_the_stream_directly_with_a_note(
    make_pool, sshd_factory, tmp_path, capsys
):
    bin_dir = tmp_path / "bin"  # the remote sessions' PATH: zfs and zpool, no mbuffer
    bin_dir.mkdir()
    for tool in ("zfs", "zpool"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    server = sshd_factory(extra_config=[f"SetEnv PATH={bin_dir}"])
    rig = Rig(make_pool, server, tmp_path, capsys)
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    write(rig.mount / "a.bin", 300_000, -1)
    rig.snapshot("s1")
    status, out, err = rig("--debug", "replicate")
    assert status == ExitStatus.OK, out + err
    assert "backup has no mbuffer: receiving without a buffer" in err
    assert "mbuffer -q" not in err
    assert guids(rig.replica) == guids(rig.data)


def _replicated_bytes_are_the_streams(rig: Rig, size: int) -> None:
    """Write ``size`` random bytes, snapshot, replicate: the run records the stream's bytes
    (within 3 %) and the replica has the source's guids."""
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    write(rig.mount / "big.bin", size, -1)
    rig.snapshot("s1")
    stream = len(subprocess.run(["zfs", "send", f"{rig.data}@s1"], capture_output=True,
                                check=True).stdout)
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert guids(rig.replica) == guids(rig.data)
    status, out, _ = rig("status", "--json")
    (run,) = [r for r in json.loads(out)[0]["last_runs"] if r["action"] == "replicate"]
    assert abs(run["bytes"] - stream) < 0.03 * stream, (run["bytes"], stream)


def test_under_a_bandwidth_limit_the_run_records_the_bytes_really_sent(make_pool, sshd, tmp_path, capsys):
    """docs/decisions.md#pv-copies-so-its-bytes-are-counted: pv's splice(2) is invisible to the
    rchar counter zbak reads on a zfs-fuse source (a 105 MB stream was recorded as 4 MB); ``pv -C``
    makes it count."""
    rig = Rig(make_pool, sshd, tmp_path, capsys, extra='bandwidth_limit = "1GiB"\n')
    _replicated_bytes_are_the_streams(rig, 40 * 1024 * 1024)


def test_a_replica_on_this_machine_records_the_bytes_really_sent(make_pool, sshd, tmp_path,
                                                                 capsys):
    """A zfs-fuse ``zfs receive`` hands the stream to the daemon as its ``zfs send`` does,
    so neither process's I/O counter sees it: a relay is counted (the run recorded 25 KB of
    a 21 MB stream before)."""
    rig = Rig(make_pool, sshd, tmp_path, capsys)
    rig.write_config(targets=[f"local:{rig.replica}"])
    _replicated_bytes_are_the_streams(rig, 20 * 1024 * 1024)


def test_one_diverged_child_is_reported_and_every_other_dataset_is_still_replicated(
        make_pool, sshd, tmp_path, capsys):
    """docs/decisions.md#one-diverged-dataset-does-not-stop-its-tree: the diverged child is left
    untouched and named; its siblings after it in the loop (and its parent) get the new snapshot;
    the run is recorded partial and raises the failure event; exit 1."""
    rig = Rig(make_pool, sshd, tmp_path, capsys, recursive=True)
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    for child in ("a", "b", "c"):
        zfs("create", f"{rig.data}/{child}")
    rig.snapshot("s1")
    assert rig("replicate")[0] == ExitStatus.OK
    zfs("snapshot", f"{rig.replica}/a@admin-made")
    rig.snapshot("s2")

    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.FAILED
    rows = json.loads(out)["rows"]
    (bad,) = [r for r in rows if r["dataset"] == f"{rig.data}/a"]
    assert bad["plan"].startswith("diverged:") and "admin-made" in bad["plan"]
    (failed,) = [r for r in rows if r["plan"] == "FAILED"]
    assert f"{rig.replica}/a diverged" in failed["error"]
    assert set(guids(f"{rig.replica}/a")) == {"s1", "admin-made"}, "nothing on it changed"
    for child in ("", "/b", "/c"):
        assert guids(rig.replica + child) == guids(rig.data + child)
    assert "event failure" in err and "ended partial" in err

    status, out, _ = rig("status", "--json")
    (run,) = [r for r in json.loads(out)[0]["last_runs"] if r["action"] == "replicate"]
    assert run["result"] == "partial" and run["bytes"] > 0
    assert f"{rig.replica}/a diverged" in run["error"]


def test_a_destroyed_last_replicated_snapshot_on_the_target_is_named_as_the_cause(rig):
    """docs/decisions.md#divergence-messages-say-what-happened: zfs calls such a target "modified
    since most recent snapshot"; the message names the destroyed snapshot and the way back, not
    writes or access times."""
    write(rig.mount / "a.bin", 100_000, -1)
    rig.snapshot("s1")
    write(rig.mount / "b.bin", 100_000, -1)
    rig.snapshot("s2")
    assert rig("replicate")[0] == ExitStatus.OK
    zfs("destroy", f"{rig.replica}@s2")
    rig.snapshot("s3")

    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.FAILED
    assert f"{rig.replica}@s2, the last snapshot replicated to it, was destroyed" in out, out + err
    assert f"zfs rollback {rig.replica}@s1" in out and "access times" not in out
    assert list(guids(rig.replica)) == ["s1"]

    rig.write_config(extra='on_divergence = "rollback"\n')
    status, out, err = rig("replicate")
    assert status == ExitStatus.OK, out + err
    assert guids(rig.replica) == guids(rig.data)


def test_a_target_whose_common_snapshots_were_all_destroyed_says_how_to_start_over(rig):
    rig.snapshot("s1")
    assert rig("replicate")[0] == ExitStatus.OK
    zfs("destroy", f"{rig.replica}@s1")
    rig.snapshot("s2")
    status, out, _ = rig("replicate", "--json")
    assert status == ExitStatus.FAILED
    assert "no snapshot in common" in out and f"zfs rename {rig.replica} {rig.replica}.old" in out


def test_a_source_snapshot_re_created_under_an_old_name_is_named_with_what_to_do(rig):
    """docs/decisions.md#divergence-messages-say-what-happened: @s2 destroyed and re-created on the
    source after @s3 was replicated. zfs receive -I would fail "destination already exists" on every
    run; zbak names the guid mismatch and the way out, and renaming the stale copy on the target is
    enough."""
    for short in ("s1", "s2", "s3"):
        write(rig.mount / f"{short}.bin", 50_000, -1)
        rig.snapshot(short)
    assert rig("replicate")[0] == ExitStatus.OK
    zfs("destroy", f"{rig.data}@s2")
    write(rig.mount / "again.bin", 50_000, -1)
    rig.snapshot("s2")

    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.FAILED
    new, old = guids(rig.data)["s2"], guids(rig.replica)["s2"]
    assert f"@s2 (source guid {new}, target guid {old})" in out, out + err
    assert "re-created" in out and "destination already exists" in out
    assert "ssh" not in json.loads(out)["rows"][-1]["error"], "no raw argv"
    assert guids(rig.replica)["s2"] == old

    zfs("rename", f"{rig.replica}@s2", f"{rig.replica}@s2-stale")
    status, out, err = rig("replicate")
    assert status == ExitStatus.OK, out + err
    assert guids(rig.replica)["s2"] == new
