"""One SFTP session (one channel of an SSH connection) with what the ``sftp://`` store needs
beyond paramiko's ``SFTPClient``: the server's extensions, every write's status, bounded
pipelined reads and writes, ``fsync@openssh.com``, and typed errors.

Why not paramiko's own file objects (paramiko 3.4 to 4.0, ``sftp_file.py``):

- a pipelined ``SFTPFile`` sends its writes with no owner, so a write's error status that
  arrives while another answer is awaited is dropped, and ``close`` ignores every error: a
  write the server failed (a full disk answers ``SSH_FX_FAILURE``) would go unnoticed. Here
  each write's status is collected and the first failure raised;
- ``SFTPClient`` reads the server's ``SSH_FXP_VERSION`` and throws its extension list away,
  so whether the server has ``posix-rename@openssh.com`` or ``fsync@openssh.com`` cannot be
  asked; here it is kept (:attr:`Session.extensions`);
- a status other than "no such file" and "permission denied" becomes an ``IOError`` with only
  the server's text; here it is :class:`SftpStatus` with the protocol's code.

It uses paramiko's request plumbing (``_request``, ``_async_request``, ``_read_response``,
``_send_packet``, ``_read_packet``), as paramiko's own prefetching file does; the message
formats are draft-ietf-secsh-filexfer-02 (SFTP version 3, what OpenSSH speaks) and OpenSSH's
PROTOCOL file for the ``@openssh.com`` extensions.

A session is used by one thread at a time (its requests and answers share one channel).
"""

from __future__ import annotations

import errno
import struct
from collections import deque
from typing import Any

from zrepl_py.proc.sshconn import SshConnection  # first: it keeps paramiko from importing invoke

# isort: split
import paramiko
from paramiko.message import Message
from paramiko.sftp import (
    CMD_ATTRS,
    CMD_CLOSE,
    CMD_DATA,
    CMD_EXTENDED,
    CMD_EXTENDED_REPLY,
    CMD_FSETSTAT,
    CMD_FSTAT,
    CMD_HANDLE,
    CMD_INIT,
    CMD_OPEN,
    CMD_READ,
    CMD_STATUS,
    CMD_VERSION,
    CMD_WRITE,
    SFTP_EOF,
    SFTP_NO_SUCH_FILE,
    SFTP_OK,
    SFTP_PERMISSION_DENIED,
    SFTPError,
    int64,
)
from paramiko.sftp_attr import SFTPAttributes

POSIX_RENAME = "posix-rename@openssh.com"
FSYNC = "fsync@openssh.com"
LIMITS = "limits@openssh.com"

BLOCK = 32768
"""Bytes per read or write request when the server states no limits: every SFTP server
takes requests of this size (draft-ietf-secsh-filexfer-02 section 3: packets of at least
34,000 bytes)."""
MAX_BLOCK = 256 * 1024
"""The largest request used even when the server allows more (OpenSSH 9 allows 255 KiB)."""
IN_FLIGHT = 4 << 20
"""Bytes of read or write requests sent and not yet answered (64 of 64 KiB, the window the
OpenSSH client keeps: sftp(1) ``-R 64`` of its 32 KiB, doubled for fewer round trips)."""

_ERRNO = {SFTP_NO_SUCH_FILE: errno.ENOENT, SFTP_PERMISSION_DENIED: errno.EACCES}
# draft-ietf-secsh-filexfer-02 section 7 (SSH_FX_*)
CODE_NAMES = {0: "OK", 1: "EOF", 2: "NO_SUCH_FILE", 3: "PERMISSION_DENIED", 4: "FAILURE",
              5: "BAD_MESSAGE", 6: "NO_CONNECTION", 7: "CONNECTION_LOST", 8: "OP_UNSUPPORTED"}


class SftpStatus(OSError):
    """The server answered a request with an error status.

    Attributes:
        code: the status code (``paramiko.sftp.SFTP_*``, e.g. ``SFTP_NO_SUCH_FILE``); an
            OpenSSH server answers ``SSH_FX_FAILURE`` for any error without a code of its own
            (a full disk, an existing directory, a name that is a directory).
        text: the server's message.
    """

    def __init__(self, code: int, text: str):
        self.code = code
        self.text = text
        name = CODE_NAMES.get(code, str(code))
        if code in _ERRNO:
            super().__init__(_ERRNO[code], f"{text} (SSH_FX_{name})")
        else:
            super().__init__(f"{text} (SSH_FX_{name})")


class _Replies:
    """The answers to pipelined requests, as paramiko's reader hands them over
    (``_async_response``): a read's data or end of file, a write's status."""

    def __init__(self) -> None:
        self.data: dict[int, bytes | None] = {}  # None: end of file
        self.failure: SftpStatus | None = None

    def _async_response(self, t: int, msg: Message, num: int) -> None:
        if t == CMD_DATA:
            self.data[num] = msg.get_string()
            return
        if t != CMD_STATUS:
            self.failure = self.failure or SftpStatus(5, f"unexpected answer type {t}")
            self.data[num] = None
            return
        code, text = msg.get_int(), msg.get_text()
        if code == SFTP_EOF:
            self.data[num] = None
        elif code == SFTP_OK:
            self.data[num] = b""
        else:
            self.failure = self.failure or SftpStatus(code, text)
            self.data[num] = None


class Session(paramiko.SFTPClient):
    """An SFTP session on one channel; see the module docstring.

    Attributes:
        extensions: the server's extensions from its version packet, ``{name: data}``.
        block: bytes per read or write request (the server's ``limits@openssh.com``, at most
            :data:`MAX_BLOCK`, else :data:`BLOCK`).
    """

    extensions: dict[str, bytes]
    block: int

    @classmethod
    def start(cls, connection: SshConnection, timeout: float) -> Session:
        """Open a channel on ``connection``, start the ``sftp`` subsystem on it, and read the
        server's version and limits. Every request waits at most ``timeout`` seconds for
        its answer (``socket.timeout`` after).

        Raises:
            HostKeyUnknown, HostKeyMismatch, LoginRefused, HostUnreachable: connecting.
            paramiko.SSHException, OSError, EOFError: the server refused the channel or
                the subsystem, or the connection was lost.
        """
        channel = connection.transport().open_session(timeout=timeout)
        try:
            channel.settimeout(timeout)
            channel.invoke_subsystem("sftp")
            session = cls(channel)
        except BaseException:
            channel.close()
            raise
        session.block = session._block()
        return session

    # -- paramiko's hooks ---------------------------------------------------------------

    def _send_version(self) -> int:
        """paramiko's, keeping the extension pairs that follow the version number."""
        msg = Message()
        msg.add_int(3)
        raw: Any = self
        raw._send_packet(CMD_INIT, msg)
        t, data = raw._read_packet()
        if t != CMD_VERSION:
            raise SFTPError("Incompatible sftp protocol")
        version: int = struct.unpack(">I", data[:4])[0]
        self.extensions = {}
        at = 4
        fields: list[bytes] = []
        while at + 4 <= len(data):
            (length,) = struct.unpack(">I", data[at:at + 4])
            fields.append(data[at + 4:at + 4 + length])
            at += 4 + length
        for name, value in zip(fields[::2], fields[1::2], strict=False):
            self.extensions[name.decode("utf-8", "replace")] = value
        return version

    def _convert_status(self, msg: Message) -> None:
        """paramiko's, raising :class:`SftpStatus` (an ``OSError``) with the code."""
        code, text = msg.get_int(), msg.get_text()
        if code == SFTP_OK:
            return
        if code == SFTP_EOF:
            raise EOFError(text)
        raise SftpStatus(code, text)

    # -- requests -----------------------------------------------------------------------

    def _call(self, t: int, *args: object) -> tuple[int, Message]:
        raw: Any = self
        answer: tuple[int, Message] = raw._request(t, *args)
        return answer

    def _block(self) -> int:
        if LIMITS not in self.extensions:
            return BLOCK
        t, msg = self._call(CMD_EXTENDED, LIMITS)
        if t != CMD_EXTENDED_REPLY:
            return BLOCK
        _packet, read, write = msg.get_int64(), msg.get_int64(), msg.get_int64()
        return max(BLOCK, min(MAX_BLOCK, read or MAX_BLOCK, write or MAX_BLOCK))

    def open_handle(self, path: str, flags: int, mode: int | None = None) -> bytes:
        """``SSH_FXP_OPEN`` of ``path`` with ``flags`` (``paramiko.sftp.SFTP_FLAG_*``), and
        permissions ``mode`` for a file it creates; returns the handle.

        Raises:
            SftpStatus, OSError, EOFError, paramiko.SSHException.
        """
        attrs = SFTPAttributes()
        if mode is not None:
            attrs.st_mode = mode
        t, msg = self._call(CMD_OPEN, path, flags, attrs)
        if t != CMD_HANDLE:
            raise SFTPError("Expected handle")
        handle: bytes = msg.get_binary()
        return handle

    def close_handle(self, handle: bytes) -> None:
        """``SSH_FXP_CLOSE``; an error status is raised (``SftpStatus``), unlike paramiko's
        file objects."""
        self._call(CMD_CLOSE, handle)

    def fstat(self, handle: bytes) -> SFTPAttributes:
        """``SSH_FXP_FSTAT``: size, mode and times (whole seconds) of the open file."""
        t, msg = self._call(CMD_FSTAT, handle)
        if t != CMD_ATTRS:
            raise SFTPError("Expected attributes")
        attrs: SFTPAttributes = SFTPAttributes._from_msg(msg)  # type: ignore[attr-defined]
        return attrs

    def set_times(self, handle: bytes, atime: int, mtime: int) -> None:
        """``SSH_FXP_FSETSTAT`` of the access and modification times (seconds since 1970)."""
        attrs = SFTPAttributes()
        attrs.st_atime, attrs.st_mtime = atime, mtime
        self._call(CMD_FSETSTAT, handle, attrs)

    def fsync(self, handle: bytes) -> None:
        """``fsync@openssh.com``: the server fsync(2)s the open file (OpenSSH PROTOCOL
        section 4.8). Only when :attr:`extensions` names it."""
        self._call(CMD_EXTENDED, FSYNC, handle)

    def write_at(self, handle: bytes, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``offset``, :data:`IN_FLIGHT` bytes of requests at a time, and
        wait for every answer.

        Raises:
            SftpStatus: the first write the server failed; OSError, EOFError,
                paramiko.SSHException: the connection failed or timed out.
        """
        view = memoryview(data).cast("B")
        replies = _Replies()
        raw: Any = self
        pending: deque[int] = deque()
        window = max(1, IN_FLIGHT // self.block)
        for at in range(0, len(view), self.block):
            piece = bytes(view[at:at + self.block])
            pending.append(raw._async_request(replies, CMD_WRITE, handle, int64(offset + at),
                                              piece))
            while len(pending) >= window:
                self._await(replies, pending.popleft())
            if replies.failure is not None:
                break
        while pending:
            self._await(replies, pending.popleft())
        if replies.failure is not None:
            raise replies.failure

    def read_at(self, handle: bytes, offset: int, length: int) -> bytes:
        """Read ``length`` bytes from ``offset``, :data:`IN_FLIGHT` bytes of requests at a
        time; fewer only when the file ends first.

        Raises:
            SftpStatus, OSError, EOFError, paramiko.SSHException.
        """
        out = bytearray()
        replies = _Replies()
        raw: Any = self
        pending: deque[tuple[int, int, int]] = deque()  # (request, offset, size)
        window = max(1, IN_FLIGHT // self.block)
        sent, end, ended = offset, offset + length, False
        while not ended and (pending or sent < end):
            while sent < end and len(pending) < window:
                size = min(self.block, end - sent)
                pending.append((raw._async_request(replies, CMD_READ, handle, int64(sent),
                                                   size), sent, size))
                sent += size
            num, at, size = pending.popleft()
            self._await(replies, num)
            data = replies.data.pop(num)
            if replies.failure is not None:
                break
            if data is None:
                ended = True
                continue
            out += data
            if len(data) < size:  # a short read before the end: ask for the rest alone
                rest = self.read_at(handle, at + len(data), size - len(data))
                out += rest
                ended = len(rest) < size - len(data)
        for num, _at, _size in pending:  # answers of requests after the end
            self._await(replies, num)
        if replies.failure is not None:
            raise replies.failure
        return bytes(out)

    def _await(self, replies: _Replies, num: int) -> None:
        raw: Any = self
        while num not in replies.data:
            raw._read_response()
