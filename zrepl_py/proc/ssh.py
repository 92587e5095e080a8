"""SSHExecutor: run argv lists on a remote host over paramiko, with strict host keys.

Follows the Executor contract in ``zrepl_py.proc.executor``. The connection and its host-key
policy are ``proc.sshconn``'s (an unknown key is refused unless ``trust_on_first_use``, a
changed key always; nothing is sent to a host whose key was not checked). The argv becomes a
command string in exactly one place, ``openssh.remote_command``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zrepl_py.proc.sshconn import SshConnection  # first: it keeps paramiko from importing invoke

# isort: split
import paramiko
import tenacity

from zrepl_py.errors import CommandFailed, HostUnreachable
from zrepl_py.proc.executor import Completed
from zrepl_py.proc.openssh import (
    SshHost,
    command_bytes,
    remote_argv,
    remote_command,
)

log = logging.getLogger(__name__)

_CHUNK = 32 * 1024  # bytes per channel read/write (paramiko's default max packet is 32 KiB)
_CLOSE_GRACE = 2.0  # seconds to wait for reader threads after closing a timed-out channel


class SSHExecutor:
    """Executor for one ``[hosts.NAME]`` over SSH (paramiko); connects on first ``run``.

    Thread-safe: one connection, one channel per ``run``. Use as a context manager or call
    ``close()``.

    Args:
        host: the config's host name, used as the label in logs and errors.
        config: the host's settings (``SshHost``, e.g. a ``HostConfig``: address, port, user,
            identity_file, known_hosts, trust_on_first_use, sudo, connect_timeout).
        known_hosts_default: known_hosts file used when ``config.known_hosts`` is None.

    Raises (from ``run``):
        HostKeyUnknown: the host's key is not in known_hosts and trust_on_first_use is off.
        HostKeyMismatch: the host offered a different key than known_hosts records.
        HostUnreachable: connection refused or timed out, login refused (``LoginRefused``),
            connection lost.
        CommandFailed: non-zero exit with ``check=True``, or timeout (``returncode=None``).
    """

    def __init__(self, host: str, config: SshHost, *, known_hosts_default: Path):
        self.host = host
        self.config = config
        self.connection = SshConnection(host, config, known_hosts_default=known_hosts_default)
        self.known_hosts = self.connection.known_hosts

    @property
    def _where(self) -> str:
        return self.connection.where

    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> Completed:
        """Run ``argv`` on the host and wait; see the Executor contract.

        Args:
            argv: the command, one str per argument (prefixed ``sudo -n`` if ``config.sudo``).
            input: bytes streamed to the command's stdin, then EOF; None gives an empty stdin.
            check: raise CommandFailed on a non-zero exit.
            timeout: seconds for the whole command; on expiry the channel is closed (the
                remote command gets EOF/SIGPIPE; sshd delivers a KILL signal request only to
                non-root sessions) and CommandFailed with ``returncode=None`` is raised.

        Raises:
            See the class docstring. ``returncode`` is -1 when the command ended without an
            exit status (killed by a signal).
        """
        full = remote_argv(argv, sudo=self.config.sudo)
        command = remote_command(argv, sudo=self.config.sudo)
        log.debug("run [%s]: %s", self.host, full)
        deadline = None if timeout is None else time.monotonic() + timeout
        transport = self.connection.transport()
        try:
            channel = self._open_session(transport)
            channel.exec_command(command_bytes(command))
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if transport.is_active():  # e.g. sshd's MaxSessions; other commands keep running
                raise HostUnreachable(
                    f"[{self.host}] {self._where} refused a new session: {exc}"
                ) from None
            self.close()
            raise HostUnreachable(
                f"[{self.host}] lost the connection to {self._where} starting a command: {exc}"
            ) from None
        try:
            stdout, stderr, status = self._communicate(channel, input, deadline)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise HostUnreachable(
                f"[{self.host}] lost the connection to {self._where} while running "
                f"{full[0]}: {exc or type(exc).__name__}") from None
        finally:
            channel.close()
        if status is None:
            raise CommandFailed(full, None, f"timed out after {timeout} s", self.host)
        if status == -1 and not transport.is_active():
            self.close()
            raise HostUnreachable(
                f"[{self.host}] connection to {self._where} lost while running {full[0]}"
            )
        done = Completed(tuple(full), status, stdout, stderr)
        if check and status != 0:
            raise CommandFailed(full, status, done.error_text, self.host)
        return done

    def _open_session(self, transport: paramiko.Transport) -> paramiko.Channel:
        """A new session channel on ``transport``.

        sshd refuses a session beyond its ``MaxSessions`` (sshd_config(5), 10 by default; "no
        more sessions" in its log) and counts a finished command's session until it has reaped
        the command, which can lag behind the close this side has seen: eight threads running
        short commands were refused. A refusal on a live connection is retried with backoff
        for up to ``connect_timeout``. paramiko keeps one refusal per connection, so of two
        threads refused at once one may see ``SSHException("Unable to open channel.")``
        instead of the ``ChannelException``: any failure that leaves the connection up is
        taken as a refusal (a timed-out open has used up the time already).

        Raises:
            paramiko.SSHException: still refused when ``connect_timeout`` has passed, or the
                connection failed.
            OSError, EOFError: the connection failed.
        """
        timeout = self.config.connect_timeout.total_seconds()
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(
                lambda exc: isinstance(exc, paramiko.SSHException) and transport.is_active()
            ),
            wait=tenacity.wait_random_exponential(multiplier=0.01, max=0.5),
            stop=tenacity.stop_after_delay(timeout),
            reraise=True,
        )
        return retrying(transport.open_session, timeout=timeout)

    def _communicate(
        self, channel: paramiko.Channel, input: bytes | None, deadline: float | None
    ) -> tuple[bytes, bytes, int | None]:
        """Feed stdin and drain stdout/stderr concurrently (no window deadlock).

        Returns ``(stdout, stderr, status)``; status None means the deadline passed.
        """
        out: list[bytes] = []
        err: list[bytes] = []
        threads = [
            threading.Thread(target=_drain, args=(channel.recv, out), daemon=True),
            threading.Thread(target=_drain, args=(channel.recv_stderr, err), daemon=True),
        ]
        if input:
            threads.append(threading.Thread(target=_feed, args=(channel, input), daemon=True))
        else:
            _send_eof(channel)
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        finished = not any(t.is_alive() for t in threads) and channel.status_event.wait(
            None if deadline is None else max(0.0, deadline - time.monotonic())
        )
        if not finished:
            self._kill(channel)
            channel.close()
            for thread in threads:
                thread.join(_CLOSE_GRACE)
            return b"".join(out), b"".join(err), None
        return b"".join(out), b"".join(err), channel.recv_exit_status()

    def _kill(self, channel: paramiko.Channel) -> None:
        """Best effort: ask sshd to SIGKILL the command (RFC 4254 6.9 "signal" request).

        OpenSSH honours it only for privilege-separated (non-root) sessions; paramiko has no
        public call for it, so this builds the message itself.
        """
        if channel.closed:
            return
        try:
            message = paramiko.Message()
            message.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
            message.add_int(channel.remote_chanid)
            message.add_string("signal")
            message.add_boolean(False)
            message.add_string("KILL")
            _send_user_message(channel, message)
        except (AttributeError, OSError, EOFError, paramiko.SSHException) as exc:
            log.debug("[%s] could not send a KILL signal request: %s", self.host, exc)

    @property
    def connected(self) -> bool:
        """True while an SSH connection to the host is open."""
        return self.connection.connected

    def close(self) -> None:
        """Close the connection; a later ``run`` connects again."""
        self.connection.close()

    def __enter__(self) -> SSHExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SSHExecutor({self.host!r}, {self._where})"


def _drain(recv: Callable[[int], bytes], chunks: list[bytes]) -> None:
    """Read from one channel stream until EOF or close."""
    while True:
        try:
            data = recv(_CHUNK)
        except (OSError, EOFError, paramiko.SSHException):
            return
        if not data:
            return
        chunks.append(data)


def _feed(channel: paramiko.Channel, data: bytes) -> None:
    """Write ``data`` to the command's stdin, then send EOF; stop quietly if it went away."""
    try:
        for start in range(0, len(data), _CHUNK):
            channel.sendall(data[start : start + _CHUNK])
        _send_eof(channel)
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the command exited without reading all of stdin, like BrokenPipe locally


def _send_eof(channel: paramiko.Channel) -> None:
    """``channel.shutdown_write()`` without its race: paramiko marks the EOF sent under the
    channel's lock but sends it after releasing it, so its reader thread, answering the
    server's CLOSE of a command that has ended meanwhile, may send our CLOSE first. sshd
    then gets an EOF for a channel it has freed and drops the whole connection, with every
    command running on it ("ieof packet referred to nonexistent channel", seen with 8
    ``zfs set`` at once; paramiko issues #1115 and #1705, open in paramiko 3). Here the EOF
    leaves while the lock is held, so a CLOSE the reader thread answers comes after it; none
    is sent once the channel is closed.

    Raises:
        EOFError, OSError, paramiko.SSHException: the connection is gone.
    """
    with channel.lock:
        if channel.closed or channel.eof_sent:
            return
        message = paramiko.Message()
        message.add_byte(paramiko.common.cMSG_CHANNEL_EOF)
        message.add_int(channel.remote_chanid)
        channel.eof_sent = True
        _send_user_message(channel, message)


def _send_user_message(channel: paramiko.Channel, message: paramiko.Message) -> None:
    """Send ``message`` on ``channel``'s transport with paramiko's own private call: it has
    no public one for a "signal" request or for an EOF sent under the channel's lock.

    Raises:
        AttributeError: a paramiko without that call; EOFError, OSError,
            paramiko.SSHException: the connection is gone.
    """
    transport: Any = channel.transport  # the private call is not in paramiko's types
    transport._send_user_message(message)
