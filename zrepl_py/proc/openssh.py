"""The OpenSSH client argv for the replication data path, and the one argv-to-command join.

The data path pipes process to process (``zfs send | ssh HOST 'zfs receive ...'``,
docs/design.md#replication), so it uses the real ``ssh`` binary; paramiko (``zrepl_py.proc.ssh``)
runs the control commands. Both must trust the same host keys and quote the same way:

- ``ssh_argv`` checks host keys strictly against zbak's own known_hosts file only
  (``GlobalKnownHostsFile=/dev/null``), like SSHExecutor;
- ``remote_command`` is the single place in zbak where an argv becomes a command string for a
  remote shell (docs/style.md#no-shell-strings); SSHExecutor calls it too.

Ciphers: OpenSSH's client offers ChaCha20-Poly1305 first, which is fast everywhere but much
slower than AES-GCM on a CPU with AES instructions (x86 AES-NI, Armv8 crypto extensions).
The data path is bound by encryption as often as by the disks: a 1 GiB ``zfs send | ssh zfs
receive`` over 127.0.0.1 on zfs-fuse took 5.6 s with ChaCha20-Poly1305 and 4.4 s with
aes128-gcm (median of 3, benchmarks/replication.py's test bed, 2 vCPUs with AES-NI). So
``ssh_argv`` puts AES-GCM first when this machine's CPU has AES instructions
(``data_ciphers``) and keeps every other default cipher after it: the server picks the first
cipher of the client's list that it also allows (RFC 4253 section 7.1), so a server that
refuses AES-GCM still connects. ``[hosts.NAME] ciphers`` overrides the choice (a receiving
host without AES instructions decrypts AES-GCM slowly: give it ``["chacha20-poly1305@openssh.com"]``
or ``[]``).

Connection sharing: a handshake costs ~0.24 s (loopback, benchmarks/replication.py), paid by
every ``ssh`` the data path starts, once per dataset and step. With ``control_dir``,
``ssh_argv`` adds OpenSSH multiplexing (ssh_config(5) ``ControlMaster=auto``,
``ControlPath``, ``ControlPersist``): the first invocation leaves a master connection
running for ``CONTROL_PERSIST`` seconds after its last session, and later invocations with
the same settings run as sessions over it (~0.1 s instead of ~0.33 s for ``ssh HOST true``,
measured here). Host keys are checked when the master connects, exactly as without sharing.
Whoever can connect to a master's socket can run commands as the remote user without
authenticating, so:

- sockets live only in a directory that is the caller's alone (``control_dir``: created
  0700, refused if it is a symlink, someone else's, or open to group/others);
- the socket's name is a digest of everything that decides who the connection is and how
  it was checked (address, port, user, identity file, known_hosts file, trust-on-first-use),
  so a config with another key or known_hosts file never rides on this one's connection.

A session over a master is a "mux client": it hands its stdin/stdout/stderr to the master
(ssh(1) ``-S``; mux.c passes the descriptors), so the stream never passes through the ssh
process zbak started and that process's /proc I/O counters (``proc.pipeline.Meter``) stay
near zero. Callers that meter an ssh stage start that one without ``control_dir``.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import os
import shlex
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from zrepl_py.runtime.statedir import ensure_private_dir


class SshHost(Protocol):
    """What zbak's SSH code needs to know of a remote host: ``config.hosts.HostConfig`` is
    one. Taken by shape, so the process layer does not depend on the config package."""

    # Read-only (properties): the config's frozen tables qualify, as any object with the
    # attributes does.
    @property
    def address(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def user(self) -> str: ...
    @property
    def identity_file(self) -> Path | None: ...
    @property
    def known_hosts(self) -> Path | None: ...
    @property
    def trust_on_first_use(self) -> bool: ...
    @property
    def sudo(self) -> bool: ...
    @property
    def connect_timeout(self) -> dt.timedelta: ...
    @property
    def ciphers(self) -> list[str] | None: ...


SUDO_PREFIX = ("sudo", "-n")
"""Prepended when ``SshHost.sudo`` is set: non-interactive, fails instead of prompting."""

CONTROL_PERSIST = 60
"""Seconds a shared master connection stays open after its last session ends."""
SOCKET_PATH_MAX = 90
"""Longest control socket path used, in bytes: ssh first binds ``PATH.XXXXXXXXXXXXXXXX``
(17 more bytes, mux.c ``muxserver_listen``) before renaming it to PATH, and a unix socket
path must fit ``sun_path`` with its terminating NUL (108 bytes on Linux, unix(7)): 107 - 17."""
_SOCKET_NAME_LENGTH = 16  # hex digits of the digest naming a socket

AES_GCM_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
                 "chacha20-poly1305@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr")
"""OpenSSH's default client ciphers (ssh_config(5) ``Ciphers``, unchanged since OpenSSH 6.9)
with AES-GCM moved to the head. Spelled out rather than ``^aes128-gcm@...`` (prepend to the
defaults), which OpenSSH before 8.2 rejects."""


def cpu_has_aes(cpuinfo: str) -> bool:
    """True when ``cpuinfo`` (the text of /proc/cpuinfo) lists AES instructions: the ``aes``
    flag (x86 ``flags``, Armv8 ``Features``; proc(5), arch/*/kernel/cpu*)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features") and "aes" in value.split():
            return True
    return False


@functools.cache
def _local_cpu_has_aes() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            return cpu_has_aes(handle.read())
    except OSError:  # not Linux, or /proc not mounted: keep ssh's own order
        return False


def data_ciphers(host: SshHost) -> list[str]:
    """The ciphers ``ssh_argv`` asks for (empty: ssh's own order); see the module doc.

    Args:
        host: ``host.ciphers`` when set, else ``AES_GCM_FIRST`` when this machine's CPU has
            AES instructions (/proc/cpuinfo), else none.
    """
    if host.ciphers is not None:
        return list(host.ciphers)
    return list(AES_GCM_FIRST) if _local_cpu_has_aes() else []


def remote_argv(argv: Sequence[str], *, sudo: bool) -> list[str]:
    """Return the argv as it runs on the remote host: ``argv``, behind ``sudo -n`` if ``sudo``.

    Args:
        argv: the command, one str per argument; must not be empty.
        sudo: prefix ``sudo -n`` (``SshHost.sudo``).

    Raises:
        ValueError: ``argv`` is empty or an element holds a NUL byte (no argv can carry one).
    """
    items = [str(arg) for arg in argv]
    if not items:
        raise ValueError("empty argv")
    if any("\x00" in arg for arg in items):
        raise ValueError("argv element contains a NUL byte")
    return list(SUDO_PREFIX) + items if sudo else items


def remote_command(argv: Sequence[str], *, sudo: bool) -> str:
    """Quote ``argv`` into one POSIX shell command string (``shlex.join``) for ssh.

    Every element arrives at the remote process byte-identical, whatever it holds (spaces,
    quotes, ``$(...)``, newlines, a leading ``-``), because each is single-quoted when it is
    not plain ``[A-Za-z0-9@%+=:,./_-]``. Non-UTF-8 bytes carried as surrogate escapes survive
    when the result is encoded with ``command_bytes``.

    Args:
        argv: the command, one str per argument.
        sudo: prefix ``sudo -n`` (``SshHost.sudo``).

    Raises:
        ValueError: see ``remote_argv``.
    """
    return shlex.join(remote_argv(argv, sudo=sudo))


def remote_pipeline(argvs: Sequence[Sequence[str]], *, sudo: bool) -> str:
    """Quote several argvs into one remote shell pipeline: ``CMD1 | CMD2 | ...``.

    For the remote end of the data path, e.g. ``[["zstd", "-d"], ["zfs", "receive", T]]``
    gives ``zstd -d | zfs receive T``. Each command is quoted by ``remote_command`` (the one
    join), so every argument arrives byte-identical; ``|`` means the same in every POSIX
    shell and in csh and fish, whatever the remote login shell. The remote exit status is the
    last command's (no ``pipefail``): an upstream command failing truncates the stream, which
    the last command (``zfs receive``) then rejects itself.

    Args:
        argvs: one or more commands, one str per argument each.
        sudo: prefix every command with ``sudo -n`` (``SshHost.sudo``).

    Raises:
        ValueError: ``argvs`` is empty, or see ``remote_argv``.
    """
    if not argvs:
        raise ValueError("empty pipeline")
    return " | ".join(remote_command(argv, sudo=sudo) for argv in argvs)


def command_bytes(command: str) -> bytes:
    """Encode a command string for the wire (UTF-8, surrogate escapes back to raw bytes)."""
    return command.encode("utf-8", "surrogateescape")


def _escape_tokens(path: Path) -> str:
    # ssh expands %-tokens in IdentityFile and UserKnownHostsFile (ssh_config(5) TOKENS).
    return str(path).replace("%", "%%")


def _config_path(path: Path) -> str:
    # An ``-o`` value is split on whitespace unless double-quoted (readconf.c argv_split).
    escaped = _escape_tokens(path).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def known_hosts_path(host: SshHost, known_hosts_default: Path) -> Path:
    """Return the known_hosts file for ``host``: its own, else ``known_hosts_default``."""
    return Path(host.known_hosts) if host.known_hosts is not None else Path(known_hosts_default)


def _private_dir(path: Path) -> bool:
    """Create ``path`` 0700 if missing; True when it is a real directory of ours, 0700-ish."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return False
    if info.st_mode & 0o077:
        try:
            os.chmod(path, 0o700)  # ours, but widened (umask, copy): narrow it again
        except OSError:
            return False
    return True


def control_dir(state_dir: Path) -> Path | None:
    """Return a private directory for control sockets, or None when there is none to trust.

    ``<state_dir>/ssh`` when its sockets' paths stay under ``SOCKET_PATH_MAX`` bytes, else
    ``<tmp>/zbak-ssh-<euid>`` (``tempfile.gettempdir()``, usually /tmp). Either is created
    0700; one that is a symlink, belongs to another user or cannot be made 0700 is not used
    (None: connect without sharing). The state directory itself is made 0700 as well.

    Args:
        state_dir: zbak's state directory (``Config.state_dir``).
    """
    candidates = [Path(state_dir) / "ssh",
                  Path(tempfile.gettempdir()) / f"zbak-ssh-{os.geteuid()}"]  # fmt: skip
    for candidate in candidates:
        if len(os.fsencode(str(candidate))) + 1 + _SOCKET_NAME_LENGTH > SOCKET_PATH_MAX:
            continue
        if candidate.parent == Path(state_dir) and not _private_state_dir(Path(state_dir)):
            continue
        if _private_dir(candidate):
            return candidate
    return None


def _private_state_dir(state_dir: Path) -> bool:
    try:
        ensure_private_dir(state_dir)
    except OSError:
        return False
    return True


def control_path(directory: Path, host: SshHost, known_hosts: Path) -> Path:
    """Return the control socket for ``host`` in ``directory`` (see the module doc).

    The name is 16 hex digits of SHA-256 over address, port, user, identity file,
    known_hosts file and trust-on-first-use, so only invocations that would connect and
    check the host key identically share a connection.
    """
    identity = json.dumps([host.address, host.port, host.user,
                           str(host.identity_file) if host.identity_file else None,
                           str(Path(known_hosts).absolute()), host.trust_on_first_use])  # fmt: skip
    name = hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()
    return Path(directory) / name[:_SOCKET_NAME_LENGTH]


def ssh_argv(
    host: SshHost,
    *,
    known_hosts_default: Path,
    batch: bool = True,
    control_dir: Path | None = None,
) -> list[str]:
    """Build the OpenSSH client argv prefix that reaches ``host``; append one ``remote_command``.

    The result ends with ``-- ADDRESS`` so nothing after it (and no odd address) is read as an
    ssh option. Host keys are checked strictly against one file: ``host.known_hosts`` or
    ``known_hosts_default``; with ``host.trust_on_first_use`` an unknown key is recorded there
    (``accept-new``), a changed one is always refused. Ciphers: ``data_ciphers``.

    Args:
        host: the ``[hosts.NAME]`` config.
        known_hosts_default: known_hosts used when ``host.known_hosts`` is None
            (``<state_dir>/known_hosts``).
        batch: add ``BatchMode=yes`` (never prompt for a password or passphrase).
        control_dir: share one connection per host through a socket in this directory
            (from ``control_dir(state_dir)``; see the module doc), or None for a connection
            of its own. The process then is a mux client whose I/O counters do not see the
            stream: do not meter it.

    Returns:
        e.g. ``["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", ...,
        "-p", "22", "-l", "root", "--", "backup.example.org"]``.
    """
    known_hosts = known_hosts_path(host, known_hosts_default)
    timeout = max(1, int(host.connect_timeout.total_seconds()))
    argv = ["ssh"]
    if batch:
        argv += ["-o", "BatchMode=yes"]
    argv += [
        "-o", f"StrictHostKeyChecking={'accept-new' if host.trust_on_first_use else 'yes'}",
        "-o", f"UserKnownHostsFile={_config_path(known_hosts)}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "UpdateHostKeys=no",
        "-o", f"ConnectTimeout={timeout}",
    ]  # fmt: skip
    ciphers = data_ciphers(host)
    if ciphers:
        argv += ["-o", f"Ciphers={','.join(ciphers)}"]
    if host.identity_file is not None:
        argv += ["-o", "IdentitiesOnly=yes", "-i", _escape_tokens(host.identity_file)]
    if control_dir is not None:
        socket = control_path(control_dir, host, known_hosts)
        argv += [
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={_config_path(socket)}",
            "-o", f"ControlPersist={CONTROL_PERSIST}",
        ]  # fmt: skip
    argv += ["-p", str(host.port), "-l", host.user, "--", host.address]
    return argv


def ssh_argv_without_address(
    host: SshHost, *, known_hosts_default: Path, batch: bool = True,
    control_dir: Path | None = None,
) -> list[str]:
    """Return ``ssh_argv`` without its final ADDRESS, so it ends with ``--``.

    For tools that append the destination themselves: ``rsync -e CMD ADDRESS:PATH`` runs
    ``CMD ADDRESS rsync --server ...`` (rsync main.c ``do_cmd``: it adds ``-l USER`` only for
    ``USER@HOST:`` specs, which zbak never writes, since ``-l`` is in the options already), so
    the address still lands after ``--`` and is never read as an ssh option. Join it into
    rsync's ``-e`` string with ``remote_command(..., sudo=False)``: rsync splits that string
    on spaces and honours single and double quotes, so ``shlex.join``'s quoting survives.

    Args and host-key rules: see ``ssh_argv``.
    """
    argv = ssh_argv(host, known_hosts_default=known_hosts_default, batch=batch,
                    control_dir=control_dir)
    if argv[-2:] != ["--", host.address]:  # pragma: no cover - ssh_argv's documented shape
        raise AssertionError(f"ssh_argv no longer ends with '-- ADDRESS': {argv[-2:]}")
    return argv[:-1]
