"""zfs-fuse pools on sparse files: the ``zfs_daemon``, ``make_pool`` and ``zpool`` fixtures.

Why each test session gets its own zfs-fuse: zfs-fuse 0.7 wedges when several processes
create, use and destroy pools at once. Seen on the test bed: two test sessions sharing the
daemon left every FUSE request unanswered (``zfs create``, ``umount`` stuck in the kernel,
~1000 daemon threads blocked on one lock); reproduced with a private daemon and three
parallel create/``zfs create``/snapshot/destroy loops (wedged after ~20 pools in most
runs), never with one loop (40 pools, thread count flat). Helpers and CI run sessions in
parallel, so by default (``ZBAK_TEST_ZFS=private``) the session:

1. enters its own mount namespace at start-up (``pytest_configure``, before any fixture
   or server starts, so sshd and CLI subprocesses inherit it), makes its mounts private
   and puts tmpfs over ``/var/run/zfs`` (the daemon socket), ``/var/lib/zfs``
   (``zpool.cache``: the private daemon must not import other sessions' pools) and
   ``/var/lock/zfs``;
2. starts a private ``zfs-fuse`` there when a test first needs it, and kills it (by pid)
   at the end. The ``zfs``/``zpool`` commands reach it through the socket path.

``ZBAK_TEST_ZFS=shared`` (or no root / no unshare) uses the machine's daemon instead,
starting one if ``pgrep -x zfs-fuse`` finds none (``scripts/setup-host.sh`` does the same)
and leaving it running; then pool creation and destruction take a machine-wide lock.

Every pool lives on a sparse file under the test's tmp_path, has a unique name and its
mountpoint under tmp_path, and is destroyed at teardown. Commands have timeouts and a new
pool's mount must answer ``stat -f``: a wedged daemon makes the test fail (strict mode) or
skip with a message saying so, instead of hanging until pytest-timeout. Tests using these
fixtures get the ``zfs`` marker automatically.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from support.common import need_binary, unavailable

ZFS_FIXTURES = frozenset({"zfs_daemon", "make_pool", "zpool"})
COMMAND_TIMEOUT = 60
"""Seconds a zfs/zpool command of a test may take (pass it to ``Zfs(..., timeout=)``)."""
MOUNT_ANSWER_TIMEOUT = 15
LOCK_FILE = Path("/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir()) / (
    "zbak-test-zfs-fuse.lock"
)
PRIVATE_DIRS = ("/var/run/zfs", "/var/lib/zfs", "/var/lock/zfs")
"""Where zfs-fuse keeps its socket, pool cache and lock (strings in /usr/sbin/zfs-fuse)."""
_CLONE_NEWNS = 0x00020000  # <sched.h>; os.unshare only exists from Python 3.12
_counter = itertools.count(1)
_private = {"namespace": False, "why_not": "not tried"}


@dataclasses.dataclass(frozen=True)
class PoolHandle:
    """A test pool.

    Attributes:
        name: the pool name (``zt<pid>x<n>``), also its root dataset.
        image: the sparse file backing it.
        mountpoint: where its root dataset is mounted.
    """

    name: str
    image: Path
    mountpoint: Path


def _run(argv: list[str], timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        unavailable("zfs", f"`{' '.join(argv)}` took over {timeout} s: zfs-fuse looks wedged")
        raise  # unavailable() always raises; this keeps type checkers content


def _enter_private_namespace() -> str | None:
    """Unshare the mount namespace and hide the shared daemon's files; None on success,
    else why not (then nothing was changed that matters: the session uses the shared
    daemon)."""
    if os.geteuid() != 0:
        return "not root"
    if not shutil.which("zfs-fuse") and not os.access("/usr/sbin/zfs-fuse", os.X_OK):
        return "zfs-fuse not installed"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        return f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}"
    # Without this, the tmpfs mounts below would propagate to the machine's namespace.
    steps = [["mount", "--make-rprivate", "/"]]
    for path in PRIVATE_DIRS:
        os.makedirs(path, exist_ok=True)
        steps.append(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", path])
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    # The namespace starts with copies of the shared daemon's mounts; zfs-fuse reads the
    # mount table (a pool named like one of them "is busy") and a stat on one would hang
    # if that daemon is wedged, so detach them here (lazily: it asks nothing of FUSE).
    for path in _shared_zfs_mounts():
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=10, check=False)
    return None


def _shared_zfs_mounts() -> list[str]:
    """Mountpoints of zfs-fuse filesystems and its kstat mount, deepest first."""
    paths = []
    with open("/proc/self/mounts") as table:
        for line in table:
            fields = line.split()
            if len(fields) >= 3 and (fields[2] == "fuse.zfs" or fields[1] == "/zfs-kstat"):
                # /proc/mounts escapes space, tab, newline and backslash as octal.
                paths.append(fields[1].encode().decode("unicode_escape"))
    return sorted(paths, key=len, reverse=True)


def pytest_configure(config):
    """Enter a private mount namespace for this session (see the module doc)."""
    if os.environ.get("ZBAK_TEST_ZFS", "private") != "private":
        _private["why_not"] = "ZBAK_TEST_ZFS is not 'private'"
        return
    try:
        why_not = _enter_private_namespace()
    except RuntimeError as exc:  # stopped at the first failed mount: nothing leaked out
        why_not = str(exc)
    _private["namespace"] = why_not is None
    _private["why_not"] = why_not or ""


def pytest_collection_modifyitems(config, items):
    """Mark every test that uses a zfs fixture with ``zfs`` (CI strictness, ``-m zfs``)."""
    for item in items:
        if ZFS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.zfs)


def _wait_for_daemon(zpool: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        answer = _run([zpool, "list"])
        if answer.returncode == 0:
            return
        if time.monotonic() > deadline:
            unavailable("zfs", f"zfs-fuse does not answer 'zpool list': {answer.stderr.strip()}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def zfs_daemon(tmp_path_factory):
    """A zfs-fuse daemon answering ``zpool list``: this session's own one (default), or
    the machine's (``ZBAK_TEST_ZFS=shared``, no root, or no unshare); yields None."""
    zpool = need_binary("zfs", "zpool")
    need_binary("zfs", "zfs")
    daemon = need_binary("zfs", "zfs-fuse")
    if os.geteuid() != 0:
        unavailable("zfs", "zfs-fuse needs root")
    if not _private["namespace"]:
        if _run(["pgrep", "-x", "zfs-fuse"]).returncode != 0:
            started = _run([daemon])
            if started.returncode != 0:
                unavailable("zfs", f"zfs-fuse did not start: {started.stderr.strip()}")
        _wait_for_daemon(zpool)
        yield None
        return
    pidfile = tmp_path_factory.mktemp("zfs-fuse") / "zfs-fuse.pid"
    started = _run([daemon, "--no-kstat-mount", "--pidfile", str(pidfile)])
    if started.returncode != 0:
        unavailable("zfs", f"private zfs-fuse did not start: {started.stderr.strip()}")
    try:
        _wait_for_daemon(zpool)
        yield None
    finally:
        _stop_private_daemon(pidfile)


def _stop_private_daemon(pidfile: Path) -> None:
    """SIGTERM the session's own daemon (by its pid file), SIGKILL it after 10 s."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    for sig, wait in ((15, 10.0), (9, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


@contextlib.contextmanager
def pool_lock():
    """Serialize test pool creation and destruction with other sessions sharing the
    machine's daemon (a no-op with a private daemon)."""
    if _private["namespace"]:
        yield
        return
    with open(LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _destroy_pool(name: str) -> None:
    """``zpool destroy -f``, retried for a few seconds while the pool answers "busy"."""
    deadline = time.monotonic() + 10
    while True:
        done = _run(["zpool", "destroy", "-f", name])
        if done.returncode == 0 or "no such pool" in done.stderr:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"cannot destroy test pool {name}: {done.stderr.strip()}")
        time.sleep(0.3)


@pytest.fixture
def make_pool(zfs_daemon, tmp_path):
    """Factory ``make_pool(size="512M") -> PoolHandle``: a fresh pool on a sparse file.

    ``size`` is a ``truncate -s`` size (zfs-fuse needs 64M or more). Pools are destroyed
    and their images deleted at teardown, in reverse order of creation.
    """
    created: list[PoolHandle] = []

    def make(size: str = "512M") -> PoolHandle:
        n = next(_counter)
        name = f"zt{os.getpid()}x{n}"
        image = tmp_path / f"{name}.img"
        mountpoint = tmp_path / f"{name}-mnt"
        done = _run(["truncate", "-s", size, str(image)])
        if done.returncode != 0:
            raise RuntimeError(f"truncate {image}: {done.stderr.strip()}")
        with pool_lock():
            done = _run(["zpool", "create", "-m", str(mountpoint), name, str(image)])
        if done.returncode != 0:
            image.unlink(missing_ok=True)
            raise RuntimeError(f"zpool create {name}: {done.stderr.strip()}")
        handle = PoolHandle(name=name, image=image, mountpoint=mountpoint)
        created.append(handle)
        _run(["stat", "-f", str(mountpoint)], timeout=MOUNT_ANSWER_TIMEOUT)
        if not os.path.ismount(mountpoint):
            unavailable("zfs", f"new pool {name} is not mounted at {mountpoint}: zfs-fuse "
                               "looks wedged")
        return handle

    yield make
    errors = []
    for handle in reversed(created):
        try:
            with pool_lock():
                _destroy_pool(handle.name)
            handle.image.unlink(missing_ok=True)
        except (RuntimeError, pytest.fail.Exception, pytest.skip.Exception) as exc:
            errors.append(str(exc))
    if errors:
        raise RuntimeError("; ".join(errors))


@pytest.fixture
def zpool(make_pool) -> PoolHandle:
    """One fresh 512 MB pool (see ``make_pool``)."""
    return make_pool()
