"""The rsync fallback on real zfs-fuse pools, real rsync and the real sshd (root@127.0.0.1).

The source dataset holds a small tree with a name with spaces, a hard link, a symlink and an
empty directory; between snapshots ``first`` and ``second one`` a file changes, one is
deleted, one is added and one only changes mode. Trees are compared by type, mode, owner,
mtime, content and symlink target against what the dataset held when each snapshot was taken.
"""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.zfs import COMMAND_TIMEOUT

from zrepl_py.config.hosts import Endpoint
from zrepl_py.errors import RSYNC_EXIT_VALUES, DatasetNotFound, RsyncFailed, RsyncNotFound
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.proc.openssh import ssh_argv_without_address
from zrepl_py.proc.ssh import SSHExecutor
from zrepl_py.replication.rsync import (
    Location,
    check_rsync_installed,
    last_synced,
    replicate_snapshot_rsync,
    rsync_argv,
    run_rsync,
)
from zrepl_py.replication.snapshot_view import VIEW_PREFIX, snapshot_view
from zrepl_py.values.timetable import Timetable
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName, SnapshotName

FIRST = "first"
SECOND = "second one"


def tree_of(root: Path) -> dict[str, tuple]:
    """Every entry below ``root`` (and root itself as ``.``): type, mode, owner, mtime,
    SHA-256 of a file's content or a symlink's target. Inodes are left out on purpose."""
    entries: dict[str, tuple] = {}
    st = os.stat(root)  # follows a symlink such as DIR/current
    entries["."] = ("dir", st.st_mode, st.st_uid, st.st_gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if os.path.islink(path):
                entries[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                entries[rel] = ("dir", st.st_mode, st.st_uid, st.st_gid)
            else:
                digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                entries[rel] = ("file", st.st_mode, st.st_uid, st.st_gid, int(st.st_mtime),
                                digest)
    return entries


def view_clones(pool: str) -> list[str]:
    done = subprocess.run(["zfs", "list", "-H", "-o", "name", "-r", pool],
                          capture_output=True, text=True, check=True, timeout=COMMAND_TIMEOUT)
    return [n for n in done.stdout.split() if n.split("/")[-1].startswith(VIEW_PREFIX)]


def view_mount_dirs() -> set[str]:
    return set(glob.glob("/tmp/zbak-view.*"))


def no_new_view_dirs(before: set[str], limit: float = 60.0) -> bool:
    """Whether the ``/tmp/zbak-view.*`` directories not in ``before`` are all gone, waiting
    up to ``limit`` seconds: /tmp is the host's, and another test session (scripts/test.sh
    runs two) may hold a view of its own meanwhile; one this test leaked never goes."""
    deadline = time.monotonic() + limit
    while view_mount_dirs() - before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


class Source:
    """A dataset with two snapshots and the content each held, plus its Zfs client."""

    def __init__(self, zfs: Zfs, dataset: DatasetName, mountpoint: Path):
        self.zfs = zfs
        self.dataset = dataset
        self.mountpoint = mountpoint
        self.expected: dict[str, dict[str, tuple]] = {}

    def snapshot(self, short: str) -> SnapshotName:
        name = SnapshotName.of(self.dataset, short)
        self.zfs.snapshot(name)
        self.expected[short] = tree_of(self.mountpoint)
        return name


@pytest.fixture
def zfs(zpool) -> Zfs:
    return Zfs(LocalExecutor(), timeout=COMMAND_TIMEOUT)


@pytest.fixture
def source(zfs, zpool) -> Source:
    """``POOL/data`` with snapshots ``first`` and ``second one`` (see the module doc)."""
    dataset = DatasetName(zpool.name).child("data")
    zfs.create_filesystem(dataset)
    top = zpool.mountpoint / "data"
    (top / "sub").mkdir()
    (top / "empty").mkdir()
    (top / "a file with spaces.txt").write_text("spaces\n")
    (top / "sub" / "shared").write_bytes(os.urandom(20_000))
    os.link(top / "sub" / "shared", top / "hard link")
    os.symlink("sub/shared", top / "symlink")
    (top / "changes.txt").write_text("version 1\n")
    (top / "goes away.txt").write_text("bye\n")
    (top / "mode only").write_text("same content\n")
    os.chmod(top / "mode only", 0o644)
    src = Source(zfs, dataset, top)
    src.snapshot(FIRST)
    (top / "changes.txt").write_text("version 2, longer\n")
    (top / "goes away.txt").unlink()
    (top / "new file").write_text("new\n")
    os.chmod(top / "mode only", 0o600)
    src.snapshot(SECOND)
    return src


def _ino(path: Path) -> int:
    return os.lstat(path).st_ino


def _check_two_trees(directory: Path, source: Source) -> None:
    """The documented layout after replicating ``first`` then ``second one``."""
    first, second = directory / "snapshots" / FIRST, directory / "snapshots" / SECOND
    assert sorted(os.listdir(directory / "snapshots")) == [FIRST, SECOND]
    assert tree_of(second) == source.expected[SECOND]
    assert tree_of(first) == source.expected[FIRST], "the older tree must not change"
    assert os.readlink(directory / "current") == f"snapshots/{SECOND}"
    assert tree_of(directory / "current") == source.expected[SECOND]
    for unchanged in ("a file with spaces.txt", "sub/shared", "hard link"):
        assert _ino(first / unchanged) == _ino(second / unchanged), unchanged
    assert _ino(second / "sub" / "shared") == _ino(second / "hard link")
    assert _ino(first / "changes.txt") != _ino(second / "changes.txt")
    assert (first / "changes.txt").read_text() == "version 1\n"
    # A mode-only change gets its own inode, so the older tree keeps the old mode.
    assert _ino(first / "mode only") != _ino(second / "mode only")
    assert os.lstat(first / "mode only").st_mode & 0o777 == 0o644
    assert os.lstat(second / "mode only").st_mode & 0o777 == 0o600
    assert os.listdir(directory / "partial") == []


def test_a_local_directory_gets_point_in_time_trees_sharing_unchanged_files(
    source, zpool, tmp_path
):
    directory = tmp_path / "back up dir"
    target = Endpoint("local", None, str(directory))
    mounts_before = view_mount_dirs()
    local = LocalExecutor()

    one = replicate_snapshot_rsync(source.zfs, SnapshotName.of(source.dataset, FIRST), target,
                                   None, local, known_hosts_default=tmp_path / "kh")
    assert os.readlink(directory / "current") == f"snapshots/{FIRST}"
    two = replicate_snapshot_rsync(source.zfs, SnapshotName.of(source.dataset, SECOND), target,
                                   None, local, known_hosts_default=tmp_path / "kh")

    _check_two_trees(directory, source)
    assert one.snapshot_dir == str(directory / "snapshots" / FIRST)
    assert two.snapshot_dir == str(directory / "snapshots" / SECOND)
    assert one.bytes_sent > 20_000 > two.bytes_sent > 0
    assert one.warnings == two.warnings == []
    assert not one.already_present and not two.already_present
    assert last_synced(local, str(directory)) == [FIRST, SECOND]
    assert view_clones(zpool.name) == []
    assert no_new_view_dirs(mounts_before)


def test_running_again_for_a_replicated_snapshot_transfers_nothing(source, tmp_path):
    directory = tmp_path / "dir"
    target = Endpoint("local", None, str(directory))
    snap = SnapshotName.of(source.dataset, FIRST)
    replicate_snapshot_rsync(source.zfs, snap, target, None, LocalExecutor(),
                             known_hosts_default=tmp_path / "kh")
    inode = _ino(directory / "snapshots" / FIRST / "changes.txt")

    again = replicate_snapshot_rsync(source.zfs, snap, target, None, LocalExecutor(),
                                     known_hosts_default=tmp_path / "kh")

    assert again.already_present and again.bytes_sent == 0
    assert _ino(directory / "snapshots" / FIRST / "changes.txt") == inode


def test_filling_in_an_older_snapshot_late_keeps_current_on_the_newest(source, tmp_path):
    directory = tmp_path / "dir"
    target = Endpoint("local", None, str(directory))
    for short in (SECOND, FIRST):
        replicate_snapshot_rsync(source.zfs, SnapshotName.of(source.dataset, short), target,
                                 None, LocalExecutor(), known_hosts_default=tmp_path / "kh")
    _check_two_trees(directory, source)


def test_push_over_ssh_to_a_directory_with_spaces_keeps_point_in_time_trees(
    source, zpool, sshd, tmp_path
):
    # The key sits in a directory whose name needs quoting inside rsync's -e string.
    key_dir = tmp_path / "key dir's"
    key_dir.mkdir()
    key = key_dir / "id key"
    key.write_bytes(sshd.identity_file.read_bytes())
    key.chmod(0o600)
    host = sshd.host_config(identity_file=key)
    directory = tmp_path / "remote back up"
    target = Endpoint("backup", None, str(directory))
    mounts_before = view_mount_dirs()
    with SSHExecutor("backup", host, known_hosts_default=tmp_path / "kh") as remote:
        results = [
            replicate_snapshot_rsync(source.zfs, SnapshotName.of(source.dataset, short), target,
                                     host, remote, known_hosts_default=tmp_path / "kh")
            for short in (FIRST, SECOND)
        ]
        assert last_synced(remote, str(directory)) == [FIRST, SECOND]

    _check_two_trees(directory, source)
    assert all(r.bytes_sent > 0 and r.warnings == [] for r in results)
    assert view_clones(zpool.name) == []
    assert no_new_view_dirs(mounts_before)


def test_pull_from_a_source_over_ssh_into_a_local_directory(zpool, sshd, tmp_path):
    local_zfs = Zfs(LocalExecutor(), timeout=COMMAND_TIMEOUT)
    dataset = DatasetName(zpool.name).child("pulled")
    local_zfs.create_filesystem(dataset)
    top = zpool.mountpoint / "pulled"
    (top / "x y").write_text("pulled\n")
    expected = tree_of(top)
    local_zfs.snapshot(SnapshotName.of(dataset, "p1"))
    directory = tmp_path / "pulled here"
    with SSHExecutor("src", sshd.host_config(), known_hosts_default=tmp_path / "kh") as ssh:
        remote_zfs = Zfs(ssh, timeout=COMMAND_TIMEOUT)
        result = replicate_snapshot_rsync(
            remote_zfs, SnapshotName.of(dataset, "p1"), Endpoint("local", None, str(directory)),
            None, LocalExecutor(), known_hosts_default=tmp_path / "kh")

    assert tree_of(directory / "snapshots" / "p1") == expected
    assert result.bytes_sent > 0
    assert view_clones(zpool.name) == []


def test_a_failing_rsync_records_no_tree_and_leaves_no_clone(source, zpool, tmp_path):
    """docs/reliability.md#r43-rsync-exit-codes."""
    directory = tmp_path / "dir"
    snap = SnapshotName.of(source.dataset, FIRST)
    guid = source.zfs.get_properties(snap, ["guid"])["guid"]
    (directory / "partial").mkdir(parents=True)
    (directory / "partial" / guid).write_text("a file where rsync needs a directory")
    mounts_before = view_mount_dirs()

    with pytest.raises(RsyncFailed) as caught:
        replicate_snapshot_rsync(source.zfs, snap, Endpoint("local", None, str(directory)),
                                 None, LocalExecutor(), known_hosts_default=tmp_path / "kh")

    assert caught.value.returncode not in (0, 24, None)
    assert caught.value.stderr
    assert f"(rsync: {RSYNC_EXIT_VALUES[caught.value.returncode]})" in str(caught.value)
    assert os.listdir(directory / "snapshots") == []
    assert not os.path.lexists(directory / "current")
    assert view_clones(zpool.name) == []
    assert no_new_view_dirs(mounts_before)


def test_a_killed_rsync_records_no_tree_and_the_next_run_resumes(zfs, zpool, tmp_path):
    """docs/reliability.md#r43-rsync-exit-codes."""
    dataset = DatasetName(zpool.name).child("big")
    zfs.create_filesystem(dataset)
    top = zpool.mountpoint / "big"
    (top / "big.bin").write_bytes(os.urandom(8 * 1024 * 1024))
    (top / "small").write_text("small\n")
    expected = tree_of(top)
    snap = SnapshotName.of(dataset, "s")
    zfs.snapshot(snap)
    directory = tmp_path / "dir"
    target = Endpoint("local", None, str(directory))

    with pytest.raises(RsyncFailed) as caught:  # 8 s at 1 MiB/s (bwlimit binds), killed at 4 s
        replicate_snapshot_rsync(zfs, snap, target, None, LocalExecutor(),
                                 known_hosts_default=tmp_path / "kh",
                                 bandwidth_limit=Timetable((), 1024 * 1024), timeout=4)
    assert caught.value.returncode is None
    assert os.listdir(directory / "snapshots") == []
    assert view_clones(zpool.name) == []
    guid = zfs.get_properties(snap, ["guid"])["guid"]
    kept = directory / "partial" / guid / "big.bin"
    deadline = time.monotonic() + 30  # the killed client's receiver notices EOF, then keeps it
    while not (kept.exists() and kept.stat().st_size > 0):
        assert time.monotonic() < deadline, "--partial kept nothing"
        time.sleep(0.05)
    assert kept.stat().st_size < 8 * 1024 * 1024, "--partial keeps what arrived"

    result = replicate_snapshot_rsync(zfs, snap, target, None, LocalExecutor(),
                                      known_hosts_default=tmp_path / "kh")

    assert tree_of(directory / "snapshots" / "s") == expected
    assert result.bytes_sent > 0
    assert os.listdir(directory / "partial") == []


def test_partial_trees_of_snapshots_gone_from_the_source_are_removed_after_a_success(
    source, tmp_path
):
    directory = tmp_path / "dir"
    stale = directory / "partial" / "12345"
    stale.mkdir(parents=True)
    (stale / "leftover").write_text("from a snapshot that no longer exists\n")
    replicate_snapshot_rsync(source.zfs, SnapshotName.of(source.dataset, FIRST),
                             Endpoint("local", None, str(directory)), None, LocalExecutor(),
                             known_hosts_default=tmp_path / "kh")
    assert os.listdir(directory / "partial") == []
    assert tree_of(directory / "snapshots" / FIRST) == source.expected[FIRST]


def test_a_current_that_is_not_a_symlink_is_left_alone_with_a_warning(source, tmp_path):
    directory = tmp_path / "dir"
    (directory / "current").mkdir(parents=True)
    (directory / "current" / "mine").write_text("the user's own file\n")
    result = replicate_snapshot_rsync(source.zfs, SnapshotName.of(source.dataset, FIRST),
                                      Endpoint("local", None, str(directory)), None,
                                      LocalExecutor(), known_hosts_default=tmp_path / "kh")
    assert any("not a symlink" in w for w in result.warnings)
    assert os.listdir(directory / "current") == ["mine"]
    assert tree_of(directory / "snapshots" / FIRST) == source.expected[FIRST]


def test_a_missing_snapshot_raises_dataset_not_found_and_transfers_nothing(source, tmp_path):
    directory = tmp_path / "dir"
    with pytest.raises(DatasetNotFound):
        replicate_snapshot_rsync(source.zfs, SnapshotName.of(source.dataset, "nope"),
                                 Endpoint("local", None, str(directory)), None, LocalExecutor(),
                                 known_hosts_default=tmp_path / "kh")
    assert not directory.exists()


def test_the_snapshot_view_is_a_read_only_clone_that_is_destroyed_even_on_error(source, zpool):
    snap = SnapshotName.of(source.dataset, FIRST)
    mounts_before = view_mount_dirs()
    with snapshot_view(source.zfs, snap) as path:
        assert tree_of(Path(path)) == source.expected[FIRST]
        assert len(view_clones(zpool.name)) == 1
        with pytest.raises(OSError):
            (Path(path) / "written").write_text("no")
    assert view_clones(zpool.name) == []
    assert no_new_view_dirs(mounts_before)

    with pytest.raises(RuntimeError, match="inside the view"):
        with snapshot_view(source.zfs, snap):
            raise RuntimeError("inside the view")
    assert view_clones(zpool.name) == []
    assert no_new_view_dirs(mounts_before)


def test_a_snapshot_view_of_a_missing_snapshot_leaves_nothing_behind(source, zpool):
    mounts_before = view_mount_dirs()
    with pytest.raises(DatasetNotFound):
        with snapshot_view(source.zfs, SnapshotName.of(source.dataset, "nope")):
            pass
    assert view_clones(zpool.name) == []
    assert no_new_view_dirs(mounts_before)


def test_vanished_source_files_are_a_warning_not_a_failure(tmp_path):
    """docs/reliability.md#r43-rsync-exit-codes."""
    src, dst = tmp_path / "live", tmp_path / "dst"
    src.mkdir()
    (src / "a-big").write_bytes(os.urandom(2 * 1024 * 1024))
    (src / "z-vanishes").write_text("soon gone\n")
    argv = rsync_argv(Location(str(src)), Location(str(dst)), bandwidth_limit=1024 * 1024)

    def remove_once_a_big_is_being_written() -> None:
        # rsync lists (and checksums) every file first, then writes a-big to a temporary
        # ".a-big.XXXXXX" for ~2 s; z-vanishes disappears in between.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if dst.is_dir() and any(n.startswith(".a-big.") for n in os.listdir(dst)):
                break
            time.sleep(0.02)
        (src / "z-vanishes").unlink()

    remover = threading.Thread(target=remove_once_a_big_is_being_written)
    remover.start()
    try:
        run = run_rsync(LocalExecutor(), argv)
    finally:
        remover.join()
    assert run.returncode == 24
    assert any("vanished" in line for line in run.warnings)
    assert (dst / "a-big").stat().st_size == 2 * 1024 * 1024
    assert not (dst / "z-vanishes").exists()


def test_rsync_missing_on_a_side_is_reported_as_rsync_not_found(sshd, tmp_path):
    no_rsync_here = LocalExecutor(prefix=["env", "PATH=/nonexistent"])
    with pytest.raises(RsyncNotFound):
        check_rsync_installed(no_rsync_here)
    with pytest.raises(RsyncNotFound):
        run_rsync(no_rsync_here, rsync_argv(Location("/tmp"), Location(str(tmp_path / "d"))))
    # The far side's shell cannot start the given rsync program.
    ssh = ssh_argv_without_address(sshd.host_config(), known_hosts_default=tmp_path / "kh")
    (tmp_path / "src").mkdir()
    argv = rsync_argv(Location(str(tmp_path / "src")), Location(str(tmp_path / "d"), sshd.host),
                      ssh=ssh, rsync_path="/nonexistent/rsync")
    with pytest.raises(RsyncNotFound) as caught:
        run_rsync(LocalExecutor(), argv)
    assert caught.value.returncode not in (0, 24)


def test_a_failing_rsync_over_ssh_records_no_tree_and_leaves_no_clone(source, zpool, sshd, tmp_path):
    """docs/reliability.md#r43-rsync-exit-codes (S): the push over a real sshd fails (the partial
    directory's place is taken by a file on the target): RsyncFailed with rsync's non-zero, non-24
    status and stderr, no tree under ``snapshots``, no ``current``, no clone or mount left
    behind."""
    directory = tmp_path / "remote dir"
    snap = SnapshotName.of(source.dataset, FIRST)
    guid = source.zfs.get_properties(snap, ["guid"])["guid"]
    (directory / "partial").mkdir(parents=True)
    (directory / "partial" / guid).write_text("a file where rsync needs a directory")
    mounts_before = view_mount_dirs()

    with SSHExecutor("backup", sshd.host_config(), known_hosts_default=tmp_path / "kh") as remote:
        with pytest.raises(RsyncFailed) as caught:
            replicate_snapshot_rsync(source.zfs, snap, Endpoint("backup", None, str(directory)),
                                     sshd.host_config(), remote,
                                     known_hosts_default=tmp_path / "kh")
        assert last_synced(remote, str(directory)) == []

    assert caught.value.returncode not in (0, 24, None)
    # rsync's own error line comes from the remote receiver through the protocol stream and
    # was lost once under load (exit 3, empty stderr): the status's meaning is always said.
    assert f"(rsync: {RSYNC_EXIT_VALUES[caught.value.returncode]})" in str(caught.value)
    assert os.listdir(directory / "snapshots") == []
    assert not os.path.lexists(directory / "current")
    assert view_clones(zpool.name) == []
    assert no_new_view_dirs(mounts_before)
