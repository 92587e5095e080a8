"""Real OpenZFS 2.3 in a QEMU guest for the ``openzfs`` tier: ``openzfs_vm``, ``openzfs_executor``
and ``openzfs_pools``.

The guest comes from the shared zfsvm tool (``../shared/zfsvm/zfsvm`` beside the repository,
``ZBAK_ZFSVM`` to override; see its README): Debian's OpenZFS 2.3.2 kernel module and sshd,
forwarded to ``127.0.0.1:ZBAK_OPENZFS_PORT`` (default 2240, the port ``scripts/openzfs-vm.sh``
uses too, so guests of other zfsvm users on other ports are never touched).

- The image is built before pytest (``scripts/openzfs-vm.sh build``, ~5 min cold, then
  0.02 s), never by a fixture, so a cold build cannot eat a test's timeout. Not built, or
  ``ZBAK_OPENZFS_VM=0``: the tier is ``unavailable`` (skips locally, fails in strict mode).
- One boot per session (11-27 s under TCG). A guest already answering on the port is reused:
  one started by hand (``scripts/openzfs-vm.sh start``) is never stopped; one started by a
  pytest session (marker file ``zbak-openzfs-PORT.started`` in /run/lock) is stopped by the
  last session using it (sessions hold a shared ``flock`` on ``zbak-openzfs-PORT.lock``), so
  a crashed session's guest is cleaned up by the next run instead of leaking ~1 GB of RAM.
- A session lets go of the guest right after the teardown of its last test on it, not at
  the session's end: the suite's xdist worker that runs every guest test first
  (``support.distribution``) goes on with other files for many minutes, while an idle
  emulated guest still costs CPU and ~1 GB of RAM
  (docs/decisions.md#the-guest-stops-after-its-last-test).
- The guest runs one emulated CPU (``ZFSVM_SMP=1`` unless set) and without address space
  layout randomisation (``kernel.randomize_va_space=0``, set at every session's start): the
  same guest commands then cost about half the host CPU or less
  (docs/decisions.md#the-guest-runs-one-cpu-without-aslr).
- Host keys are checked strictly. zfsvm's own ssh_config switches checking off, so the
  fixture reads the guest's host keys from the image it boots (``$ZFSVM_CACHE/initrd.cpio``,
  ``etc/ssh/ssh_host_*_key.pub``, made once by openssh-server's postinst at build time) into a
  known_hosts file, and proves it with a strict OpenSSH login before any test runs.
- Each test using ``openzfs_pools`` gets two new pools on sparse 256 MiB files in the guest's
  tmpfs (``zpool create`` 0.3-1 s each; the 4 virtio disks stay free), destroyed afterwards.

Tests using these fixtures get the ``openzfs`` marker automatically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.common import unavailable

OPENZFS_FIXTURES = frozenset({"openzfs_vm", "openzfs_executor", "openzfs_pools"})
REPO = Path(__file__).resolve().parents[2]
ZFSVM = Path(os.environ.get("ZBAK_ZFSVM") or REPO.parent / "shared" / "zfsvm" / "zfsvm")
CACHE = Path(os.environ.get("ZFSVM_CACHE") or "/var/cache/zfsvm")
PORT = int(os.environ.get("ZBAK_OPENZFS_PORT") or 2240)
ENABLED = os.environ.get("ZBAK_OPENZFS_VM", "") != "0"
BOOT_TIMEOUT = 300
"""Seconds ``zfsvm start`` may take (11-27 s measured; slower on a busy 2-core machine)."""
GUEST_SMP = "1"
"""Emulated CPUs of a guest a session boots (``ZFSVM_SMP``, zfsvm's default 2): one costs
less host CPU for the same commands (docs/decisions.md#the-guest-runs-one-cpu-without-aslr)."""
TUNE = "sysctl -q -w kernel.randomize_va_space=0"
"""Run in the guest at every session's start: exec'd processes at the same addresses each
time cost the emulator less (docs/decisions.md#the-guest-runs-one-cpu-without-aslr)."""
COMMAND_TIMEOUT = 120
"""Seconds one command in the guest may take (pass it to ``Zfs(..., timeout=)``)."""
POOL_SIZE = "256M"
POOL_DIR = "/var/tmp"
"""Guest directory (tmpfs root, ~490 MB free) holding the pools' sparse backing files."""
LOCK_DIR = Path("/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir())
MARKER = LOCK_DIR / f"zbak-openzfs-{PORT}.started"
"""Present while the guest on PORT was started by a pytest session (scripts/openzfs-vm.sh
removes it on start/stop: a guest started by hand belongs to the user)."""
HOST_KEY_TYPES = ("ed25519", "ecdsa", "rsa")
_counter = itertools.count(1)
_summary: list[str] = []
_pending: set[str] = set()
"""Node ids of this session's tests on the guest that have not been torn down yet."""
_release = contextlib.ExitStack()
"""Closes the session's executor and lets go of the guest (``_Guest.finish``); run once the
last of ``_pending`` is torn down. The fixtures' own finalizers then find nothing left."""


@dataclasses.dataclass(frozen=True)
class OpenZfsGuest:
    """The running guest and the client-side files that reach it with strict host keys.

    Attributes:
        host: ``127.0.0.1``.
        port: the forwarded sshd port (``ZBAK_OPENZFS_PORT``, default 2240).
        user: ``root`` (key login only).
        identity_file: zfsvm's ed25519 user key (in ``$ZFSVM_CACHE/ssh``).
        known_hosts: ``[127.0.0.1]:PORT`` lines with the guest's host keys, from its image.
        ssh_config: an OpenSSH client config for ``ssh -F FILE zfsvm CMD`` (strict host key
            checking against ``known_hosts``; no multiplexing).
        zfs_version: the loaded module's version (``/sys/module/zfs/version``), e.g.
            ``2.3.2-2~bpo12+2``.
        boot_seconds: how long this session's ``zfsvm start`` took; None for a reused guest.
    """

    host: str
    port: int
    user: str
    identity_file: Path
    known_hosts: Path
    ssh_config: Path
    zfs_version: str
    boot_seconds: float | None

    def host_config(self, **overrides: object):
        """Return a ``zrepl_py.config.hosts.HostConfig`` for the guest, usable by
        ``SSHExecutor`` and ``proc.openssh.ssh_argv``.

        Args:
            overrides: HostConfig fields to replace (e.g. ``known_hosts=...``).
        """
        from zrepl_py.config.hosts import HostConfig

        fields: dict[str, object] = {
            "address": self.host,
            "port": self.port,
            "user": self.user,
            "identity_file": self.identity_file,
            "known_hosts": self.known_hosts,
            "connect_timeout": 30,  # an ssh handshake costs ~1 s of emulated CPU
        }
        fields.update(overrides)
        return HostConfig(**fields)

    def ssh_prefix(self) -> list[str]:
        """Return ``proc.openssh.ssh_argv`` for the guest; append one ``remote_command``."""
        from zrepl_py.proc.openssh import ssh_argv

        return ssh_argv(self.host_config(), known_hosts_default=self.known_hosts)


@dataclasses.dataclass(frozen=True)
class OpenZfsPools:
    """Two empty pools made for one test in the guest (feature flags, OpenZFS 2.3 defaults).

    Attributes:
        source: the first pool's name (``zsrc<pid>n<k>``), mounted at ``/<name>``.
        target: the second pool's name (``zdst<pid>n<k>``).
    """

    source: str
    target: str


def read_cpio_members(image: Path, wanted: set[str]) -> dict[str, bytes]:
    """Return the contents of the ``wanted`` members of an uncompressed newc cpio archive.

    newc is the initramfs format (kernel ``Documentation/driver-api/early-userspace/
    buffer-format.rst``): a 110-byte ASCII header (magic ``070701``/``070702``, then 13
    8-digit hex fields; filesize at bytes 54-62, namesize at 94-102), the NUL-terminated
    name, padding to 4 bytes, the data, padding to 4 bytes; ``TRAILER!!!`` ends it.

    Args:
        image: the archive file.
        wanted: member names without a leading ``./`` (``etc/ssh/ssh_host_ed25519_key.pub``).

    Returns:
        name -> bytes for the members found (missing names are left out).

    Raises:
        ValueError: a header without the newc magic (not an uncompressed newc archive).
    """
    found: dict[str, bytes] = {}
    with open(image, "rb") as handle:
        while len(found) < len(wanted):
            header = handle.read(110)
            if len(header) < 110:
                break
            if header[:6] not in (b"070701", b"070702"):
                raise ValueError(f"{image}: no newc cpio header at byte {handle.tell() - 110}")
            size, namesize = int(header[54:62], 16), int(header[94:102], 16)
            name = handle.read(namesize).rstrip(b"\x00").decode("utf-8", "surrogateescape")
            handle.seek(-handle.tell() % 4, os.SEEK_CUR)
            if name == "TRAILER!!!":
                break
            name = name.removeprefix("./")
            if name in wanted:
                found[name] = handle.read(size)
                handle.seek(-handle.tell() % 4, os.SEEK_CUR)
            else:
                handle.seek(size + -size % 4, os.SEEK_CUR)
    return found


def _zfsvm(command: str, log: Path, timeout: float) -> tuple[int, str]:
    """Run ``zfsvm COMMAND`` for PORT; return (exit status, its stdout + stderr).

    Output goes to a file, not a pipe: a daemonized QEMU or an ssh ControlPersist master
    holding the pipe would keep ``communicate`` waiting.
    """
    env = {key: value for key, value in os.environ.items() if key != "ZFSVM_RUNDIR"}
    env["ZFSVM_PORT"] = str(PORT)
    env.setdefault("ZFSVM_BOOT_TIMEOUT", str(BOOT_TIMEOUT))
    env.setdefault("ZFSVM_SMP", GUEST_SMP)
    with open(log, "w+") as output:
        try:
            status = subprocess.run([str(ZFSVM), command], stdin=subprocess.DEVNULL,
                                    stdout=output, stderr=output, env=env,
                                    timeout=timeout).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            status = -1
        output.seek(0)
        return status, output.read()


def _parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line.startswith("ZFSVM_"))


class _Guest:
    """Start (or adopt) the guest on PORT, write the client files, stop it when last out."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.lock_fd: int | None = None

    def _lock(self, mode: int) -> None:
        """Take the port's flock in ``mode`` (LOCK_SH or LOCK_EX), waiting while another
        session boots or stops the guest."""
        if self.lock_fd is None:
            path = LOCK_DIR / f"zbak-openzfs-{PORT}.lock"
            self.lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + BOOT_TIMEOUT + 60
        while True:
            try:
                fcntl.flock(self.lock_fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    unavailable("openzfs", f"{LOCK_DIR}/zbak-openzfs-{PORT}.lock held for "
                                f"{BOOT_TIMEOUT + 60} s by another session")  # fmt: skip
                time.sleep(0.5)

    def start(self) -> OpenZfsGuest:
        """Reuse the running guest or boot it; hold a shared lock on it until ``finish``.

        A shared lock is held only while the guest runs, so a second session joins a running
        guest at once; booting takes the lock exclusively and checks again (another session
        may have booted it meanwhile).
        """
        boot = None
        self._lock(fcntl.LOCK_SH)
        if _zfsvm("status", self.workdir / "status.log", 60)[0] != 0:
            # unlock first: two sessions both upgrading shared to exclusive would wait forever
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
            self._lock(fcntl.LOCK_EX)
            if _zfsvm("status", self.workdir / "status.log", 60)[0] != 0:
                began = time.monotonic()
                status, output = _zfsvm("start", self.workdir / "start.log", BOOT_TIMEOUT + 60)
                if status != 0:
                    unavailable("openzfs", f"zfsvm start on port {PORT} failed (exit "
                                f"{status}): {output[-3000:]}")  # fmt: skip
                boot = time.monotonic() - began
                MARKER.write_text(f"{os.getpid()}\n")
            self._lock(fcntl.LOCK_SH)
        _, output = _zfsvm("env", self.workdir / "env.log", 60)
        return self._client_files(_parse_env(output), boot)

    def _client_files(self, env: dict[str, str], boot: float | None) -> OpenZfsGuest:
        names = {f"etc/ssh/ssh_host_{kind}_key.pub" for kind in HOST_KEY_TYPES}
        image = CACHE / "initrd.cpio"  # written by `zfsvm start` from initrd.img
        try:
            keys = read_cpio_members(image, names)
        except (OSError, ValueError) as exc:
            unavailable("openzfs", f"cannot read the guest's host keys from {image}: {exc}")
        if not keys:
            unavailable("openzfs", f"no etc/ssh/ssh_host_*_key.pub in {image}")
        host = env.get("ZFSVM_SSH_HOST", "127.0.0.1")
        port = int(env.get("ZFSVM_SSH_PORT", PORT))
        user = env.get("ZFSVM_SSH_USER", "root")
        known_hosts = self.workdir / "known_hosts"
        lines = []
        for blob in keys.values():
            keytype, key = blob.decode("ascii").split()[:2]
            lines.append(f"[{host}]:{port} {keytype} {key}\n")
        known_hosts.write_text("".join(lines))
        identity = Path(env.get("ZFSVM_SSH_KEY", CACHE / "ssh" / "id_ed25519"))
        ssh_config = self.workdir / "ssh_config"
        ssh_config.write_text(
            "Host zfsvm\n"
            f"    HostName {host}\n    Port {port}\n    User {user}\n"
            f'    IdentityFile "{identity}"\n    IdentitiesOnly yes\n'
            f'    StrictHostKeyChecking yes\n    UserKnownHostsFile "{known_hosts}"\n'
            "    GlobalKnownHostsFile /dev/null\n    UpdateHostKeys no\n"
            "    BatchMode yes\n    ConnectTimeout 30\n    LogLevel ERROR\n"
        )
        probe = subprocess.run(
            ["ssh", "-F", str(ssh_config), "zfsvm", f"{TUNE} && cat /sys/module/zfs/version"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
        )  # fmt: skip
        if probe.returncode != 0:
            unavailable("openzfs", f"strict ssh login to the guest on port {port} failed "
                        f"(host keys from {image}): {probe.stderr.strip()[-2000:]}")  # fmt: skip
        return OpenZfsGuest(
            host=host,
            port=port,
            user=user,
            identity_file=identity,
            known_hosts=known_hosts,
            ssh_config=ssh_config,
            zfs_version=probe.stdout.strip(),
            boot_seconds=boot,
        )

    def finish(self) -> None:
        """Stop the guest if a pytest session started it and no other session still uses it.

        Raises:
            RuntimeError: ``zfsvm stop`` failed.
        """
        if self.lock_fd is None:
            return
        try:
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another session still uses it; the last one out stops the guest
            if not MARKER.exists():
                return  # started by hand (scripts/openzfs-vm.sh start): the user's to stop
            began = time.monotonic()
            status, output = _zfsvm("stop", self.workdir / "stop.log", 120)
            if status != 0:
                raise RuntimeError(f"zfsvm stop on port {PORT} failed: {output[-2000:]}")
            MARKER.unlink(missing_ok=True)
            _summary.append(f"stopped in {time.monotonic() - began:.1f} s")
        finally:
            os.close(self.lock_fd)
            self.lock_fd = None


@pytest.fixture(scope="session")
def openzfs_vm(tmp_path_factory) -> Iterator[OpenZfsGuest]:
    """The session's OpenZFS 2.3 guest (see OpenZfsGuest and the module doc); booted on first
    use, stopped at the end of the session if this session booted it."""
    if not ENABLED:
        unavailable("openzfs", "switched off with ZBAK_OPENZFS_VM=0")
    if not os.access(ZFSVM, os.X_OK):
        unavailable("openzfs", f"{ZFSVM} not found (shared/ beside the repo, or ZBAK_ZFSVM)")
    if not ((CACHE / "vmlinuz").is_file() and (CACHE / "initrd.img").is_file()):
        unavailable("openzfs", f"no guest image in {CACHE}: run scripts/openzfs-vm.sh build "
                    "first (about 5 minutes once, cached)")  # fmt: skip
    guest = _Guest(tmp_path_factory.mktemp("openzfs"))
    try:
        info = guest.start()
        how = f"booted in {info.boot_seconds:.1f} s" if info.boot_seconds else "reused"
        _summary.append(f"OpenZFS {info.zfs_version} guest on {info.host}:{info.port}: {how}")
        _release.callback(guest.finish)
        yield info
    finally:
        guest.finish()


@pytest.fixture(scope="session")
def openzfs_executor(openzfs_vm):
    """A session-wide ``SSHExecutor`` (paramiko, strict host keys) for the guest, label
    ``zfsvm``."""
    from zrepl_py.proc.ssh import SSHExecutor

    config = openzfs_vm.host_config()
    with SSHExecutor("zfsvm", config, known_hosts_default=openzfs_vm.known_hosts) as executor:
        _release.callback(executor.close)  # before the guest goes (last in, first out)
        yield executor


@pytest.fixture
def openzfs_pools(openzfs_executor) -> Iterator[OpenZfsPools]:
    """Two fresh pools in the guest for this test (see OpenZfsPools), on sparse files in
    ``POOL_DIR``; destroyed with their files afterwards.

    Raises (at teardown):
        RuntimeError: a pool could not be destroyed.
    """
    number = next(_counter)
    names = (f"zsrc{os.getpid()}n{number}", f"zdst{os.getpid()}n{number}")
    images = [f"{POOL_DIR}/{name}.img" for name in names]
    run = openzfs_executor.run
    made: list[str] = []
    try:
        run(["truncate", "-s", POOL_SIZE, *images], timeout=COMMAND_TIMEOUT)
        for name, image in zip(names, images, strict=True):
            made.append(name)
            run(["zpool", "create", "-o", "ashift=12", name, image], timeout=COMMAND_TIMEOUT)
        yield OpenZfsPools(source=names[0], target=names[1])
    finally:
        problems = []
        for name in reversed(made):
            done = run(["zpool", "destroy", "-f", name], check=False, timeout=COMMAND_TIMEOUT)
            if done.returncode != 0 and "no such pool" not in done.error_text:
                problems.append(f"zpool destroy {name}: {done.error_text}")
        run(["rm", "-f", *images], check=False, timeout=COMMAND_TIMEOUT)
        if problems:
            raise RuntimeError("; ".join(problems))


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test that uses an OpenZFS guest fixture with ``openzfs``."""
    for item in items:
        if OPENZFS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.openzfs)


def pytest_collection_finish(session) -> None:
    """Note the tests of this session that use the guest (after deselection)."""
    _pending.update(item.nodeid for item in session.items
                    if OPENZFS_FIXTURES & set(getattr(item, "fixturenames", ())))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem) -> None:
    """After the teardown of this session's last test on the guest (its pools destroyed),
    close the executor and let go of the guest, stopping it when this session started it and
    no other uses it. A session that runs only some of the guest's tests (xdist ``--dist
    load``) never gets here and lets go at its end, as before."""
    if item.nodeid in _pending:
        _pending.discard(item.nodeid)
        if not _pending:
            _release.close()


def pytest_terminal_summary(terminalreporter) -> None:
    """Report the guest's version, boot and stop times (the tier's cost in CI logs)."""
    if _summary:
        terminalreporter.write_line("openzfs: " + "; ".join(_summary))
