"""A real OpenSSH sshd on 127.0.0.1, one per test session, plus a factory for extra servers.

Recipe from docs/testbed.md#openssh-sshd-on-loopback: ``mkdir -p /run/sshd``, an ed25519 host key
and user key made with ``ssh-keygen -t ed25519 -N ''``, a config listening on 127.0.0.1 and a free
port, root login by key only, and ``/usr/sbin/sshd -D -e -f CONFIG`` (absolute path: sshd
re-executes itself). Tests that use ``sshd`` or ``sshd_factory`` get the ``ssh`` marker
automatically.

``sshd_factory(forced_command=CMD)`` writes the user key as ``command="CMD",restrict KEY``
(sshd(8) AUTHORIZED_KEYS FILE FORMAT): every session of that server runs CMD with the
client's request in ``$SSH_ORIGINAL_COMMAND``, as a least-privilege backup host would.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from support.common import free_port, need_binary, unavailable

_START_TIMEOUT = 10.0  # seconds to wait for the SSH banner
_SSH_FIXTURES = {"sshd", "sshd_factory"}


@dataclasses.dataclass(frozen=True)
class SshServer:
    """A running test sshd and the client-side files that reach it.

    Attributes:
        host: the listen address, always ``127.0.0.1``.
        port: the TCP port.
        user: the login user (``root``; key authentication only).
        identity_file: the user's private ed25519 key (mode 0600).
        known_hosts: a known_hosts file with the ``[127.0.0.1]:PORT ssh-ed25519 ...`` line the
            client should trust (for a factory server started with ``known_hosts_from``, the
            *other* server's key: a changed host key as the client sees it).
        host_key_file: the server's private host key; ``host_key_file + ".pub"`` is public.
        config_file: the sshd_config the server runs with.
    """

    host: str
    port: int
    user: str
    identity_file: Path
    known_hosts: Path
    host_key_file: Path
    config_file: Path

    @property
    def host_key_pub(self) -> Path:
        """The server's public host key file."""
        return self.host_key_file.with_name(self.host_key_file.name + ".pub")

    def host_config(self, **overrides: object):
        """Return a ``zrepl_py.config.hosts.HostConfig`` for this server.

        Args:
            overrides: HostConfig fields to replace (e.g. ``known_hosts=...``,
                ``trust_on_first_use=True``).
        """
        from zrepl_py.config.hosts import HostConfig

        fields: dict[str, object] = {
            "address": self.host,
            "port": self.port,
            "user": self.user,
            "identity_file": self.identity_file,
            "known_hosts": self.known_hosts,
        }
        fields.update(overrides)
        return HostConfig(**fields)


def joined_setenv(lines: Sequence[str]) -> list[str]:
    """sshd_config ``lines`` with every ``SetEnv`` line's variables joined into the first
    one's place: sshd reads only its first SetEnv line (sshd_config(5): the first obtained
    value is used)."""
    variables = [v for line in lines if line.startswith("SetEnv ") for v in line.split()[1:]]
    joined: list[str] = []
    for line in lines:
        if not line.startswith("SetEnv "):
            joined.append(line)
        elif variables:
            joined.append("SetEnv " + " ".join(variables))
            variables = []
    return joined


def _keygen(path: Path, comment: str) -> None:
    keygen = need_binary("ssh", "ssh-keygen")
    subprocess.run(
        [keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )


def _known_hosts_line(port: int, host_key_pub: Path) -> str:
    keytype, blob = host_key_pub.read_text().split()[:2]
    return f"[127.0.0.1]:{port} {keytype} {blob}\n"


def authorized_keys_line(public_key: str, forced_command: str | None) -> str:
    """One authorized_keys line for ``public_key``; with ``forced_command``, prefixed by
    ``command="...",restrict`` (the command may not hold ``"`` or ``\\``: sshd would
    unescape them)."""
    if forced_command is None:
        return public_key
    if '"' in forced_command or "\\" in forced_command or "\n" in forced_command:
        raise ValueError(f"forced command {forced_command!r} holds a quote, backslash or newline")
    return f'command="{forced_command}",restrict {public_key}'


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _wait_for_banner(proc: subprocess.Popen, port: int, log: Path) -> bool:
    """Return True once sshd answers with an SSH banner, False if it exited first."""
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    proc.terminate()
    proc.wait(5)
    unavailable("sshd", f"no SSH banner on port {port} after {_START_TIMEOUT} s; log: {log}")
    return False


class _Sshd:
    """One sshd process with its own directory, host key and config."""

    def __init__(self, workdir: Path, user_key: Path):
        self.workdir = workdir
        self.user_key = user_key
        self.proc: subprocess.Popen | None = None

    def start(
        self, known_hosts_from: SshServer | None = None, forced_command: str | None = None,
        extra_config: Sequence[str] = (),
    ) -> SshServer:
        sshd = need_binary("sshd", "sshd")
        if os.geteuid() != 0:
            unavailable("sshd", "the test sshd logs in as root and must be started as root")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege-separation dir
        self.workdir.mkdir(parents=True, exist_ok=True)
        host_key = self.workdir / "ssh_host_ed25519_key"
        _keygen(host_key, "zbak-test-host")
        authorized = self.workdir / "authorized_keys"
        public_key = self.user_key.with_name(self.user_key.name + ".pub").read_text()
        _write_private(authorized, authorized_keys_line(public_key, forced_command))
        log = self.workdir / "sshd.log"
        for _attempt in range(3):  # the free port may be taken between probe and bind
            port = free_port()
            config = self.workdir / "sshd_config"
            config.write_text(
                "\n".join(
                    joined_setenv([
                        f"Port {port}",
                        "ListenAddress 127.0.0.1",
                        f'HostKey "{host_key}"',
                        f'PidFile "{self.workdir / "sshd.pid"}"',
                        f'AuthorizedKeysFile "{authorized}"',
                        "PermitRootLogin prohibit-password",
                        "PubkeyAuthentication yes",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "StrictModes no",
                        "LogLevel VERBOSE",
                        # bash sources ~/.bashrc for a command from sshd unless SHLVL says
                        # it is nested: the tests' commands must not run the host's set-up
                        "SetEnv SHLVL=1",
                        *extra_config,
                        "",
                    ])
                )
            )
            with open(log, "ab") as log_handle:
                self.proc = subprocess.Popen(
                    [sshd, "-D", "-e", "-f", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log_handle,
                    stderr=log_handle,
                )
            if _wait_for_banner(self.proc, port, log):
                break
        else:
            unavailable("sshd", f"sshd did not start: {log.read_text(errors='replace')[-2000:]}")
        trusted = known_hosts_from.host_key_pub if known_hosts_from else Path(f"{host_key}.pub")
        known_hosts = self.workdir / "known_hosts"
        _write_private(known_hosts, _known_hosts_line(port, trusted))
        return SshServer(
            host="127.0.0.1",
            port=port,
            user="root",
            identity_file=self.user_key,
            known_hosts=known_hosts,
            host_key_file=host_key,
            config_file=config,
        )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture(scope="session")
def ssh_user_key(tmp_path_factory) -> Path:
    """A per-run ed25519 user key (private key path; ``.pub`` next to it), no passphrase."""
    key = tmp_path_factory.mktemp("ssh-user") / "id_ed25519"
    _keygen(key, "zbak-test-user")
    return key


@pytest.fixture(scope="session")
def sshd(tmp_path_factory, ssh_user_key) -> Iterator[SshServer]:
    """The session's sshd on 127.0.0.1 (see SshServer); stopped when the session ends."""
    server = _Sshd(tmp_path_factory.mktemp("sshd"), ssh_user_key)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def sshd_factory(tmp_path, ssh_user_key) -> Iterator[Callable[..., SshServer]]:
    """Factory for more sshd servers, each with a fresh host key; all stopped after the test.

    Call as ``sshd_factory(known_hosts_from=None, forced_command=None, extra_config=())
    -> SshServer``. With
    ``known_hosts_from`` an SshServer, the new server's ``known_hosts`` names the new port with
    that server's host key, so a client using it sees a changed host key (the mismatch case).
    With ``forced_command``, the user key may only run that command (``command=...,restrict``).
    ``extra_config`` lines are appended to the server's sshd_config (e.g. ``Ciphers ...``).
    """
    started: list[_Sshd] = []

    def start(
        known_hosts_from: SshServer | None = None, forced_command: str | None = None,
        extra_config: Sequence[str] = (),
    ) -> SshServer:
        server = _Sshd(tmp_path / f"sshd-{len(started)}", ssh_user_key)
        started.append(server)
        return server.start(known_hosts_from, forced_command, extra_config)

    try:
        yield start
    finally:
        for server in started:
            server.stop()


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test that uses an sshd fixture with ``ssh``."""
    for item in items:
        if _SSH_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ssh)
