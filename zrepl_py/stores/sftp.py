"""``sftp://HOST/PATH``: a store in a directory of an SFTP server (a storage box, a NAS, any
OpenSSH host), reached over one SSH connection (``proc.sshconn``: strict host keys, login by
key) and spoken to in SFTP only, so a server that offers nothing else works: OpenSSH's
``internal-sftp`` in a chroot, with no shell, no rsync and no port forwarding
(docs/decisions.md#sftp-store).

Each key is a file under ``PATH`` as the SFTP session sees it (inside the server's chroot).
An object is written like a ``file://`` object (``stores.temporaries``): to a temporary file
``.NAME.partial-XXXXXXXX`` beside its key, created mode 0600, fsync'ed by the server when it
offers ``fsync@openssh.com``, then renamed over the key with ``posix-rename@openssh.com``
(rename(2): atomic, an earlier object stays until the new one is whole). A server without
that extension has only SFTP's own rename, which refuses an existing target: the earlier
object is removed first, so a crash between the two leaves no object under the key (the
new bytes are in the temporary file; ``zbak audit`` reports it). The SHA-256 is computed
while sending (there is no server-side hash without a shell) and the size the server
reports is checked before the rename.

Writes go in parts (8 MiB) of which ``concurrency`` are written at once, each on its own
SFTP channel of the one connection; reads and listings use the channels too, at most
``concurrency`` open at a time. A connection lost mid-way is dialled again and the part, the
read window or the listing of one directory is tried again under the store's retry policy,
so a put of a whole volume survives a dropped connection.

Times are the server's, in whole seconds (SFTP version 3 has no finer ones). The etag of an
object is its modification time: a put that replaces an object within the same second sets
the new one's a second later, so every replacement by zbak changes the etag (a rewrite by
someone else within the same second, with the same size, would not be seen; the audit's
``--deep`` read still would). Everything is ``STANDARD``; nothing needs a thaw.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import datetime as dt
import functools
import hashlib
import logging
import stat as statmod
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TypeVar

from zrepl_py.errors import (
    HostKeyMismatch,
    HostUnreachable,
    LoginRefused,
    ObjectNotFound,
    StorePermanent,
    StoreTransient,
    ZbakError,
)
from zrepl_py.proc.sshconn import SshConnection
from zrepl_py.stores.base import Backend, ObjectInfo, PutResult, Thaw, Unfinished, under_any
from zrepl_py.stores.keys import check_key, check_prefix
from zrepl_py.stores.parts import cut, send_all
from zrepl_py.stores.retry import RetryPolicy
from zrepl_py.stores.sftp_session import FSYNC, POSIX_RENAME, Session, SftpStatus
from zrepl_py.stores.temporaries import lead, meant_for, temporary_name

# isort: split
import paramiko
from paramiko.sftp import (
    SFTP_FLAG_CREATE,
    SFTP_FLAG_READ,
    SFTP_FLAG_TRUNC,
    SFTP_FLAG_WRITE,
    SFTP_NO_SUCH_FILE,
)
from paramiko.sftp_attr import SFTPAttributes

T = TypeVar("T")
log = logging.getLogger(__name__)

MiB = 1 << 20
PART_SIZE = 8 * MiB
"""Bytes per part of a put, written on one channel (as the S3 store's parts: with the
default concurrency of 4, 40 MiB in memory at most)."""
READ_WINDOW = 8 * MiB
"""Bytes a ``get`` asks for at once (its memory), on one channel."""
REQUEST_TIMEOUT = 120.0
"""Seconds one SFTP request may wait for its answer (a server fsync'ing a whole volume
included) before the channel is given up as lost."""
_NEW_FILE = SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_TRUNC


class SftpBackend(Backend):
    """A store in the directory ``root`` of the SFTP server ``connection`` reaches.

    Args:
        name: the store's name in the config, for messages.
        connection: the SSH connection to the server (its host-key policy and login); the
            backend closes it in :meth:`close`.
        root: the store's directory, absolute as the SFTP session sees it (``/backups/zbak``).
            It is created by :meth:`probe` only (``zbak init``), never by a put.
        part_size: bytes per part of a put.
        concurrency: channels used at once (1 to 64): parts of one put written together,
            directories listed together, reads of several threads.
        retry: the retry policy; None for :class:`RetryPolicy`'s defaults.

    Raises:
        StorePermanent: ``root`` is not absolute or holds a ``.`` or ``..`` segment, or the
            concurrency is out of range.
    """

    def __init__(self, name: str, connection: SshConnection, root: str, *,
                 part_size: int = PART_SIZE, concurrency: int = 4,
                 retry: RetryPolicy | None = None):
        trimmed = root.rstrip("/")
        if not root.startswith("/") or {".", ".."} & set(trimmed.split("/")):
            raise StorePermanent(f"store {name}: directory {root!r} is not absolute, or holds a"
                                 " '.' or '..' segment", store=name)
        if not 1 <= concurrency <= 64:
            raise StorePermanent(f"store {name}: upload concurrency {concurrency} is not 1 to 64",
                                 store=name)
        self.name = name
        self.root = trimmed or "/"
        self.url = f"sftp://{connection.host}{self.root}"
        self.part_size = part_size
        self.concurrency = concurrency
        self._connection = connection
        self._sessions = _Sessions(connection, concurrency, name)
        self._retry = retry or RetryPolicy()

    def __repr__(self) -> str:
        return f"SftpBackend({self.name!r}, {self.url!r})"

    # -- Backend ----------------------------------------------------------------------------

    def put(self, key: str, chunks: Iterable[bytes], *,
            storage_class: str = "STANDARD") -> PutResult:
        """Write ``chunks`` to a temporary file beside ``key``, part by part (``concurrency``
        parts at once, each on its own channel), check the size the server reports, fsync
        it (``fsync@openssh.com``) and rename it over ``key``; then remove what earlier,
        interrupted puts of the same key left (as ``file://`` does). Missing directories
        below the root are created (mode 0700). On any failure, the exception from
        ``chunks`` included, the temporary file is removed and an earlier object under
        ``key`` is untouched. ``storage_class`` is ignored (the result says ``STANDARD``).

        Raises:
            StorePermanent: invalid key, root missing, permission denied, the server failed
                a write (a full disk answers SSH_FX_FAILURE) or stored another size.
            StoreTransient: the connection failed beyond the retries.
            whatever iterating ``chunks`` raises.
        """
        path = self._path(key)
        parent, _, name = path.rpartition("/")
        temporary = f"{parent}/{temporary_name(name)}"
        digest = hashlib.sha256()
        total = [0]

        def counted(size: int) -> None:
            total[0] = size

        parts = cut(chunks, self.part_size, digest, counted)
        first = next(parts)
        more = len(first) == self.part_size

        def write(number: int, part: bytearray) -> None:
            offset = number * self.part_size  # part 1 of ``parts`` follows ``first``
            self._call("writing", key, lambda s: _write_file(s, temporary, offset, part))

        try:
            began = self._call("creating the temporary file for", key, functools.partial(
                self._create, key=key, parent=parent, temporary=temporary, first=first))
            del first  # the parts in flight and the one being cut are all a put holds
            if more:
                send_all(parts, write, concurrency=self.concurrency,
                         thread_name=f"zbak-sftp-{self.name}")
            self._call("finishing", key,
                       lambda s: self._finish(s, key, path, temporary, total[0]))
        except BaseException:
            self._remove_quietly(key, temporary)
            raise
        self._drop_earlier_temporaries(key, parent, name, began)
        return PutResult(size=total[0], sha256=digest.hexdigest(), storage_class="STANDARD")

    def get(self, key: str, *, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Stat ``key`` now (so a missing key raises here, before any byte) and return an
        iterator of its bytes in chunks of at most ``chunk_size`` bytes, read
        ``READ_WINDOW`` bytes at a time. A connection lost mid-object is dialled again and
        the read resumed at the first byte not yet yielded, within the retry budget; an
        object replaced meanwhile (another size or time) is not spliced in.

        Raises:
            ObjectNotFound: no regular file under ``key``.
            StorePermanent: invalid key, permission denied, the object changed while read.
            StoreTransient: the connection failed beyond the retries (also while iterating).
        """
        path = self._path(key)
        attrs = self._call("reading", key, lambda s: self._stat_object(s, key, path))
        return self._read(key, path, attrs, chunk_size)

    def stat(self, key: str) -> ObjectInfo:
        """Size and modification time (whole seconds) of the file under ``key``; always
        ``STANDARD``, ``NOT_NEEDED``, and no ``sha256`` (the server keeps none).

        Raises:
            ObjectNotFound: no regular file under ``key``.
            StorePermanent, StoreTransient.
        """
        path = self._path(key)
        return _info(key, self._call("reading the metadata of", key,
                                     lambda s: self._stat_object(s, key, path)))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield the regular files whose key starts with ``prefix``, sorted by key
        (code-point order, as ``file://`` and S3); temporary files and symbolic links are
        skipped. Only the directory holding the prefix is listed, and below it only the
        directories the prefix can reach, ``concurrency`` directories at a time.

        Raises:
            StorePermanent: invalid prefix; a directory cannot be read.
            StoreTransient: the connection failed beyond the retries.
        """
        return self.list_outside(prefix, ())

    def list_outside(self, prefix: str, skip: Collection[str]) -> Iterator[ObjectInfo]:
        """:meth:`list` without the objects under the directories ``skip`` names (key
        prefixes ending in ``/``), which are never read (``Backend.list_outside``).

        Raises:
            as :meth:`list`.
        """
        found = [_info(key, attrs) for key, attrs in self._walk(prefix, frozenset(skip))]
        found.sort(key=_key_of)
        return iter(found)

    def delete(self, key: str) -> None:
        """Remove the file under ``key``; a missing key (or a directory there) is fine.

        Raises:
            StorePermanent: invalid key, permission denied.
            StoreTransient: the connection failed beyond the retries.
        """
        path = self._path(key)

        def remove(session: Session) -> None:
            try:
                session.remove(path)
            except SftpStatus as exc:
                if exc.code == SFTP_NO_SUCH_FILE or _is_directory(session, path):
                    return
                raise

        self._call("deleting", key, remove)

    def request_thaw(self, key: str, *, days: int, tier: str) -> Thaw:
        """Nothing to thaw on an SFTP server: ``NOT_NEEDED`` once the object is known to
        exist.

        Raises:
            ObjectNotFound, StorePermanent, StoreTransient: as :meth:`stat`.
        """
        self.stat(key)
        return Thaw.NOT_NEEDED

    def probe(self) -> str:
        """Connect (checking the host key), create the root and its missing parents (mode
        0700) unless it exists, check it is a directory not writable by group or others,
        and write and remove a temporary file in it: ``zbak init`` is where the admin sets
        the store up, the one call that creates the root. The line returned says whether
        the server has ``posix-rename@openssh.com`` and ``fsync@openssh.com``.

        Raises:
            StorePermanent: an unknown or changed host key, the login refused, the root
                cannot be created or written, is not a directory, or is shared.
            StoreTransient: the server did not answer within the retries.
        """
        def check(session: Session) -> str:
            try:
                attrs = session.stat(self.root)
            except SftpStatus as exc:
                if exc.code != SFTP_NO_SUCH_FILE:
                    raise
                _makedirs(session, "/", self.root)
                attrs = session.stat(self.root)
            mode = attrs.st_mode or 0
            if not statmod.S_ISDIR(mode):
                raise StorePermanent(f"store {self.name}: {self.root} on {self._where} is not a"
                                     " directory", store=self.name)
            if mode & 0o022:
                raise StorePermanent(
                    f"store {self.name}: directory {self.root} on {self._where} is writable by"
                    f" group or others (mode {statmod.S_IMODE(mode):04o}): zbak will not"
                    " change its mode; give the store a directory of its own",
                    store=self.name)
            trial = f"{self.root.rstrip('/')}/{temporary_name('zbak-probe')}"
            session.close_handle(session.open_handle(trial, _NEW_FILE, 0o600))
            session.remove(trial)
            return ", ".join(f"{what} {'yes' if ext in session.extensions else 'no'}"
                             for what, ext in (("posix-rename", POSIX_RENAME),
                                               ("fsync", FSYNC)))

        features = self._call("checking", None, check)
        return f"directory {self.root} on {self._where} writable over SFTP ({features})"

    def unfinished_uploads(self, prefix: str = "", *,
                           sizes: bool = True) -> builtins.list[Unfinished]:
        """The temporary files of unfinished puts (``.NAME.partial-XXXXXXXX``, left by a
        process killed mid-put) of keys starting with ``prefix``, each with its length and
        modification time (the listing gives both: ``sizes`` is ignored).

        Raises:
            as :meth:`list`.
        """
        found = [Unfinished(key, name, f"temporary file {name}", attrs.st_size,
                            _mtime(attrs))
                 for key, name, attrs in self._walk_temporaries(prefix)]
        return sorted(found)

    def abort_upload(self, upload: Unfinished) -> bool:
        """Remove the temporary file ``upload.ident`` beside ``upload.key``; False when it is
        gone already.

        Raises:
            StorePermanent: invalid key or name, permission denied.
            StoreTransient: the connection failed beyond the retries.
        """
        if meant_for(upload.ident) != upload.key.rpartition("/")[2]:
            raise StorePermanent(f"store {self.name}: {upload.ident!r} is not a temporary file"
                                 f" of {upload.key!r}", store=self.name, key=upload.key)
        parent = self._path(upload.key).rpartition("/")[0]

        def remove(session: Session) -> bool:
            try:
                session.remove(f"{parent}/{upload.ident}")
            except SftpStatus as exc:
                if exc.code == SFTP_NO_SUCH_FILE:
                    return False
                raise
            return True

        return self._call(f"removing the temporary file {upload.ident} of", upload.key, remove)

    def close(self) -> None:
        """Close the channels and the SSH connection."""
        self._sessions.close()
        self._connection.close()

    # -- put helpers ------------------------------------------------------------------------

    def _create(self, session: Session, key: str, parent: str, temporary: str,
                first: bytearray) -> int:
        """Create the temporary file (and the missing directories below the root), write
        the put's first part into it, and return the file's modification time after its
        creation: the server's clock, which :meth:`_drop_earlier_temporaries` compares with."""
        try:
            handle = session.open_handle(temporary, _NEW_FILE, 0o600)
        except SftpStatus as exc:
            if exc.code != SFTP_NO_SUCH_FILE:
                raise
            self._require_root(session, key)
            _makedirs(session, self.root, parent)
            handle = session.open_handle(temporary, _NEW_FILE, 0o600)
        try:
            began = session.fstat(handle).st_mtime or 0
            session.write_at(handle, 0, first)
        finally:
            session.close_handle(handle)
        return began

    def _finish(self, session: Session, key: str, path: str, temporary: str,
                size: int) -> None:
        """Check the temporary file's size, give it a modification time after the object it
        replaces (so the etag changes), fsync it, and rename it over ``path``."""
        handle = session.open_handle(temporary, SFTP_FLAG_READ | SFTP_FLAG_WRITE)
        try:
            attrs = session.fstat(handle)
            if attrs.st_size != size:
                raise StorePermanent(
                    f"store {self.name}: the server holds {attrs.st_size} bytes of the {size}"
                    f" written to {temporary} for {key!r} on {self._where}", store=self.name,
                    key=key)
            earlier = _mtime_or_none(session, path)
            mtime = attrs.st_mtime or 0
            if earlier is not None and earlier >= mtime:
                session.set_times(handle, earlier + 1, earlier + 1)
            if FSYNC in session.extensions:
                session.fsync(handle)
        finally:
            session.close_handle(handle)
        if POSIX_RENAME in session.extensions:
            session.posix_rename(temporary, path)
            return
        try:
            session.rename(temporary, path)
        except SftpStatus:
            if _mtime_or_none(session, path) is None:
                raise
            session.remove(path)  # SFTP's own rename refuses an existing target
            session.rename(temporary, path)

    def _remove_quietly(self, key: str, temporary: str) -> None:
        """Remove the temporary file of a failed put; a failure is logged (``zbak audit``
        reports the file, the next put of the key removes it)."""
        try:
            self._call("removing the temporary file of", key,
                       lambda s: _remove_if_there(s, temporary))
        except (StorePermanent, StoreTransient) as exc:
            log.warning("store %s: could not remove %s, left by a failed put of %r: %s",
                        self.name, temporary, key, exc)

    def _drop_earlier_temporaries(self, key: str, parent: str, name: str, began: int) -> None:
        """Remove the temporary files of earlier puts of the same key last written before
        this put began (``began``: the server's time when this put created its own, in
        seconds): a put killed mid-write left them, and the key now holds a whole object. A
        put of the same key running elsewhere writes its file all the time and is kept (so
        is one last written in the second this put began). The object is written already,
        so a failure here is only logged: ``zbak audit`` reports what is left. See
        ``docs/decisions.md#leftover-uploads-of-interrupted-archives``."""
        mine = lead(name)

        def drop(session: Session) -> None:
            try:
                entries = session.listdir_attr(parent)
            except SftpStatus as exc:
                if exc.code == SFTP_NO_SUCH_FILE:
                    return
                raise
            for entry in entries:
                if (entry.filename.startswith(mine) and meant_for(entry.filename) == name
                        and (entry.st_mtime or 0) < began):
                    _remove_if_there(session, f"{parent}/{entry.filename}")
                    log.info("store %s: removed %s/%s, left by an interrupted put of the same"
                             " key", self.name, parent, entry.filename)

        try:
            self._call("removing what interrupted puts left of", key, drop)
        except (StorePermanent, StoreTransient) as exc:
            log.warning("store %s: could not remove what an interrupted put of %r left (%s);"
                        " `zbak audit` reports it", self.name, key, exc)

    # -- read helpers -----------------------------------------------------------------------

    def _stat_object(self, session: Session, key: str, path: str) -> SFTPAttributes:
        try:
            attrs = session.stat(path)
        except SftpStatus as exc:
            if exc.code == SFTP_NO_SUCH_FILE:
                raise self._not_found(key) from None
            raise
        if not statmod.S_ISREG(attrs.st_mode or 0):
            raise self._not_found(key)
        return attrs

    def _read(self, key: str, path: str, seen: SFTPAttributes,
              chunk_size: int) -> Iterator[bytes]:
        size = seen.st_size or 0
        offset = 0
        while offset < size:
            window = functools.partial(self._read_window, key=key, path=path, seen=seen,
                                       offset=offset, length=min(READ_WINDOW, size - offset))
            data = self._call("reading", key, window)
            for at in range(0, len(data), chunk_size):
                yield data[at:at + chunk_size]
            offset += len(data)

    def _read_window(self, session: Session, key: str, path: str, seen: SFTPAttributes,
                     offset: int, length: int) -> bytes:
        """``length`` bytes of the object at ``offset``, from a fresh handle whose size and
        time must still be the ones ``get`` saw first."""
        try:
            handle = session.open_handle(path, SFTP_FLAG_READ)
        except SftpStatus as exc:
            if exc.code == SFTP_NO_SUCH_FILE:
                raise self._changed(key) from None
            raise
        try:
            now = session.fstat(handle)
            if (now.st_size, now.st_mtime) != (seen.st_size, seen.st_mtime):
                raise self._changed(key)
            data = session.read_at(handle, offset, length)
        finally:
            session.close_handle(handle)
        if len(data) != length:
            raise self._changed(key)
        return data

    # -- listing helpers --------------------------------------------------------------------

    def _walk(self, prefix: str, skip: frozenset[str]) -> builtins.list[tuple[str, SFTPAttributes]]:
        """``(key, attributes)`` of each regular file whose key starts with ``prefix`` and lies
        under no directory of ``skip``, in no particular order."""
        found: list[tuple[str, SFTPAttributes]] = []
        for rel, entry in self._entries(prefix, skip):
            key = rel + entry.filename
            if (statmod.S_ISREG(entry.st_mode or 0) and key.startswith(prefix)
                    and not (entry.filename[0] == "." and meant_for(entry.filename))):
                found.append((key, entry))
        return found

    def _walk_temporaries(self, prefix: str) -> builtins.list[tuple[str, str, SFTPAttributes]]:
        """``(key, temporary name, attributes)`` of each temporary file whose key starts
        with ``prefix``."""
        found = []
        for rel, entry in self._entries(prefix, frozenset()):
            meant = meant_for(entry.filename) if entry.filename[0] == "." else None
            if meant and statmod.S_ISREG(entry.st_mode or 0) and (rel + meant).startswith(prefix):
                found.append((rel + meant, entry.filename, entry))
        return found

    def _entries(self, prefix: str,
                 skip: frozenset[str]) -> builtins.list[tuple[str, SFTPAttributes]]:
        """``(key prefix of the directory, entry)`` of every entry of the directories
        ``prefix`` can reach, below the directory holding it, that ``skip`` does not name;
        one level at a time, ``concurrency`` directories of a level at once."""
        check_prefix(prefix, store=self.name)
        head = prefix.rpartition("/")[0]
        if under_any(prefix, skip):
            return []
        level = [f"{head}/" if head else ""]
        found: list[tuple[str, SFTPAttributes]] = []
        with concurrent.futures.ThreadPoolExecutor(
                max_workers=self.concurrency, thread_name_prefix=f"zbak-sftp-{self.name}") as pool:
            while level:
                below = []
                for rel, entries in zip(level, pool.map(self._listdir, level), strict=True):
                    every = rel.startswith(prefix)
                    for entry in entries:
                        found.append((rel, entry))
                        sub = f"{rel}{entry.filename}/"
                        if (statmod.S_ISDIR(entry.st_mode or 0) and sub not in skip
                                and (every or sub.startswith(prefix) or prefix.startswith(sub))):
                            below.append(sub)
                level = below
        return found

    def _listdir(self, rel: str) -> builtins.list[SFTPAttributes]:
        """The entries of the directory of key prefix ``rel`` (``""``: the root); none when
        it does not exist (nothing stored there yet, or deleted while listing)."""
        directory = f"{self.root.rstrip('/')}/{rel}".rstrip("/") or "/"

        def listdir(session: Session) -> builtins.list[SFTPAttributes]:
            try:
                return [e for e in session.listdir_attr(directory)
                        if e.filename not in (".", "..")]
            except SftpStatus as exc:
                if exc.code == SFTP_NO_SUCH_FILE:
                    return []
                raise

        return self._call("listing", None, listdir)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def _where(self) -> str:
        return f"{self._connection.host} ({self._connection.where})"

    def _path(self, key: str) -> str:
        check_key(key, store=self.name)
        if meant_for(key.rpartition("/")[2]) is not None:
            raise StorePermanent(
                f"store {self.name}: invalid object key {key!r}: the name looks like a temporary"
                " file of an unfinished write", store=self.name, key=key)
        return f"{self.root.rstrip('/')}/{key}"

    def _require_root(self, session: Session, key: str) -> None:
        try:
            attrs = session.stat(self.root)
        except SftpStatus as exc:
            if exc.code != SFTP_NO_SUCH_FILE:
                raise
            attrs = None
        if attrs is None or not statmod.S_ISDIR(attrs.st_mode or 0):
            raise StorePermanent(
                f"store {self.name}: directory {self.root} does not exist on {self._where}"
                " (create it, or run `zbak init`)", store=self.name, key=key)

    def _call(self, doing: str, key: str | None, fn: Callable[[Session], T]) -> T:
        """``fn(session)`` on a session of the pool, its errors mapped to the store's
        (``_mapped``) and retried under the store's policy while transient."""

        def attempt() -> T:
            try:
                with self._sessions.session() as session:
                    return fn(session)
            except (HostKeyMismatch, HostUnreachable, OSError, EOFError,
                    paramiko.SSHException) as exc:
                raise self._mapped(exc, key, doing) from exc

        return self._retry.call(attempt)

    def _mapped(self, exc: BaseException, key: str | None,
                doing: str) -> StorePermanent | StoreTransient:
        what = f"{doing} {key!r}" if key is not None else f"{doing} {self.root}"
        where = f"store {self.name}: {what} on {self._where}"
        if isinstance(exc, (HostKeyMismatch, LoginRefused)):
            return StorePermanent(f"store {self.name}: {exc}", store=self.name, key=key)
        if isinstance(exc, _Refused):
            return StorePermanent(f"{where}: {exc}", store=self.name, key=key)
        if isinstance(exc, SftpStatus):
            if exc.code == SFTP_NO_SUCH_FILE:
                why = "no such file or directory"
            elif isinstance(exc, PermissionError):
                why = "permission denied: check the owner and mode of the store's directory"
            else:
                why = f"the server answered {exc}"
            return StorePermanent(f"{where}: {why}", store=self.name, key=key)
        return StoreTransient(f"{where}: connection failed: {exc or type(exc).__name__}",
                              store=self.name, key=key)

    def _not_found(self, key: str) -> ObjectNotFound:
        return ObjectNotFound(f"store {self.name}: no object {key!r} in {self.root} on"
                              f" {self._where}", store=self.name, key=key)

    def _changed(self, key: str) -> StorePermanent:
        return StorePermanent(f"store {self.name}: {key!r} was replaced or removed while it was"
                              " read", store=self.name, key=key)


class _Refused(OSError):
    """The server refused an SFTP channel on a connection that stays up (no ``sftp``
    subsystem, or no session allowed at all): not worth retrying."""


class _Sessions:
    """The SFTP sessions of one store on its one connection: at most ``limit`` open at once,
    each used by one thread at a time and kept for the next call.

    A server that allows fewer channels per connection than ``limit`` (sshd_config(5)
    ``MaxSessions``, 10 by default) is used with as many as it allowed.
    """

    def __init__(self, connection: SshConnection, limit: int, name: str):
        self._connection = connection
        self._limit = limit
        self._name = name
        self._idle: list[Session] = []
        self._open = 0
        self._ready = threading.Condition()

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A session for the block; one that failed otherwise than by an error status of
        the server (a lost or timed-out channel) is closed, not kept.

        Raises:
            _Refused: the server refused the first channel while the connection stays up.
            HostKeyMismatch, HostUnreachable, OSError, EOFError, paramiko.SSHException:
                connecting or opening a channel failed.
        """
        session = self._take()
        try:
            yield session
        except (SftpStatus, ZbakError):  # the server answered: the channel is fine
            self._give(session)
            raise
        except BaseException:
            self._drop(session)
            raise
        self._give(session)

    def _take(self) -> Session:
        while True:
            session = self._idle_or_slot()
            if session is not None:
                return session
            try:
                return Session.start(self._connection, REQUEST_TIMEOUT)
            except paramiko.SSHException as exc:
                with self._ready:
                    self._open -= 1
                    self._ready.notify()
                    if not self._connection.connected:
                        raise  # the connection is lost: worth another try later
                    # A channel open refused while others are open is the server's
                    # MaxSessions: wait for one of them. Any other refusal is final.
                    if not isinstance(exc, paramiko.ChannelException) or self._open == 0:
                        raise _Refused(f"the server refused an SFTP session ({exc}): is its"
                                       " sftp subsystem enabled?") from exc
                    self._limit = self._open
                log.info("store %s: the server allows %d SFTP channels at once", self._name,
                         self._limit)
            except BaseException:
                with self._ready:
                    self._open -= 1
                    self._ready.notify()
                raise

    def _idle_or_slot(self) -> Session | None:
        """An idle live session, or None when a new one may be opened (its slot is then
        taken); waits while ``limit`` sessions are in use."""
        with self._ready:
            while True:
                while self._idle:
                    session = self._idle.pop()
                    if _alive(session):
                        return session
                    self._open -= 1
                    with contextlib.suppress(Exception):
                        session.close()
                if self._open < self._limit:
                    self._open += 1
                    return None
                self._ready.wait()

    def _give(self, session: Session) -> None:
        with self._ready:
            self._idle.append(session)
            self._ready.notify()

    def _drop(self, session: Session) -> None:
        with contextlib.suppress(Exception):
            session.close()
        with self._ready:
            self._open -= 1
            self._ready.notify()

    def close(self) -> None:
        """Close every idle session (the backend is not used afterwards)."""
        with self._ready:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for session in idle:
            with contextlib.suppress(Exception):
                session.close()


def _alive(session: Session) -> bool:
    channel = session.get_channel()
    transport = channel.get_transport() if channel is not None else None
    return channel is not None and not channel.closed and transport is not None and (
        transport.is_active())


def _write_file(session: Session, path: str, offset: int, data: bytearray) -> None:
    """Write ``data`` at ``offset`` of the existing file ``path`` (one part of a put)."""
    handle = session.open_handle(path, SFTP_FLAG_WRITE)
    try:
        session.write_at(handle, offset, data)
    finally:
        session.close_handle(handle)


def _makedirs(session: Session, top: str, directory: str) -> None:
    """Create ``directory`` and its missing parents below ``top`` (which exists), mode 0700."""
    missing = []
    while directory.rstrip("/") != top.rstrip("/") and _mtime_or_none(session, directory) is None:
        missing.append(directory)
        directory = directory.rpartition("/")[0] or "/"
    for new in reversed(missing):
        try:
            session.mkdir(new, 0o700)
        except SftpStatus:
            if not _is_directory(session, new):  # made meanwhile by another put
                raise


def _is_directory(session: Session, path: str) -> bool:
    try:
        return statmod.S_ISDIR(session.stat(path).st_mode or 0)
    except SftpStatus:
        return False


def _mtime_or_none(session: Session, path: str) -> int | None:
    """The modification time of ``path``, or None when nothing is there."""
    try:
        return session.stat(path).st_mtime or 0
    except SftpStatus as exc:
        if exc.code == SFTP_NO_SUCH_FILE:
            return None
        raise


def _remove_if_there(session: Session, path: str) -> None:
    try:
        session.remove(path)
    except SftpStatus as exc:
        if exc.code != SFTP_NO_SUCH_FILE:
            raise


def _info(key: str, attrs: SFTPAttributes) -> ObjectInfo:
    """What ``stat`` and ``list`` report of a file: the etag is its modification time (see
    the module docstring)."""
    return ObjectInfo(key, attrs.st_size or 0, "STANDARD", _mtime(attrs), Thaw.NOT_NEEDED,
                      None, None, str(attrs.st_mtime or 0))


def _mtime(attrs: SFTPAttributes) -> dt.datetime:
    return dt.datetime.fromtimestamp(attrs.st_mtime or 0, tz=dt.UTC)


def _key_of(info: ObjectInfo) -> str:
    return info.key
