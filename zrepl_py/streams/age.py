"""The ``age`` step of the codec chain: each volume one age file (age-encryption.org/v1),
through pyrage (``zbak[age]``, the Rust ``age`` crate's bindings; docs/sealed.md).

Why pyrage and one file per volume (docs/decisions.md#sealed-volumes-are-age-files): any one
identity decrypts a volume with zbak or with the stock ``age`` command, volume by volume, so
``for v in vol-*; do age -d -i KEY "$v"; done | zstd -d | zfs receive`` restores a stream
without zbak. Nothing here is a cipher of zbak's own.

pyrage's ``encrypt_io``/``decrypt_io`` read a file-like and write a file-like, while a
volume's bytes are a generator of chunks consumed by ``Backend.put`` (or by ``zfs receive``):
:func:`_pumped` runs the pyrage call in one helper thread that pulls the chunks through a
buffered reader and hands 1 MiB pieces to the consumer through a bounded queue
(``PIECES_AHEAD`` pieces), so memory stays bounded whatever the volume size. pyrage keeps
the GIL while it encrypts or decrypts (measured: a Python loop in another thread ran at 2 %
of its speed beside ``encrypt_io``); other threads run while the helper is in a Python read
or write of ours, or in a call that lets go of the GIL (docs/performance.md#sealed-stores).

What pyrage raises: a failing read or write of ours comes back as ``EncryptError`` or
``DecryptError`` carrying only its text, so the helper thread keeps the original exception
and raises that one. ``DecryptError`` before any plaintext came out is the header: no
identity matches a recipient stanza, or the header is damaged (pyrage says "No matching keys
found" for both); an ``OSError`` later is a damaged or truncated payload chunk (age's STREAM
authenticates every 64 KiB chunk and the last one's flag).
"""

from __future__ import annotations

import io
import logging
import queue
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zrepl_py.errors import IdentityRefused, IdentityUnusable, PipelineFailed, StreamCorrupt
from zrepl_py.runtime.reading import SECRET_LIMIT, open_to_others, read_regular

if TYPE_CHECKING:
    from pyrage import _Identity, _Recipient

log = logging.getLogger(__name__)

MAGIC = b"age-encryption.org/v1\n"
"""The first line of every age file (age-encryption.org/v1, "Header")."""
PIECE = 1 << 20
"""Bytes handed to the consumer at a time."""
COMMAND = "age"
"""The age command (age-encryption.org's ``age``, Debian's ``age`` package) that
:func:`decrypt_file` runs when it is on the PATH."""
PIECES_AHEAD = 4
"""Pieces the helper thread may have ready before it waits for the consumer."""
RECIPIENT = re.compile(r"age1[02-9ac-hj-np-z]{58}|ssh-ed25519 [A-Za-z0-9+/]+={0,2}(?: .*)?")
"""The recipients zbak takes: an age X25519 public key (Bech32, ``age1`` and 58 characters)
or an OpenSSH ed25519 public key line (``ssh-ed25519 BASE64 [comment]``). pyrage checks the
Bech32 checksum and the key itself when the codec is built (:func:`recipients`)."""


def recipients(lines: Sequence[str], where: str) -> list[_Recipient]:
    """Parse public keys (:data:`RECIPIENT` lines) into pyrage recipients.

    Args:
        lines: the keys, one per entry (blank entries and ``#`` comments skipped, as
            ``age -R`` reads a recipients file).
        where: names their origin in messages (``stores.cold.age.recipients``, a file).

    Raises:
        IdentityUnusable: a line is no age X25519 or ssh-ed25519 public key (exit 2).
    """
    from pyrage import RecipientError, ssh, x25519

    parsed: list[_Recipient] = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            if text.startswith("ssh-ed25519 "):
                parsed.append(ssh.Recipient.from_str(text))
            else:
                parsed.append(x25519.Recipient.from_str(text))
        except RecipientError as exc:
            raise IdentityUnusable(f"{where}: entry {number} is not an age X25519 (age1...)"
                                   f" or ssh-ed25519 public key: {exc}") from None
    if not parsed:
        raise IdentityUnusable(f"{where}: no recipient (an age1... or ssh-ed25519 public key)")
    return parsed


def identities(path: Path) -> list[_Identity]:
    """Read the private keys of an identity file: an age identity file (``age-keygen``:
    ``AGE-SECRET-KEY-1...`` lines, ``#`` comments) or an unencrypted OpenSSH ed25519 private
    key. The key material stays in this process (never in an argv or a child's
    environment). Only a regular file of at most ``SECRET_LIMIT`` bytes is read
    (``runtime.reading``); keys every user may read are used with a warning.

    Raises:
        IdentityUnusable: the file cannot be read, is no regular file or too large, or holds
            no usable key (exit 2).
    """
    try:
        data = read_regular(path, SECRET_LIMIT)
    except OSError as exc:
        raise IdentityUnusable(f"cannot read the identity file {path}: {exc.strerror}") from None
    found = _parsed(data, path)
    mode = open_to_others(path)
    if mode is not None:
        log.warning("identity file %s is readable by every user (mode %04o): chmod 600 it",
                    path, mode)
    return found


def _parsed(data: bytes, path: Path) -> list[_Identity]:
    """The keys of identity file ``path`` holding ``data`` (see :func:`identities`)."""
    from pyrage import IdentityError, ssh, x25519

    if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----"):
        try:
            return [ssh.Identity.from_buffer(data)]
        except IdentityError as exc:
            raise IdentityUnusable(f"identity file {path}: not a usable OpenSSH ed25519 private"
                                   f" key (an unencrypted one): {exc}") from None
    found: list[_Identity] = []
    for line in data.decode("utf-8", "replace").splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            found.append(x25519.Identity.from_str(text))
        except IdentityError:
            raise IdentityUnusable(f"identity file {path}: a line is not an age identity"
                                   " (AGE-SECRET-KEY-1...)") from None
    if not found:
        raise IdentityUnusable(f"identity file {path} holds no age identity")
    return found


def encrypt(chunks: Iterable[bytes], to: Sequence[_Recipient]) -> Iterator[bytes]:
    """Yield one age file encrypting the concatenation of ``chunks`` to every recipient.

    Raises:
        whatever iterating ``chunks`` raises.
    """
    import pyrage

    def run(reader: io.BufferedReader, writer: _PieceWriter) -> None:
        pyrage.encrypt_io(reader, writer, list(to))

    return _pumped(run, chunks, "age-encrypt")


def decrypt(chunks: Iterable[bytes], keys: Sequence[_Identity], what: str) -> Iterator[bytes]:
    """Yield the plaintext of one age file read from ``chunks``; the last piece only once
    the file's last chunk authenticated.

    Args:
        chunks: the age file's bytes.
        keys: the identities to try.
        what: names the volume in messages (store and key).

    Raises:
        IdentityRefused: the header opened with none of ``keys`` (before any plaintext came
            out). Where the stored bytes are the recorded ones (their SHA-256 checked), the
            identity is not one the volume was encrypted to.
        StreamCorrupt: a payload chunk failed authentication, or the file is truncated or
            extended.
        whatever iterating ``chunks`` raises.
    """
    import pyrage

    def run(reader: io.BufferedReader, writer: _PieceWriter) -> None:
        try:
            pyrage.decrypt_io(reader, writer, list(keys))
        except pyrage.DecryptError as exc:
            if writer.written:
                raise StreamCorrupt(f"{what}: the age file does not decrypt: {exc}") from None
            raise IdentityRefused(f"{what}: the age header opens with none of the identities"
                                  f" given ({exc}): the identity is not one of the store's"
                                  " recipients, or the volume is damaged") from None
        except OSError as exc:
            raise StreamCorrupt(f"{what}: the age file is damaged or truncated"
                                f" ({exc})") from None

    held = b""
    for piece in _pumped(run, chunks, "age-decrypt"):
        if held:
            yield held
        held = piece
    if held:
        yield held


def decrypt_file(command: str, path: Path, identity: Path, what: str) -> Iterator[bytes]:
    """Yield the plaintext of the age file ``path``, decrypted by the age command
    ``command`` in its own process (``age -d -i IDENTITY PATH``: the identity file's path in
    its argv, never a key; its environment without zbak's secrets, ``proc.spawn``), read
    from its standard output and yielded in whole pieces of ``PIECE`` (the command writes 32
    to 64 KiB at a time, and every piece costs the consumer its per-call work again, the zstd
    decoder's and the receive's write: docs/performance.md#sealed-stores); the last piece
    only once the command exited 0, i.e. once the file's last chunk authenticated (age's
    STREAM writes a 64 KiB chunk only once it authenticated, and fails on a file cut or
    extended). Why a process: docs/decisions.md#sealed-restore-decrypts-with-the-age-command.

    Args:
        command: the age command's path (``shutil.which(COMMAND)``).
        path: the volume's file (verified against the catalog's SHA-256 by the caller).
        identity: the identity file (an age identity file or an OpenSSH ed25519 key).
        what: names the volume in messages (store and key).

    Raises:
        IdentityRefused: the command failed before any plaintext came out: the header
            opened with no identity in the file (or the volume is damaged), as
            :func:`decrypt`.
        StreamCorrupt: it failed later (a payload chunk did not authenticate, the file is
            truncated or extended).
    """
    from zrepl_py.proc.pipeline import Stage
    from zrepl_py.proc.python_end import SendReader

    stage = Stage("age -d", (command, "-d", "-i", str(identity.absolute()),
                             str(path.absolute())))
    held = b""  # the last whole piece, yielded once more plaintext followed it
    parts: list[bytes] = []  # read since that piece
    got = 0  # bytes in parts
    try:
        with SendReader([stage]) as reader:
            while data := reader.read(PIECE - got):
                parts.append(data)
                got += len(data)
                if got == PIECE:
                    if held:
                        yield held
                    held, parts, got = b"".join(parts), [], 0
    except PipelineFailed as exc:
        if held or parts:  # plaintext came out before the failure
            raise StreamCorrupt(f"{what}: the age file does not decrypt: {exc}") from None
        raise IdentityRefused(f"{what}: the age header opens with none of the identities in"
                              f" {identity} ({exc}): the identity is not one of the store's"
                              " recipients, or the volume is damaged") from None
    for piece in (held, b"".join(parts)):
        if piece:
            yield piece


class HeaderWalk:
    """The stored structure of an age file, checked without a key: it starts with the age
    magic line and is longer than it. What it cannot see (any changed byte) is what the
    recorded SHA-256 and decryption catch.

    Args:
        what: names the volume in messages.
    """

    def __init__(self, what: str):
        self._what = what
        self._head = b""
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        """Account for the next stored bytes.

        Raises:
            StreamCorrupt: the bytes so far cannot start an age file.
        """
        self._size += len(chunk)
        if len(self._head) < len(MAGIC):
            self._head += chunk[:len(MAGIC) - len(self._head)]
            if not MAGIC.startswith(self._head):
                raise StreamCorrupt(f"{self._what}: not an age file (no age-encryption.org/v1"
                                    " header)")

    def end(self) -> None:
        """The stored bytes are over.

        Raises:
            StreamCorrupt: too short to be an age file.
        """
        if self._size <= len(MAGIC):
            raise StreamCorrupt(f"{self._what}: not an age file (truncated header)")


class _ChunkReader(io.RawIOBase):
    """A raw binary reader over an iterator of chunks (what ``io.BufferedReader`` wraps)."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self._left = memoryview(b"")
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            try:
                chunk = next(self._chunks, None)
            except BaseException as exc:
                self.error = exc  # pyrage keeps only the text: the pump raises this one
                raise
            if chunk is None:
                return 0
            self._left = memoryview(chunk)
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size


class _Stopped(Exception):
    """The consumer went away; the helper thread unwinds."""


class _PieceWriter(io.BufferedIOBase):
    """A raw binary writer that gathers what pyrage writes (8 or 64 KiB at a time) into
    ``PIECE``-sized pieces and queues them for the consumer."""

    def __init__(self, out: queue.Queue[object], stop: threading.Event):
        self._out, self._stop = out, stop
        self._piece = bytearray()
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._piece += data
        size = len(data)
        self.written += size
        if len(self._piece) >= PIECE:
            self.flush_piece()
        return size

    def flush_piece(self) -> None:
        if self._piece:
            piece, self._piece = bytes(self._piece), bytearray()
            self.put(piece)

    def put(self, item: object) -> None:
        while True:
            if self._stop.is_set():
                raise _Stopped
            try:
                self._out.put(item, timeout=0.1)
                return
            except queue.Full:
                continue


_END = object()


def _pumped(run: Callable[[io.BufferedReader, _PieceWriter], None], chunks: Iterable[bytes],
            name: str) -> Iterator[bytes]:
    """Run ``run(reader over chunks, writer)`` in a helper thread; yield what it writes.

    The source ``chunks`` is iterated (and closed) in the helper thread only. When the
    consumer stops early, the helper thread is told to stop and joined before this returns.

    Raises:
        the exception ``run`` or the source raised, in the consumer's thread.
    """
    source = iter(chunks)
    out: queue.Queue[object] = queue.Queue(maxsize=PIECES_AHEAD)
    stop = threading.Event()
    raw = _ChunkReader(source)
    writer = _PieceWriter(out, stop)
    failure: list[BaseException] = []

    def body() -> None:
        try:
            run(io.BufferedReader(raw, PIECE), writer)
            writer.flush_piece()
        except BaseException as exc:
            failure.append(raw.error or exc)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                try:
                    close()
                except BaseException as exc:
                    failure.append(exc)
            try:
                writer.put(_END)
            except _Stopped:
                pass

    thread = threading.Thread(target=body, name=f"zbak-{name}", daemon=True)
    thread.start()
    try:
        while True:
            item = out.get()
            if item is _END:
                break
            assert isinstance(item, bytes)
            yield item
        thread.join()
        if failure and not isinstance(failure[0], _Stopped):
            raise failure[0]
    finally:
        stop.set()
        thread.join()
