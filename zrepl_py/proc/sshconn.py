"""One paramiko SSH connection to a ``[hosts.NAME]``, with zbak's host-key policy: the one
place zbak dials a host with paramiko (the control commands' ``SSHExecutor`` and the
``sftp://`` store both ride on an ``SshConnection``).

Host keys are checked against one known_hosts file (``SshHost.known_hosts`` or the default
given, normally ``<state_dir>/known_hosts``): an unknown key is refused with
``HostKeyUnknown`` (paramiko ``RejectPolicy``) unless ``trust_on_first_use``, which records it
(file mode 0600); a changed key always raises ``HostKeyMismatch`` before authentication, so
nothing is sent. Login is by key only.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import NoReturn

# paramiko.config imports invoke (0.04 s here) only to run ssh_config(5) "Match exec";
# zbak never reads an ssh_config with paramiko, so the import is refused up front.
sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]  # None: the import fails
import paramiko

from zrepl_py.errors import HostKeyMismatch, HostKeyUnknown, HostUnreachable, LoginRefused
from zrepl_py.proc.openssh import SshHost, known_hosts_path

log = logging.getLogger(__name__)

_KEEPALIVE = 30  # seconds between keepalive packets on an idle connection


def fingerprint(key: paramiko.PKey) -> str:
    """Return the OpenSSH-style ``SHA256:<base64, no padding>`` fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


class _RejectUnknown(paramiko.RejectPolicy):
    """RejectPolicy that raises zbak's typed error, naming host, port and fingerprint."""

    def __init__(self, label: str, known_hosts: Path):
        self.label = label
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> NoReturn:
        raise HostKeyUnknown(
            f"[{self.label}] host key of {hostname} is not in {self.known_hosts} "
            f"(offered {key.get_name()} {fingerprint(key)}); refusing to connect, nothing sent. "
            f"Verify the fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
            f"then add it to that file or set trust_on_first_use = true for the first connection"
        )


class _TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Accept an unknown host key and append it to the known_hosts file (mode 0600)."""

    def __init__(self, label: str, known_hosts: Path):
        self.label = label
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.known_hosts, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, line.encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning(
            "[%s] trusted new host key of %s on first use: %s %s (recorded in %s)",
            self.label, hostname, key.get_name(), fingerprint(key), self.known_hosts,
        )  # fmt: skip


def _connected_socket(address: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``address:port`` with Nagle's algorithm off (``TCP_NODELAY``).

    Every control command is a few small SSH packets (channel open, exec, EOF, close); with
    Nagle on, each waits for the server's delayed ACK (40 ms on Linux, tcp(7)), so a command
    took about 48 ms on 127.0.0.1 and takes about 3 ms without it. paramiko leaves the option
    unset on the sockets it opens itself, so zbak opens the socket and hands it over.

    Raises:
        OSError: the connection failed (``TimeoutError`` after ``timeout`` seconds).
    """
    sock = socket.create_connection((address, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class SshConnection:
    """One SSH connection to a host, opened on first use and again after it was lost.

    Thread-safe: :meth:`transport` may be called from several threads; they share one
    connection (each opens its own channels on it).

    Args:
        host: the config's host name, used as the label in logs and errors.
        config: the host's settings (``SshHost``, e.g. a ``HostConfig``: address, port, user,
            identity_file, known_hosts, trust_on_first_use, connect_timeout).
        known_hosts_default: known_hosts file used when ``config.known_hosts`` is None.
    """

    def __init__(self, host: str, config: SshHost, *, known_hosts_default: Path):
        self.host = host
        self.config = config
        self.known_hosts = known_hosts_path(config, known_hosts_default)
        self._lock = threading.Lock()
        self._client: paramiko.SSHClient | None = None

    @property
    def where(self) -> str:
        """``USER@ADDRESS:PORT``, for messages."""
        return f"{self.config.user}@{self.config.address}:{self.config.port}"

    def transport(self) -> paramiko.Transport:
        """Return the live transport, connecting (again) if there is none.

        Raises:
            HostKeyUnknown: the host's key is not in known_hosts and trust_on_first_use is off.
            HostKeyMismatch: the host offered another key than known_hosts records.
            LoginRefused: the host refused the key, or the identity file cannot be read.
            HostUnreachable: connection refused, timed out or lost during the handshake.
        """
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
                self._client.close()
                self._client = None
            client = paramiko.SSHClient()
            try:
                self._open(client)
            except BaseException:
                client.close()
                raise
            transport = client.get_transport()
            if transport is None:  # connect() returned without a transport: never seen
                client.close()
                raise HostUnreachable(f"[{self.host}] no SSH transport to {self.where}")
            self._client = client
            transport.set_keepalive(_KEEPALIVE)
            return transport

    def _open(self, client: paramiko.SSHClient) -> None:
        cfg = self.config
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        policy = _TrustOnFirstUse if cfg.trust_on_first_use else _RejectUnknown
        client.set_missing_host_key_policy(policy(self.host, self.known_hosts))
        timeout = cfg.connect_timeout.total_seconds()
        identity = None  # paramiko's defaults: the agent and ~/.ssh/id_* keys
        if cfg.identity_file is not None:
            if not os.access(cfg.identity_file, os.R_OK):
                raise LoginRefused(
                    f"[{self.host}] cannot read identity_file {cfg.identity_file} "
                    f"for {self.where}; check hosts.{self.host}.identity_file"
                )
            identity = str(cfg.identity_file)
        log.debug("[%s] connecting to %s", self.host, self.where)
        try:
            client.connect(
                cfg.address,
                port=cfg.port,
                sock=_connected_socket(cfg.address, cfg.port, timeout),
                username=cfg.user,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                key_filename=identity,
                look_for_keys=identity is None,
                allow_agent=identity is None,
            )
        except paramiko.BadHostKeyException as exc:
            raise HostKeyMismatch(
                f"[{self.host}] HOST KEY CHANGED for {cfg.address} port {cfg.port}: offered "
                f"{exc.key.get_name()} {fingerprint(exc.key)}, {self.known_hosts} has "
                f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}; nothing sent. "
                f"If the host was reinstalled, verify the new fingerprint on it and replace the "
                f"line (ssh-keygen -R '[{cfg.address}]:{cfg.port}' -f {self.known_hosts})"
            ) from None
        except paramiko.AuthenticationException as exc:
            raise LoginRefused(
                f"[{self.host}] login to {self.where} refused ({exc}); check user, "
                f"identity_file (no passphrase) and the host's authorized_keys"
            ) from None
        except TimeoutError as exc:
            raise HostUnreachable(
                f"[{self.host}] no answer from {self.where} within {timeout:g} s ({exc}); "
                f"check address, port, firewall and connect_timeout"
            ) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise HostUnreachable(
                f"[{self.host}] cannot connect to {self.where}: {exc or type(exc).__name__}; "
                f"check address and port, and that sshd runs there"
            ) from None

    @property
    def connected(self) -> bool:
        """True while the SSH connection is open."""
        client = self._client
        transport = client.get_transport() if client is not None else None
        return transport is not None and transport.is_active()

    def close(self) -> None:
        """Close the connection (its channels with it); a later :meth:`transport` connects
        again."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def __repr__(self) -> str:
        return f"SshConnection({self.host!r}, {self.where})"
