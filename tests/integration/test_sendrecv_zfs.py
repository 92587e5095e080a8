"""Send/receive primitives on real ZFS: the planner's steps, built by the argv builders and
piped process to process, give replicas with equal guids.

zfs-fuse (pool v23) covers full and ``-I`` sends, rollback and the absence of resume tokens
and bookmarks. Resume tokens, bookmarks and raw sends run on real OpenZFS 2.3 in the
session's QEMU guest (``openzfs_vm`` of tests/support/openzfs.py, shared with the rest of the
``openzfs`` tier: one boot per run), each test in two fresh pools (``openzfs_pools``):
control commands go through the session's SSHExecutor (paramiko, strict host keys) and the
data path through two OpenSSH clients (``proc.openssh.ssh_argv`` + ``remote_command``) with
this process pumping bytes between them, so a transfer can be cut after N bytes
(docs/reliability.md#r1-interrupted-full-send-resumes,
docs/reliability.md#r2-interrupted-incremental-i-resumes, docs/reliability.md#r3-stale-token).
"""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.openzfs import COMMAND_TIMEOUT as OPENZFS_TIMEOUT
from support.openzfs import OpenZfsPools
from support.zfs import COMMAND_TIMEOUT

from zrepl_py.config.hosts import HostConfig
from zrepl_py.errors import (
    DatasetExists,
    DatasetNotFound,
    NewerSnapshotsExist,
    ResumeTokenInvalid,
    Unsupported,
    ZfsError,
)
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.proc.openssh import remote_command, ssh_argv
from zrepl_py.proc.ssh import SSHExecutor
from zrepl_py.replication.planner import Plan, SourceState, TargetState, plan_replication
from zrepl_py.zfs.capabilities import detect
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import BookmarkName, DatasetName, SnapshotName
from zrepl_py.zfs.resume import describe_token
from zrepl_py.zfs.sendrecv import receive_argv, send_argv
from zrepl_py.zfs.steps import AbortResume, BookmarkRef, Full, Incremental, Resume, SnapRef

MiB = 1024 * 1024


# -- shared helpers ----------------------------------------------------------------------


def snap_refs(zfs: Zfs, dataset: str) -> tuple[SnapRef, ...]:
    """The dataset's snapshots as planner input (empty when it does not exist)."""
    try:
        tree = zfs.tree(dataset, recursive=False)
    except DatasetNotFound:
        return ()
    return tuple(SnapRef(s.short, s.guid, s.createtxg) for s in tree.snapshots(dataset))


def guids(zfs: Zfs, dataset: str) -> dict[str, int]:
    return {ref.name: ref.guid for ref in snap_refs(zfs, dataset)}


def source_state(zfs: Zfs, dataset: str, *, encrypted: bool = False) -> SourceState:
    marks = ()
    if zfs.capabilities.bookmarks:
        marks = tuple(BookmarkRef(b.short, b.guid, b.createtxg) for b in zfs.bookmarks(dataset))
    return SourceState(dataset, snap_refs(zfs, dataset), marks, encrypted)


def target_state(src: Zfs, dst: Zfs, dataset: str) -> TargetState:
    exists = dst.exists(dataset)
    token = None
    if exists and dst.capabilities.resume_tokens:
        raw = dst.resume_token(dataset)
        token = describe_token(src.executor, raw) if raw else None
    return TargetState(dataset, exists, snap_refs(dst, dataset), token)


@dataclasses.dataclass
class Piped:
    """Outcome of one send | receive: exit codes, receiver stderr, bytes passed on."""

    send_rc: int
    receive_rc: int
    receive_stderr: str
    bytes: int


def pipe(send_cmd: list[str], receive_cmd: list[str], *, limit: int | None = None,
         timeout: float = 300) -> Piped:
    """Run ``send_cmd | receive_cmd`` with this process copying the bytes; with ``limit``
    the receiver gets only that many bytes, then EOF, and the sender is killed (by pid)."""
    with tempfile.TemporaryFile() as send_err, tempfile.TemporaryFile() as recv_err:
        sender = subprocess.Popen(send_cmd, stdout=subprocess.PIPE, stderr=send_err,
                                  stdin=subprocess.DEVNULL)
        receiver = subprocess.Popen(receive_cmd, stdin=subprocess.PIPE, stderr=recv_err,
                                    stdout=subprocess.DEVNULL)
        copied = 0
        try:
            while True:
                chunk = sender.stdout.read1(256 * 1024)
                if not chunk:
                    break
                if limit is not None and copied + len(chunk) >= limit:
                    receiver.stdin.write(chunk[: limit - copied])
                    copied = limit
                    break
                receiver.stdin.write(chunk)
                copied += len(chunk)
        except BrokenPipeError:
            pass
        finally:
            try:
                receiver.stdin.close()
            except BrokenPipeError:
                pass
            if limit is not None and copied >= limit:
                sender.kill()
            sender.stdout.close()
        receive_rc = receiver.wait(timeout)
        send_rc = sender.wait(timeout)
        recv_err.seek(0)
        return Piped(send_rc, receive_rc, recv_err.read().decode(errors="replace"), copied)


# -- zfs-fuse ----------------------------------------------------------------------------


@pytest.fixture
def local(zpool) -> Zfs:
    executor = LocalExecutor()
    return Zfs(executor, capabilities=detect(executor, zpool.name, timeout=COMMAND_TIMEOUT),
               timeout=COMMAND_TIMEOUT)


def write(path: Path, size: int, seed: int) -> None:
    path.write_bytes(bytes((seed + i) % 251 for i in range(256)) * (size // 256))


def run_local_plan(zfs: Zfs, plan: Plan, src: str, dst: str) -> None:
    for step in plan.steps:
        send = send_argv(step, source_dataset=src, caps=zfs.capabilities, raw=False)
        receive = receive_argv(dst, caps=zfs.capabilities, resumable=True)
        sender = subprocess.Popen(send, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        done = subprocess.run(receive, stdin=sender.stdout, capture_output=True,
                              timeout=COMMAND_TIMEOUT)
        sender.stdout.close()
        send_err = sender.stderr.read()
        assert sender.wait(COMMAND_TIMEOUT) == 0, send_err
        assert done.returncode == 0, done.stderr


def test_a_planned_full_and_incremental_sent_through_the_argv_builders_give_equal_guids(
        local, zpool):
    src, dst = f"{zpool.name}/src", f"{zpool.name}/dst"
    local.create_filesystem(src)
    for n, short in enumerate(("a", "b")):
        write(zpool.mountpoint / "src" / f"f{n}", MiB, n)
        local.snapshot(SnapshotName.of(src, short))

    plan = plan_replication(source_state(local, src), target_state(local, local, dst))
    assert [type(s) for s in plan.steps] == [Full, Incremental]
    run_local_plan(local, plan, src, dst)
    assert guids(local, dst) == guids(local, src)
    # receive -u: the replica is not mounted over anything.
    assert local.get_properties(dst, ["mounted"])["mounted"] == "no"

    for n, short in enumerate(("c", "d"), start=2):
        write(zpool.mountpoint / "src" / f"f{n}", MiB, n)
        local.snapshot(SnapshotName.of(src, short))
    plan = plan_replication(source_state(local, src), target_state(local, local, dst))
    assert [(type(s), s.to.name) for s in plan.steps] == [(Incremental, "d")]
    assert plan.steps[0].base.name == "b" and plan.steps[0].intermediates
    run_local_plan(local, plan, src, dst)

    assert list(guids(local, dst).items()) == list(guids(local, src).items())
    assert plan_replication(source_state(local, src), target_state(local, local, dst)).up_to_date


def test_rollback_refuses_while_newer_snapshots_exist_then_discards_later_changes(local, zpool):
    ds = f"{zpool.name}/r"
    local.create_filesystem(ds)
    local.snapshot(SnapshotName.of(ds, "a"))
    write(zpool.mountpoint / "r" / "later", 4096, 1)
    local.snapshot(SnapshotName.of(ds, "b"))

    with pytest.raises(NewerSnapshotsExist):
        local.rollback(SnapshotName.of(ds, "a"))
    assert local.exists(f"{ds}@b")

    local.destroy_snapshot(SnapshotName.of(ds, "b"))
    local.rollback(SnapshotName.of(ds, "a"))
    assert not (zpool.mountpoint / "r" / "later").exists()
    with pytest.raises(DatasetNotFound):
        local.rollback(SnapshotName.of(ds, "missing"))


def test_zfs_fuse_has_no_resume_tokens_or_bookmarks_and_says_so_with_unsupported(local, zpool):
    ds = DatasetName(zpool.name)
    local.snapshot(SnapshotName.of(ds, "s"))
    assert not local.capabilities.resume_tokens and not local.capabilities.bookmarks

    for call in (lambda z: z.resume_token(ds), lambda z: z.abort_resume(ds),
                 lambda z: z.bookmarks(ds),
                 lambda z: z.bookmark(SnapshotName.of(ds, "s"), BookmarkName(f"{ds}#m"))):
        with pytest.raises(Unsupported, match="not run"):
            call(local)
    # Even when told otherwise, zfs-fuse's own answers map to Unsupported.
    told = Zfs(local.executor, timeout=COMMAND_TIMEOUT, capabilities=dataclasses.replace(
        local.capabilities, resume_tokens=True, bookmarks=True))
    with pytest.raises(Unsupported):
        told.resume_token(ds)
    with pytest.raises(Unsupported):
        describe_token(local.executor, "1-10f6e0d6b9-f0-789c63", timeout=COMMAND_TIMEOUT)


# -- OpenZFS 2.3 in the zfsvm guest --------------------------------------------------------


@dataclasses.dataclass
class Guest:
    """The session's guest for one test: control (paramiko) and data path (OpenSSH argv)."""

    host: HostConfig
    known_hosts: Path
    executor: SSHExecutor
    zfs: Zfs
    control: Path
    pools: OpenZfsPools

    def ssh(self, argv: list[str]) -> list[str]:
        """The local argv that runs ``argv`` in the guest over OpenSSH (strict host keys).

        Test-only addition: one multiplexed connection (a fresh one costs ~1 s under TCG).
        """
        base = ssh_argv(self.host, known_hosts_default=self.known_hosts)
        mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control}",
               "-o", "ControlPersist=60"]
        return base[:1] + mux + base[1:] + [remote_command(argv, sudo=False)]

    def run(self, *argv: str, input: bytes | None = None) -> str:
        return self.executor.run(list(argv), input=input, timeout=OPENZFS_TIMEOUT).text

    def fill(self, dataset: str, name: str, mib: int) -> None:
        """Write ``mib`` MiB of random data into the (mounted) dataset."""
        self.run("dd", "if=/dev/urandom", f"of=/{dataset}/{name}", "bs=1M", f"count={mib}",
                 "status=none")


@pytest.fixture(scope="module")
def ssh_control(openzfs_vm, tmp_path_factory) -> Iterator[Path]:
    """ControlPath of this module's multiplexed OpenSSH connection to the guest; the master
    is told to exit at the end."""
    control = tmp_path_factory.mktemp("mux") / "control"
    yield control
    if control.exists():
        base = ssh_argv(openzfs_vm.host_config(), known_hosts_default=openzfs_vm.known_hosts)
        subprocess.run(base[:1] + ["-o", f"ControlPath={control}", "-O", "exit"] + base[1:],
                       capture_output=True, timeout=30, check=False)


@pytest.fixture
def guest(openzfs_vm, openzfs_executor, openzfs_pools, ssh_control) -> Guest:
    """The shared guest (tests/support/openzfs.py) with this test's two fresh pools."""
    zfs = Zfs(openzfs_executor, timeout=OPENZFS_TIMEOUT,
              capabilities=detect(openzfs_executor, openzfs_pools.source,
                                  timeout=OPENZFS_TIMEOUT))
    return Guest(openzfs_vm.host_config(), openzfs_vm.known_hosts, openzfs_executor, zfs,
                 ssh_control, openzfs_pools)


@pytest.fixture
def names(guest) -> tuple[str, str]:
    """The (source, target) dataset pair of this test, in its own source and target pools."""
    return f"{guest.pools.source}/data", f"{guest.pools.target}/data"


def run_step(guest: Guest, step, src: str, dst: str, *, raw: bool = False,
             limit: int | None = None) -> Piped:
    caps = guest.zfs.capabilities
    send = send_argv(step, source_dataset=src, caps=caps, raw=raw)
    receive = receive_argv(dst, caps=caps, resumable=True)
    return pipe(guest.ssh(send), guest.ssh(receive), limit=limit)


def run_plan(guest: Guest, plan: Plan, src: str, dst: str, *, raw: bool = False) -> None:
    for step in plan.steps:
        if isinstance(step, AbortResume):
            guest.zfs.abort_resume(dst)
            continue
        done = run_step(guest, step, src, dst, raw=raw)
        assert (done.send_rc, done.receive_rc) == (0, 0), done.receive_stderr


def replan(guest: Guest, src: str, dst: str, *, encrypted: bool = False) -> Plan:
    return plan_replication(source_state(guest.zfs, src, encrypted=encrypted),
                            target_state(guest.zfs, guest.zfs, dst))


@pytest.mark.openzfs
def test_openzfs_capabilities_include_resume_tokens_bookmarks_and_raw_send(guest):
    caps = guest.zfs.capabilities
    assert caps.resume_tokens and caps.bookmarks and caps.raw_send and caps.compressed_send


@pytest.mark.openzfs
def test_an_interrupted_full_receive_leaves_a_token_that_describes_and_resumes(guest, names):
    """docs/reliability.md#r1-interrupted-full-send-resumes."""
    src, dst = names
    zfs = guest.zfs
    zfs.create_filesystem(src)
    guest.fill(src, "f", 4)
    zfs.snapshot(SnapshotName.of(src, "a"))
    guest.fill(src, "g", 1)
    zfs.snapshot(SnapshotName.of(src, "b"))
    assert zfs.resume_token(guest.pools.source) is None

    plan = replan(guest, src, dst)
    cut = run_step(guest, plan.steps[0], src, dst, limit=100_000)
    assert cut.receive_rc != 0 and "saved" in cut.receive_stderr

    raw = zfs.resume_token(dst)
    assert raw is not None
    token = describe_token(guest.executor, raw)
    assert token.toname == f"{src}@a" and token.fromguid is None and not token.raw
    assert token.toguid == guids(zfs, src)["a"]
    assert 0 < token.bytes <= 100_000

    plan = replan(guest, src, dst)
    assert [type(s) for s in plan.steps] == [Resume, Incremental]
    assert plan.steps[0].to.name == "a" and plan.steps[1].to.name == "b"
    run_plan(guest, plan, src, dst)
    assert zfs.resume_token(dst) is None
    assert guids(zfs, dst) == guids(zfs, src)


@pytest.mark.openzfs
def test_an_interrupted_incremental_resumes_from_its_token(guest, names):
    """docs/reliability.md#r2-interrupted-incremental-i-resumes."""
    src, dst = names
    zfs = guest.zfs
    zfs.create_filesystem(src)
    zfs.snapshot(SnapshotName.of(src, "a"))
    run_plan(guest, replan(guest, src, dst), src, dst)
    for short in ("b", "c"):
        guest.fill(src, short, 2)
        zfs.snapshot(SnapshotName.of(src, short))

    plan = replan(guest, src, dst)
    [step] = plan.steps
    assert isinstance(step, Incremental) and step.intermediates and step.to.name == "c"
    cut = run_step(guest, plan.steps[0], src, dst, limit=300_000)
    assert cut.receive_rc != 0

    token = describe_token(guest.executor, zfs.resume_token(dst))
    assert token.fromguid == guids(zfs, src)["a"] and token.toname == f"{src}@b"
    assert token.compressed  # the -c of the interrupted send is kept in the token
    plan = replan(guest, src, dst)
    assert [type(s) for s in plan.steps] == [Resume, Incremental]
    run_plan(guest, plan, src, dst)
    assert guids(zfs, dst) == guids(zfs, src)


@pytest.mark.openzfs
def test_a_stale_token_is_aborted_and_replication_continues_without_a_loop(guest, names):
    """docs/reliability.md#r3-stale-token."""
    src, dst = names
    zfs = guest.zfs
    zfs.create_filesystem(src)
    zfs.snapshot(SnapshotName.of(src, "a"))
    run_plan(guest, replan(guest, src, dst), src, dst)
    guest.fill(src, "b", 2)
    zfs.snapshot(SnapshotName.of(src, "b"))
    plan = replan(guest, src, dst)
    assert run_step(guest, plan.steps[0], src, dst, limit=100_000).receive_rc != 0
    zfs.destroy_snapshot(SnapshotName.of(src, "b"))  # docs/reliability.md#r3-stale-token
    zfs.snapshot(SnapshotName.of(src, "c"))

    # zfs prints the contents of a token whose snapshot is gone, then fails; still read.
    stale = describe_token(guest.executor, zfs.resume_token(dst))
    assert stale.toname == f"{src}@b"
    plan = replan(guest, src, dst)
    assert isinstance(plan.steps[0], AbortResume)
    assert "no longer exists on the source" in plan.steps[0].reason
    run_plan(guest, plan, src, dst)

    assert zfs.resume_token(dst) is None
    assert guids(zfs, dst) == guids(zfs, src)
    assert replan(guest, src, dst).up_to_date


@pytest.mark.openzfs
def test_abort_resume_clears_the_token_and_keeps_the_last_complete_snapshot(guest, names):
    src, dst = names
    zfs = guest.zfs
    zfs.create_filesystem(src)
    zfs.snapshot(SnapshotName.of(src, "a"))
    run_plan(guest, replan(guest, src, dst), src, dst)
    guest.fill(src, "b", 2)
    zfs.snapshot(SnapshotName.of(src, "b"))
    run_step(guest, replan(guest, src, dst).steps[0], src, dst, limit=100_000)
    assert zfs.resume_token(dst) is not None

    zfs.abort_resume(dst)

    assert zfs.resume_token(dst) is None
    assert list(guids(zfs, dst)) == ["a"]
    with pytest.raises(ZfsError):
        zfs.abort_resume(dst)  # nothing left to abort


@pytest.mark.openzfs
def test_aborting_an_interrupted_full_receive_removes_the_partial_dataset(guest, names):
    src, dst = names
    zfs = guest.zfs
    zfs.create_filesystem(src)
    guest.fill(src, "f", 2)
    zfs.snapshot(SnapshotName.of(src, "a"))
    run_step(guest, Full(snap_refs(zfs, src)[0]), src, dst, limit=100_000)
    assert zfs.exists(dst) and zfs.resume_token(dst)

    zfs.abort_resume(dst)

    assert not zfs.exists(dst)  # what the planner assumes after aborting a full token


@pytest.mark.openzfs
def test_bookmarks_are_listed_and_an_incremental_from_a_bookmark_works(guest, names):
    src, dst = names
    zfs = guest.zfs
    zfs.create_filesystem(src)
    zfs.snapshot(SnapshotName.of(src, "a"))
    run_plan(guest, replan(guest, src, dst), src, dst)
    a = snap_refs(zfs, src)[0]
    zfs.bookmark(SnapshotName.of(src, "a"), BookmarkName(f"{src}#cursor"))
    with pytest.raises(DatasetExists):
        zfs.bookmark(SnapshotName.of(src, "a"), BookmarkName(f"{src}#cursor"))
    with pytest.raises(ValueError):
        zfs.bookmark(SnapshotName.of(src, "a"), BookmarkName(f"{dst}#elsewhere"))

    [mark] = zfs.bookmarks(src)
    assert (mark.name, mark.short, mark.guid, mark.createtxg) == (
        f"{src}#cursor", "cursor", a.guid, a.createtxg)
    assert mark.creation.utcoffset().total_seconds() == 0

    for short in ("b", "c"):
        guest.fill(src, short, 1)
        zfs.snapshot(SnapshotName.of(src, short))
    zfs.destroy_snapshot(SnapshotName.of(src, "a"))

    plan = replan(guest, src, dst)
    assert [(type(s), s.intermediates) for s in plan.steps] == [
        (Incremental, False), (Incremental, True)]
    assert plan.steps[0].base == BookmarkRef("cursor", a.guid, a.createtxg)
    run_plan(guest, plan, src, dst)
    target = guids(zfs, dst)
    assert target == {"a": a.guid, **guids(zfs, src)}

    zfs.destroy_bookmark(BookmarkName(f"{src}#cursor"))
    assert zfs.bookmarks(src) == []
    with pytest.raises(DatasetNotFound):
        zfs.destroy_bookmark(BookmarkName(f"{src}#cursor"))


@pytest.mark.openzfs
def test_an_encrypted_dataset_is_sent_raw_and_its_interrupted_token_is_raw(guest, names):
    src, dst = names
    zfs = guest.zfs
    # pbkdf2iters: the minimum (zfsprops(7)); the default costs ~4 s of emulated CPU
    guest.run("zfs", "create", "-o", "encryption=on", "-o", "keyformat=passphrase",
              "-o", "pbkdf2iters=100000", src, input=b"correct horse battery\n")
    guest.fill(src, "f", 2)
    zfs.snapshot(SnapshotName.of(src, "a"))

    plan = replan(guest, src, dst, encrypted=True)
    cut = run_step(guest, plan.steps[0], src, dst, raw=True, limit=100_000)
    assert cut.receive_rc != 0
    token = describe_token(guest.executor, zfs.resume_token(dst))
    assert token.raw

    plan = replan(guest, src, dst, encrypted=True)
    assert [type(s) for s in plan.steps] == [Resume]
    run_plan(guest, plan, src, dst, raw=True)
    assert guids(zfs, dst) == guids(zfs, src)
    assert zfs.get_properties(dst, ["keystatus"])["keystatus"] == "unavailable"


@pytest.mark.openzfs
def test_openzfs_rollback_refuses_newer_snapshots_and_corrupt_tokens_are_typed(guest, names):
    src, _ = names
    zfs = guest.zfs
    zfs.create_filesystem(src)
    zfs.snapshot(SnapshotName.of(src, "a"))
    zfs.snapshot(SnapshotName.of(src, "b"))
    with pytest.raises(NewerSnapshotsExist):
        zfs.rollback(SnapshotName.of(src, "a"))
    zfs.destroy_snapshot(SnapshotName.of(src, "b"))
    zfs.rollback(SnapshotName.of(src, "a"))

    with pytest.raises(ResumeTokenInvalid, match="corrupt"):
        describe_token(guest.executor, "1-a56906fd1-b8-789c63")
