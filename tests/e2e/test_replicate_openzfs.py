"""``zbak replicate`` end to end on real OpenZFS 2.3: zbak on this host, source AND target in
the QEMU guest of tests/support/openzfs.py (remote-to-remote, docs/design.md#replication).

The job is ``dataset = "vm:SRC/data"`` with target ``vm:DST/replica``, so every transfer is
``ssh guest zfs send | [pv -L] | ssh guest zfs receive -s`` started by zbak on this host.
The CLI runs in-process (``zrepl_py.cli.main``), or as ``python -m zrepl_py`` when a test
kills the guest's ``zfs send`` mid-stream. Expected values are read in the guest with plain
``zfs get``/``zfs holds``/``zfs list``, independently of the code under test; the features
zfs-fuse lacks (resume tokens, bookmarks, raw send) are the point of this file.
"""

from __future__ import annotations

import json
import textwrap
import time

import pytest
from support.cli import run_zbak, start_zbak, wait_for_bytes
from support.common import replication_config
from support.openzfs import COMMAND_TIMEOUT

from zrepl_py.errors import ExitStatus
from zrepl_py.zfs.protect import bookmark_prefix

MiB = 1024 * 1024
RATE = 500_000
"""Bytes/s of the rate limit while a transfer is to be interrupted. After the kill, zbak still
passes what the ssh channel had buffered (~2 MB, measured) at this rate before the sender's
ssh exits, so a lower rate only makes the interrupted run longer."""
BIG_MIB = 16
"""MiB of random data in the snapshot whose transfer is interrupted: the guest's ``zfs send``
blocks once ~2 MB are buffered, then writes at RATE, so it is still running ~28 s later (6 MiB,
~8 s, was once too short on a loaded 2-CPU host: the send had ended before the kill)."""


class Rig:
    """Two fresh guest pools, a config replicating ``vm:SRC/data`` to ``vm:DST/replica``."""

    def __init__(self, vm, executor, pools, tmp_path, capsys):
        self.vm, self.executor, self.capsys, self.tmp = vm, executor, capsys, tmp_path
        self.data = f"{pools.source}/data"
        self.replica = f"{pools.target}/replica"
        self.target = f"vm:{self.replica}"
        self.tag = f"zbak:j:{self.target}"
        self.config = tmp_path / "zbak.toml"
        self.row: dict = {}
        """The dataset row of the last ``replicate()``."""
        self.write_config()

    def write_config(self, *, rate: int | None = None, targets: list[str] | None = None,
                     extra: str = "") -> None:
        """(Re)write the config; ``rate`` sets ``bandwidth_limit`` in bytes/s, ``targets``
        replaces the one target, ``extra`` is appended (dedented)."""
        limit = f"bandwidth_limit = {rate}\n" if rate else ""
        self.config.write_text(replication_config(
            self.tmp / "state", "vm", self.vm.host_config(), f"vm:{self.data}",
            targets or [self.target], connect_timeout=30, extra=limit + textwrap.dedent(extra)))

    def __call__(self, *args: str) -> tuple[int, str, str]:
        """Run ``zbak --config CONFIG ARGS`` (a process); return (status, stdout, stderr)."""
        return run_zbak("--config", str(self.config), *args)

    def replicate(self) -> str:
        """``zbak replicate --json`` must succeed; return the one dataset row's plan text."""
        status, out, err = self("replicate", "--json")
        assert status == ExitStatus.OK, out + err
        (self.row,) = json.loads(out)["rows"]
        return self.row["plan"]

    def replicate_logged(self) -> tuple[str, str]:
        """``zbak --debug replicate --json`` must succeed; return (the one row's plan, the
        log, which names every command run)."""
        status, out, err = self("--debug", "replicate", "--json")
        assert status == ExitStatus.OK, out + err
        (self.row,) = json.loads(out)["rows"]
        return self.row["plan"], err

    def guest(self, *argv: str, input: bytes | None = None, check: bool = True) -> str:
        """Run argv in the guest; return its stdout."""
        return self.executor.run(list(argv), input=input, check=check,
                                 timeout=COMMAND_TIMEOUT).text  # fmt: skip

    def write(self, name: str, mib: float) -> None:
        """Write ``mib`` MiB of random (incompressible) data to the source's ``name``."""
        where = self.prop(self.data, "mountpoint")
        self.guest("dd", "if=/dev/urandom", f"of={where}/{name}", "bs=64K",
                   f"count={int(mib * 16)}", "iflag=fullblock", "status=none")  # fmt: skip

    def snapshot(self, short: str) -> None:
        self.guest("zfs", "snapshot", f"{self.data}@{short}")

    def guids(self, dataset: str) -> dict[str, int]:
        """``{short name: guid}`` of the dataset's snapshots ({} when it does not exist)."""
        done = self.executor.run(["zfs", "get", "-Hp", "-d", "1", "-t", "snapshot", "-o",
                                  "name,value", "guid", dataset], check=False,
                                 timeout=COMMAND_TIMEOUT)  # fmt: skip
        return {line.split("\t")[0].split("@", 1)[1]: int(line.split("\t")[1])
                for line in done.text.splitlines()}  # fmt: skip

    def prop(self, name: str, prop: str) -> str:
        return self.guest("zfs", "get", "-H", "-o", "value", prop, name).strip()

    def token(self) -> str:
        """The replica's ``receive_resume_token`` ("-" when there is none)."""
        return self.prop(self.replica, "receive_resume_token")

    def holds(self, short: str) -> list[str]:
        """The hold tags on ``SRC/data@short`` (``zfs holds -H``: name, tag, time)."""
        text = self.guest("zfs", "holds", "-H", f"{self.data}@{short}")
        return [line.split("\t")[1] for line in text.splitlines()]

    def bookmarks(self) -> dict[str, int]:
        """``{short bookmark name: guid}`` of the source dataset."""
        text = self.guest("zfs", "list", "-Hp", "-t", "bookmark", "-o", "name,guid", self.data)
        return {line.split("\t")[0].split("#", 1)[1]: int(line.split("\t")[1])
                for line in text.splitlines()}  # fmt: skip

    def senders(self) -> list[str]:
        """pids of the guest's ``zfs send`` of this source (``[z]`` keeps pgrep off itself)."""
        done = self.executor.run(["pgrep", "-f", f"[z]fs send .*{self.data}"], check=False,
                                 timeout=COMMAND_TIMEOUT)  # fmt: skip
        return done.text.split()

    def receivers(self) -> list[str]:
        """pids of the guest's ``zfs receive`` into the replica."""
        done = self.executor.run(["pgrep", "-f", f"[z]fs receive .*{self.replica}"],
                                 check=False, timeout=COMMAND_TIMEOUT)  # fmt: skip
        return done.text.split()

    def mid_stream(self, proc, at_least: int = 1) -> None:
        """Wait until the running ``zbak replicate`` ``proc`` has moved ``at_least`` bytes
        and the guest runs its ``zfs send`` and ``zfs receive``; fail when ``proc`` ends
        first. Waits on this host first (zbak's running-transfer file): each ``pgrep`` in the
        guest costs emulated CPU that zbak's own commands there are waiting for."""
        try:
            wait_for_bytes(self.tmp / "state", "replicate", proc, at_least=at_least)
        except AssertionError as exc:
            pytest.fail(f"{exc}: " + "".join(proc.communicate(timeout=30)))
        deadline = time.monotonic() + 90
        while not (self.senders() and self.receivers()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the guest's zfs send | zfs receive never showed up: "
                            + "".join(proc.communicate(timeout=30)))  # fmt: skip
            time.sleep(0.2)

    def interrupted_replicate(self) -> str:
        """Run ``zbak replicate`` rate-limited, kill the guest's ``zfs send`` mid-stream
        (``mid_stream``), and return zbak's stderr (zbak must exit 1)."""
        self.write_config(rate=RATE)
        proc = start_zbak("--config", str(self.config), "replicate", text=True)
        try:
            # A MiB, not a byte: killed before the guest's receive processed a record, the
            # receive leaves no resume token (seen with one emulated CPU at a load of 6).
            self.mid_stream(proc, at_least=MiB)
            killed = self.executor.run(["pkill", "-KILL", "-f", f"[z]fs send .*{self.data}"],
                                       check=False, timeout=COMMAND_TIMEOUT)  # fmt: skip
            assert killed.returncode == 0, "zfs send ended before it could be killed"
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == ExitStatus.FAILED, out + err
        assert not self.senders() and not self.receivers(), "no transfer outlives zbak"
        self.write_config()
        return err


@pytest.fixture
def rig(openzfs_vm, openzfs_executor, openzfs_pools, tmp_path, capsys):
    r = Rig(openzfs_vm, openzfs_executor, openzfs_pools, tmp_path, capsys)
    r.guest("zfs", "create", r.data)
    assert r("init", "--no-checks")[0] == ExitStatus.OK
    return r


def test_full_then_incremental_on_openzfs_moves_the_hold_and_the_bookmark_with_the_base(rig):
    rig.write("a.bin", 0.25)
    rig.snapshot("s1")
    rig.write("b.bin", 0.25)
    rig.snapshot("s2")

    assert rig.replicate() == "full s1; incremental -I s1 -> s2"
    assert rig.guids(rig.replica) == rig.guids(rig.data)
    # counted on the remote sender's ssh: at least the 512 KiB of random data went through
    assert 2 * 256 * 1024 < rig.row["bytes"] < 4 * 256 * 1024, rig.row
    assert rig.holds("s2") == [rig.tag] and rig.holds("s1") == []
    s2 = rig.guids(rig.data)["s2"]
    assert rig.bookmarks() == {f"{bookmark_prefix('j', rig.target)}{s2:016x}": s2}

    rig.write("c.bin", 0.25)
    rig.snapshot("s3")
    assert rig.replicate() == "incremental -I s2 -> s3"
    assert rig.guids(rig.replica) == rig.guids(rig.data)
    assert rig.holds("s3") == [rig.tag]
    assert rig.holds("s2") == [], "the old base's hold is released once the cursor moved"
    assert list(rig.bookmarks().values()) == [rig.guids(rig.data)["s3"]]
    assert rig.replicate() == "up to date"


def test_an_interrupted_full_send_is_resumed_from_the_receive_resume_token(rig):
    """docs/reliability.md#r1-interrupted-full-send-resumes."""
    rig.write("big.bin", BIG_MIB)
    rig.snapshot("s1")
    rig.write("small.bin", 0.1)
    rig.snapshot("s2")

    err = rig.interrupted_replicate()
    assert "zfs send" in err
    assert rig.token() not in ("", "-")
    assert "s1" not in rig.guids(rig.replica)
    assert rig.holds("s1") == [], "nothing arrived, so nothing is protected yet"

    assert rig.replicate() == "resume s1; incremental -I s1 -> s2"
    assert rig.row["bytes"] < BIG_MIB * MiB, "the resumed stream starts where the cut one ended"
    assert rig.guids(rig.replica) == rig.guids(rig.data)
    assert rig.token() == "-"
    assert rig.holds("s2") == [rig.tag]


def test_an_interrupted_incremental_send_is_resumed_from_the_receive_resume_token(rig):
    """docs/reliability.md#r2-interrupted-incremental-i-resumes."""
    rig.snapshot("s1")
    assert rig.replicate() == "full s1"
    rig.write("big.bin", BIG_MIB)
    rig.snapshot("s2")
    rig.write("small.bin", 0.1)
    rig.snapshot("s3")

    rig.interrupted_replicate()
    assert rig.token() not in ("", "-")
    assert list(rig.guids(rig.replica)) == ["s1"]
    assert rig.holds("s1") == [rig.tag], "a failed run leaves the base protected"

    assert rig.replicate() == "resume s2; incremental -I s2 -> s3"
    assert rig.row["bytes"] < BIG_MIB * MiB, "the resumed stream starts where the cut one ended"
    assert rig.guids(rig.replica) == rig.guids(rig.data)
    assert rig.token() == "-"
    assert rig.holds("s3") == [rig.tag] and rig.holds("s1") == []


def test_a_token_whose_snapshot_was_destroyed_is_aborted_once_and_replication_goes_on(rig):
    """docs/reliability.md#r3-stale-token."""
    rig.snapshot("s1")
    assert rig.replicate() == "full s1"
    rig.write("big.bin", BIG_MIB)
    rig.snapshot("s2")
    rig.interrupted_replicate()
    assert rig.token() not in ("", "-")
    assert rig.holds("s2") == [], "zbak's hold is on the base s1, not on the half-sent s2"
    rig.guest("zfs", "destroy", f"{rig.data}@s2")
    rig.snapshot("s3")

    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["rows"][0]["plan"] == "abortresume; incremental -I s1 -> s3"
    assert "aborting the partial receive" in err and "no longer exists on the source" in err
    assert rig.token() == "-"
    assert rig.guids(rig.replica) == rig.guids(rig.data)
    assert rig.replicate() == "up to date"


def test_the_cursor_bookmark_is_the_incremental_base_after_an_admin_destroyed_the_base(rig):
    rig.write("a.bin", 0.25)
    rig.snapshot("s1")
    assert rig.replicate() == "full s1"
    s1 = rig.guids(rig.data)["s1"]
    (mark,) = rig.bookmarks()
    rig.guest("zfs", "release", rig.tag, f"{rig.data}@s1")
    rig.guest("zfs", "destroy", f"{rig.data}@s1")
    rig.write("b.bin", 0.25)
    rig.snapshot("s2")
    rig.write("c.bin", 0.25)
    rig.snapshot("s3")

    assert rig.replicate() == f"incremental -i {mark} -> s2; incremental -I s2 -> s3"
    assert rig.guids(rig.replica) == {"s1": s1, **rig.guids(rig.data)}
    assert rig.holds("s3") == [rig.tag]
    assert list(rig.bookmarks().values()) == [rig.guids(rig.data)["s3"]]


def test_an_encrypted_dataset_is_replicated_raw_and_arrives_without_its_key(rig, request):
    """docs/reliability.md#r38-encrypted-datasets."""
    keyfile = f"/root/zbak-key-{rig.data.split('/')[0]}"
    request.addfinalizer(lambda: rig.executor.run(["rm", "-f", keyfile], check=False))
    rig.guest("dd", f"of={keyfile}", "status=none", input=b"correct horse battery staple\n")
    rig.guest("zfs", "destroy", rig.data)  # the rig's empty plain one: make it encrypted
    # pbkdf2iters: the minimum (zfsprops(7)); the default costs ~4 s of emulated CPU per use
    rig.guest("zfs", "create", "-o", "encryption=on", "-o", "keyformat=passphrase",
              "-o", f"keylocation=file://{keyfile}", "-o", "pbkdf2iters=100000",
              rig.data)  # fmt: skip
    rig.write("secret", 0.25)
    rig.snapshot("s1")

    plan, err = rig.replicate_logged()
    assert plan == "full s1"
    # the pipeline's argv, logged at DEBUG: raw, with the properties
    # (docs/decisions.md#replica-properties-keep-a-failover-replica-faithful)
    assert f"zfs send -w -p {rig.data}@s1" in err
    rig.write("more", 0.25)
    rig.snapshot("s2")
    assert rig.replicate() == "incremental -I s1 -> s2"

    assert rig.guids(rig.replica) == rig.guids(rig.data)
    # a non-raw stream into the unencrypted DST pool would give encryption=off
    assert rig.prop(rig.replica, "encryption") == "aes-256-gcm"
    assert rig.prop(rig.replica, "keystatus") == "unavailable"
    assert rig.prop(rig.replica, "encryptionroot") == rig.replica


def test_init_reports_the_openzfs_features_of_source_and_target(rig):
    status, out, err = rig("init", "--json")
    assert status == ExitStatus.OK, out + err
    checks = {c["subject"]: c for c in json.loads(out)["checks"]}
    source, target = checks[f"job j: source vm:{rig.data}"], checks[f"job j: target {rig.target}"]
    for check in (source, target):
        assert check["ok"], check
        assert check["detail"].startswith("pool v5000, features: ")
        for feature in ("resume_tokens", "bookmarks", "raw_send", "compressed_send", "holds"):
            assert feature in check["detail"], check


def test_sigterm_mid_transfer_leaves_a_resume_token_and_the_rerun_resumes_from_it(rig):
    """docs/design.md#operations: SIGTERM (what ``zbak daemon`` sends its running child on stop, and
    systemd on ``systemctl stop``) mid-transfer leaves a resumable receive on OpenZFS; the rerun
    continues from the token instead of sending the snapshot again."""
    rig.write("big.bin", BIG_MIB)
    rig.snapshot("s1")
    rig.write_config(rate=RATE)
    proc = start_zbak("--config", str(rig.config), "replicate", text=True)
    try:
        rig.mid_stream(proc, at_least=MiB)
        deadline = time.monotonic() + 90
        # zbak counts bytes as its pipe passes them; the guest's receive may not have begun
        # (emulated CPU, loaded host). Until its dataset exists there is nothing to resume.
        while rig.executor.run(["zfs", "list", "-H", "-o", "name", rig.replica], check=False,
                               timeout=COMMAND_TIMEOUT).returncode:  # fmt: skip
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != ExitStatus.OK, out + err
    assert not rig.senders() and not rig.receivers(), "no transfer outlives zbak"
    assert rig.token() not in ("", "-"), err
    rig.write_config()

    assert rig.replicate() == "resume s1"
    assert rig.row["bytes"] < BIG_MIB * MiB, "the resumed stream starts where the cut one ended"
    assert rig.guids(rig.replica) == rig.guids(rig.data)
    assert rig.token() == "-"


# -- replicas that survive a reboot, properties, pool features, bookmark guids --------------


def value_and_source(rig: Rig, name: str, prop: str) -> tuple[str, str]:
    """``(value, source)`` of one property in the guest (plain ``zfs get``)."""
    value, source = rig.guest("zfs", "get", "-Hp", "-o", "value,source", prop, name).strip() \
        .split("\t")
    return value, source


def boot_mounts(rig: Rig) -> None:
    """What the backup host's boot does, ``zfs mount -a`` (zfs-mount(8): every filesystem
    whose canmount is ``on``), limited to this test's pools: other sessions share the guest."""
    for pool in (rig.data.split("/")[0], rig.replica.split("/")[0]):
        listing = rig.guest("zfs", "list", "-H", "-o", "name,canmount,mounted", "-r", pool)
        for name, canmount, mounted in (line.split("\t") for line in listing.splitlines()):
            if canmount == "on" and mounted == "no":
                rig.guest("zfs", "mount", name)


def test_properties_arrive_but_mountpoint_and_reservation_stay_off_and_a_reboot_mounts_nothing(
        rig):
    """docs/decisions.md#replica-properties-keep-a-failover-replica-faithful: a failover replica
    gets the source's recordsize, compression, atime, xattr and user properties (``zfs send -p``),
    never its mountpoint (a path of the backup host) or refreservation, and is ``canmount=noauto
    readonly=on``, so the backup host's ``zfs mount -a`` at boot leaves it alone and the nightly run
    goes on."""
    where = f"/srv/zbak-{rig.data.split('/')[0]}"
    rig.guest("zfs", "set", "recordsize=1M", "compression=zstd", "atime=off", "xattr=dir",
              "com.example:owner=ops", f"mountpoint={where}", "refreservation=1M", rig.data)
    rig.write("a.bin", 1.5)
    rig.snapshot("s1")

    plan, err = rig.replicate_logged()
    assert plan == "full s1"
    assert f"zfs send -c -L -e -p {rig.data}@s1" in err
    assert (f"zfs receive -u -s -o canmount=noauto -o readonly=on -x mountpoint "
            f"-x refreservation -x sharenfs -x sharesmb {rig.replica}") in err
    for prop, value in (("recordsize", "1048576"), ("compression", "zstd"), ("atime", "off"),
                        ("xattr", "dir"), ("com.example:owner", "ops")):
        assert value_and_source(rig, rig.replica, prop) == (value, "received"), prop
    assert value_and_source(rig, rig.replica, "canmount") == ("noauto", "local")
    assert value_and_source(rig, rig.replica, "readonly") == ("on", "local")
    mountpoint, source = value_and_source(rig, rig.replica, "mountpoint")
    assert mountpoint != where and source != "received"
    assert value_and_source(rig, rig.replica, "refreservation")[1] != "received"

    boot_mounts(rig)
    assert rig.prop(rig.replica, "mounted") == "no"
    rig.write("b.bin", 0.25)
    rig.snapshot("s2")
    assert rig.replicate() == "incremental -I s1 -> s2"
    assert rig.guids(rig.replica) == rig.guids(rig.data)
    assert value_and_source(rig, rig.replica, "mountpoint")[1] != "received"


def test_a_replica_made_without_properties_never_keeps_the_mountpoint_zfs_receive_x_let_in(
        rig):
    """docs/decisions.md#replica-properties-keep-a-failover-replica-faithful: OpenZFS 2.3 applies a
    stream's ``mountpoint`` despite ``-x`` when the replica was received without properties before
    (openzfs/zfs#17240), as replicas made by an older zbak were; zbak reads the replica back and
    inherits it again."""
    where = f"/srv/zbak-old-{rig.data.split('/')[0]}"
    rig.guest("zfs", "set", f"mountpoint={where}", rig.data)
    # the bug needs the replica's mountpoint inherited from a local one, as on a backup pool
    # mounted where its admin wants it
    target_pool = rig.replica.split("/")[0]
    rig.guest("zfs", "set", f"mountpoint=/srv/backup-{target_pool}", target_pool)
    rig.write("a.bin", 0.25)
    rig.snapshot("s1")
    rig.guest("sh", "-c", f"zfs send {rig.data}@s1 | zfs receive -u {rig.replica}")
    assert value_and_source(rig, rig.replica, "canmount") == ("on", "default")
    rig.snapshot("s2")

    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["rows"][0]["plan"] == "incremental -I s1 -> s2"
    # zfs receive -x did not keep it on 2.3.2 (a later OpenZFS that does needs no repair)
    assert (f"mountpoint of {rig.replica} was the stream's {where} (received, though "
            "excluded); running zfs inherit mountpoint") in err
    mountpoint, source = value_and_source(rig, rig.replica, "mountpoint")
    assert source != "received" and mountpoint != where, (mountpoint, source, err)
    assert value_and_source(rig, rig.replica, "canmount") == ("noauto", "local")
    assert value_and_source(rig, rig.replica, "readonly") == ("on", "local")
    boot_mounts(rig)
    assert rig.prop(rig.replica, "mounted") == "no"
    rig.snapshot("s3")  # the mask zfs inherit left survives the next stream's mountpoint
    assert rig.replicate() == "incremental -I s2 -> s3"
    assert value_and_source(rig, rig.replica, "mountpoint")[1] != "received"


def test_pools_created_with_d_or_compatibility_legacy_get_streams_they_can_receive(
        rig, request):
    """docs/decisions.md#send-flags-follow-the-receiving-pool: ``-c -L -e`` toward a pool without
    large_blocks, embedded_data or lz4_compress fails ("pool must be upgraded to receive this
    stream"); zbak reads the receiving pool's features and sends what it takes, large blocks split.
    A restore into such a pool gets the same care."""
    pools = {}
    for how in (["-d"], ["-o", "compatibility=legacy"]):
        name = f"{rig.data.split('/')[0]}{'d' if how == ['-d'] else 'l'}"
        image = f"/var/tmp/{name}.img"
        rig.guest("truncate", "-s", "256M", image)
        rig.guest("zpool", "create", *how, name, image)
        request.addfinalizer(lambda n=name, i=image: rig.executor.run(
            ["sh", "-c", f"zpool destroy -f {n}; rm -f {i}"], check=False,
            timeout=COMMAND_TIMEOUT))
        pools[name] = f"vm:{name}/replica"
    rig.guest("zfs", "set", "recordsize=1M", rig.data)
    rig.write("large.bin", 2)  # 1 MiB blocks: large_blocks active on the source
    rig.guest("sh", "-c", f"echo tiny > /{rig.data}/tiny.txt")  # an embedded block
    rig.snapshot("s1")
    rig.write("more.bin", 0.25)
    rig.snapshot("s2")
    rig.write_config(targets=list(pools.values()))

    status, out, err = rig("--debug", "replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert [r["plan"] for r in json.loads(out)["rows"]] == [
        "full s1; incremental -I s1 -> s2"] * 2
    assert f"zfs send -p {rig.data}@s1" in err and "-c -L -e" not in err
    for target in pools.values():
        replica = target.split(":", 1)[1]
        assert rig.guids(replica) == rig.guids(rig.data)
        assert value_and_source(rig, replica, "canmount") == ("noauto", "local")
    rig.write("last.bin", 0.25)
    rig.snapshot("s3")
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert [r["plan"] for r in json.loads(out)["rows"]] == ["incremental -I s2 -> s3"] * 2

    legacy = next(iter(pools))
    into = f"{legacy}/restored"
    status, out, err = rig("--debug", "restore", f"vm:{rig.data}", "--to", "@s3", "--into",
                           into, "--from", "local", "--yes")  # fmt: skip
    assert status == ExitStatus.OK, out + err
    assert f"zfs send {rig.data}@s1" in err and "-c -L -e" not in err
    assert rig.guids(into) == rig.guids(rig.data)


def test_a_bookmark_with_the_cursor_name_but_another_snapshot_is_replaced_by_guid(rig):
    """docs/decisions.md#a-cursor-bookmark-is-trusted-by-guid: a bookmark already carrying the name
    zbak gives its cursor, but made from another snapshot, is not trusted by name: zbak replaces it
    (with a warning), so after the base snapshot is destroyed the next run goes on from the bookmark
    instead of stopping as diverged."""
    rig.write("a.bin", 0.25)
    rig.snapshot("s1")
    assert rig.replicate() == "full s1"
    rig.write("b.bin", 0.25)
    rig.snapshot("s2")
    s1, s2 = rig.guids(rig.data)["s1"], rig.guids(rig.data)["s2"]
    impostor = f"{bookmark_prefix('j', rig.target)}{s2:016x}"
    rig.guest("zfs", "bookmark", f"{rig.data}@s1", f"{rig.data}#{impostor}")
    assert rig.bookmarks()[impostor] == s1

    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["rows"][0]["plan"] == "incremental -I s1 -> s2"
    assert f"{rig.data}#{impostor} has the name of zbak's cursor" in err
    assert rig.bookmarks() == {impostor: s2}, "the cursor bookmark is s2's, by guid"

    rig.guest("zfs", "release", rig.tag, f"{rig.data}@s2")
    rig.guest("zfs", "destroy", f"{rig.data}@s2")
    rig.write("c.bin", 0.25)
    rig.snapshot("s3")
    assert rig.replicate() == f"incremental -i {impostor} -> s3"
    assert rig.guids(rig.replica) == {"s1": s1, "s2": s2, **rig.guids(rig.data)}
