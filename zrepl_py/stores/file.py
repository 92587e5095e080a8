"""``file:///dir``: a store that is a plain local directory (a mounted disk, NFS, a NAS share).

Each key is a file under the root (``streams/a/b.zst`` is ``ROOT/streams/a/b.zst``). An object
is written to a hidden temporary file next to its final name (``.NAME.partial-XXXXXXXX``),
fsync'ed, renamed over the key with ``os.replace`` (atomic on POSIX: rename(2)) and the
directory fsync'ed, so after a crash a key holds the old object or the new one, never a torn
file; ``list`` never shows temporary files. A process killed mid-put leaves its temporary
file: the next put of the same key removes it, ``unfinished_uploads`` lists the others (``zbak
audit`` reports them, ``zbak audit --repair`` removes the old ones). Objects are created mode
0600 (``mkstemp``): backup streams are readable by the backing-up user only.

Everything is ``STANDARD`` here: the storage class asked for is accepted and ignored, and no
object ever needs a thaw. Every ``OSError`` is permanent (retrying a full disk or a permission
problem does not help); the message says what to fix.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime as dt
import errno
import hashlib
import logging
import os
import stat as statmod
import tempfile
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

from zrepl_py.errors import ObjectNotFound, StorePermanent, UnsafeDirectory
from zrepl_py.runtime.behind import Behind
from zrepl_py.runtime.statedir import ensure_private_dir
from zrepl_py.stores.base import Backend, ObjectInfo, PutResult, Thaw, Unfinished, under_any
from zrepl_py.stores.keys import check_key, check_prefix
from zrepl_py.stores.temporaries import lead, meant_for

_T = TypeVar("_T")
log = logging.getLogger(__name__)

WRITE_DEPTH = 2
"""Chunks ``put`` has taken and not yet written (or hashed) before it waits for its writer
(or hasher) thread (see ``put``)."""
WRITEBACK_STEP = 16 << 20
"""Bytes ``put`` writes before it asks the kernel to start writing them to the disk."""


class FileBackend(Backend):
    """A store in the local directory ``root`` (absolute; it must exist).

    Args:
        name: the store's name in the config, for messages.
        root: the store's directory. It is never created here: a missing root is usually an
            unmounted disk, and writing to the mount point would fill the root filesystem.

    Raises:
        StorePermanent: ``root`` is not absolute.
    """

    def __init__(self, name: str, root: Path):
        root = Path(root)
        if not root.is_absolute():
            raise StorePermanent(f"store {name}: directory {root} is not absolute", store=name)
        self.name = name
        self.root = root
        self.url = f"file://{root}"

    def __repr__(self) -> str:
        return f"FileBackend({self.name!r}, {str(self.root)!r})"

    # -- Backend ----------------------------------------------------------------------------

    def put(self, key: str, chunks: Iterable[bytes], *,
            storage_class: str = "STANDARD") -> PutResult:
        """Write ``chunks`` to a temporary file, fsync it, rename it over ``key``, fsync the
        directory. Missing directories below the root are created (and their parents fsync'ed).
        On any failure, the exception from ``chunks`` included, the temporary file is removed
        and an earlier object under ``key`` is untouched. ``storage_class`` is ignored (the
        result says ``STANDARD``).

        Each chunk is written in a writer thread and hashed (SHA-256) in a hasher thread,
        both in order, while this thread takes the next chunks from ``chunks``
        (``runtime.behind``): an archive's compression goes on while its last output is
        written and hashed, on the other CPUs
        (docs/decisions.md#archive-at-the-speed-of-the-pipe-within-200-mib). Every
        ``WRITEBACK_STEP`` bytes the writer asks the kernel to start writing them out
        (``posix_fadvise(2)`` ``POSIX_FADV_DONTNEED``, as PostgreSQL does where
        ``sync_file_range`` is missing), so the disk works while the stream is still
        compressed, and the fsync, still the only proof that the object is durable, has little
        left to wait for: a 512 MiB volume's fsync took 0.22 s after plain writes, 0.01 s after
        these (the pages also leave the page cache once written: an archived volume is not read
        again soon). Memory: up to ``WRITE_DEPTH`` + 1 chunks; the chunks must not change once
        yielded.

        Raises:
            StorePermanent: invalid key, root missing, no space left (ENOSPC/EDQUOT),
                permission denied, the key is a directory, any other OS error.
            whatever iterating ``chunks`` raises.
        """
        path = self._path(key)
        self._require_root(key)
        began = time.time_ns()
        try:
            self._makedirs(path.parent)
            fd, tmp = tempfile.mkstemp(prefix=lead(path.name), dir=path.parent)
        except OSError as exc:
            raise self._os_error(exc, key, "creating the temporary file for") from exc
        digest = hashlib.sha256()
        size = 0
        out = _Writer(fd, lambda exc: self._os_error(exc, key, "writing"))
        try:
            with Behind("store-write", depth=WRITE_DEPTH) as writer, \
                    Behind("sha256-stored", depth=WRITE_DEPTH) as hasher:
                for chunk in chunks:  # the caller's own errors pass through unmapped
                    writer.submit(out.write, chunk)
                    hasher.submit(digest.update, chunk)
                    size += len(chunk)
                writer.drain()
                hasher.drain()
            try:
                os.fsync(fd)
                out.close()
                os.replace(tmp, path)
                _fsync_dir(path.parent)
            except OSError as exc:
                raise self._os_error(exc, key, "writing") from exc
        except BaseException:
            with contextlib.suppress(OSError):
                out.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._drop_earlier_temporaries(path, began)
        return PutResult(size=size, sha256=digest.hexdigest(), storage_class="STANDARD")

    def _drop_earlier_temporaries(self, path: Path, began: int) -> None:
        """Remove the temporary files of earlier puts of the same key last written before
        this put began (``began``: ``time.time_ns()``): a put killed mid-write left them,
        and the key now holds a whole object. A put of the same key running in another
        process writes its file all the time and is kept. The object is written already,
        so a failure here is only logged: ``zbak audit`` reports what is left. See
        ``docs/decisions.md#leftover-uploads-of-interrupted-archives``."""
        mine = lead(path.name)
        try:
            with os.scandir(path.parent) as entries:
                for entry in entries:
                    if (entry.name.startswith(mine) and meant_for(entry.name) == path.name
                            and entry.stat(follow_symlinks=False).st_mtime_ns < began):
                        os.unlink(entry.path)
                        log.info("store %s: removed %s, left by an interrupted put of the"
                                 " same key", self.name, entry.path)
        except FileNotFoundError:
            pass  # removed meanwhile by another cleaner
        except OSError as exc:
            log.warning("store %s: could not remove what an interrupted put of %s left (%s);"
                        " `zbak audit` reports it", self.name, path, exc)

    def get(self, key: str, *, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Open the file now (so a missing key raises here, before any byte) and return an
        iterator of its bytes in chunks of at most ``chunk_size`` bytes.

        Raises:
            ObjectNotFound: no file under ``key`` (or it is a directory).
            StorePermanent: invalid key, permission denied, read error (also while iterating).
        """
        path = self._path(key)
        try:
            handle = open(path, "rb")  # closed by _read
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise self._not_found(key) from exc
        except OSError as exc:
            raise self._os_error(exc, key, "opening") from exc
        return self._read(handle, key, chunk_size)

    def stat(self, key: str) -> ObjectInfo:
        """Size and mtime of the file under ``key``; always ``STANDARD``, ``NOT_NEEDED``, and
        no ``sha256`` (a directory keeps no checksum beside the bytes: re-read them).

        Raises:
            ObjectNotFound: no regular file under ``key``.
            StorePermanent: invalid key, permission denied.
        """
        path = self._path(key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise self._not_found(key) from exc
        except OSError as exc:
            raise self._os_error(exc, key, "reading the metadata of") from exc
        if not statmod.S_ISREG(st.st_mode):
            raise self._not_found(key)
        return _info(key, st)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield the regular files whose key starts with ``prefix``, sorted by key (code-point
        order, the same as S3's UTF-8 byte order); temporary files of unfinished puts are
        skipped, and so are symbolic links to directories (never followed). Only the
        directory holding the prefix is walked, and below it only directories the prefix
        can reach.

        One ``scandir`` per directory and one ``stat`` per file; 308,000 objects in 100,000
        stream directories take about 2 s of CPU here, half of it the kernel's (``find
        -printf`` needs 1.6 s), against 4.5 s through ``os.walk`` and ``Path``.

        Raises:
            StorePermanent: invalid prefix; a directory cannot be read.
        """
        return self.list_outside(prefix, ())

    def list_outside(self, prefix: str, skip: Collection[str]) -> Iterator[ObjectInfo]:
        """:meth:`list` without the objects under the directories ``skip`` names (key
        prefixes ending in ``/``), which are never read (``Backend.list_outside``).

        Raises:
            StorePermanent: invalid prefix; a directory cannot be read.
        """
        found: list[ObjectInfo] = self._walk(prefix, _info, frozenset(skip))
        found.sort(key=_key_of)
        return iter(found)

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """``{key: stored bytes}`` of the files :meth:`list` yields, from the same walk
        without building an :class:`ObjectInfo` (and its time and etag) per file.

        Raises:
            StorePermanent: as :meth:`list`.
        """
        return dict(self._walk(prefix, _size, frozenset()))

    def _walk(self, prefix: str, make: Callable[..., _T],
              skip: frozenset[str], *, temporaries: bool = False) -> builtins.list[_T]:
        """``make(key, stat)`` of each regular file whose key starts with ``prefix`` and
        lies under no directory of ``skip``, in no particular order (``list_outside`` and
        ``sizes``). With ``temporaries``, of each temporary file instead, ``make`` given
        the file's name and the key it was meant for (``unfinished_uploads``).

        Raises:
            StorePermanent: invalid prefix; a directory cannot be read.
        """
        check_prefix(prefix, store=self.name)
        head, _, _ = prefix.rpartition("/")
        found: list[_T] = []
        if not under_any(prefix, skip):
            self._scan(self.root / head if head else self.root, f"{head}/" if head else "",
                       prefix, found, make, skip, temporaries)
        return found

    def _scan(self, directory: Path | str, rel: str, prefix: str, found: builtins.list[_T],
              make: Callable[..., _T], skip: frozenset[str], temporaries: bool) -> None:
        """Add ``make(key, stat)`` of the files under ``directory`` (key prefix ``rel``)
        that start with ``prefix`` to ``found`` (with ``temporaries``: ``make(name, key,
        stat)`` of the temporary files whose key does); recurse into subdirectories the
        prefix can reach and ``skip`` does not name. Written for speed: it runs once per
        object of a store (docs/decisions.md#catalog-commands-stay-fast-at-100000-streams);
        looking for temporary files stats no other file."""
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return  # nothing there (yet), or deleted while listing
        except OSError as exc:
            raise self._os_error(exc, None, "listing") from exc
        every = rel.startswith(prefix)  # then each key below starts with it too
        regular = statmod.S_ISREG
        for entry in entries:
            name = entry.name
            key = rel + name
            try:
                if entry.is_dir(follow_symlinks=False):
                    sub = key + "/"
                    if (every or sub.startswith(prefix) or prefix.startswith(sub)) and (
                            sub not in skip):
                        self._scan(entry.path, sub, prefix, found, make, skip, temporaries)
                    continue
                temporary = meant_for(name) if name[0] == "." else None
                if temporaries:
                    if temporary and (every or (rel + temporary).startswith(prefix)):
                        st = entry.stat()
                        if regular(st.st_mode):
                            found.append(make(name, rel + temporary, st))
                    continue
                if temporary or (not every and not key.startswith(prefix)):
                    continue
                st = entry.stat()
            except FileNotFoundError:
                continue  # deleted while listing
            except OSError as exc:
                raise self._os_error(exc, key, "reading the metadata of") from exc
            if regular(st.st_mode):
                found.append(make(key, st))

    def delete(self, key: str) -> None:
        """Remove the file under ``key`` and fsync its directory; a missing key is fine.
        Emptied directories are left in place.

        Raises:
            StorePermanent: invalid key, permission denied.
        """
        path = self._path(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except OSError as exc:
            raise self._os_error(exc, key, "deleting") from exc
        with contextlib.suppress(OSError):
            _fsync_dir(path.parent)

    def request_thaw(self, key: str, *, days: int, tier: str) -> Thaw:
        """Nothing to thaw in a directory: ``NOT_NEEDED`` once the object is known to exist.

        Raises:
            ObjectNotFound, StorePermanent: as :meth:`stat`.
        """
        self.stat(key)
        return Thaw.NOT_NEEDED

    def probe(self) -> str:
        """Create the root and its missing parents (mode 0700) unless it exists, and check
        it is writable: ``zbak init`` is where the admin sets the store up, the one call
        that creates the root (``runtime.statedir.ensure_private_dir``).

        Raises:
            StorePermanent: the root cannot be created, is shared (writable by others or
                owned by another user: it is never chmod-ed then), or is not writable.
        """
        try:
            ensure_private_dir(self.root)
        except UnsafeDirectory:
            raise StorePermanent(
                f"store {self.name}: directory {self.root} is shared (writable by group or"
                " others, or owned by another user): zbak will not change its mode; give the"
                " store a directory of its own", store=self.name) from None
        except OSError as exc:
            raise StorePermanent(f"store {self.name}: cannot create directory {self.root}:"
                                 f" {exc.strerror}", store=self.name) from None
        if not os.access(self.root, os.W_OK):
            raise StorePermanent(f"store directory {self.root} is not writable", store=self.name)
        return f"directory {self.root} writable"

    def unfinished_uploads(self, prefix: str = "", *, sizes: bool = True) -> builtins.list[Unfinished]:
        """The temporary files of unfinished puts (``.NAME.partial-XXXXXXXX``, left by a
        process killed mid-put) of keys starting with ``prefix``, each with its length and
        mtime; only the directories ``prefix`` can reach are walked. ``sizes`` is ignored
        (a ``stat`` gives both).

        Raises:
            StorePermanent: invalid prefix; a directory cannot be read.
        """
        return sorted(self._walk(prefix, _unfinished, frozenset(), temporaries=True))

    def abort_upload(self, upload: Unfinished) -> bool:
        """Remove the temporary file ``upload.ident`` next to ``upload.key``; False when it
        is gone already.

        Raises:
            StorePermanent: invalid key or name, permission denied.
        """
        if meant_for(upload.ident) != upload.key.rpartition("/")[2]:
            raise StorePermanent(f"store {self.name}: {upload.ident!r} is not a temporary file"
                                 f" of {upload.key!r}", store=self.name, key=upload.key)
        try:
            os.unlink(self._path(upload.key).with_name(upload.ident))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._os_error(exc, upload.key,
                                 f"removing the temporary file {upload.ident} of") from exc
        return True

    def local_path(self, key: str) -> Path:
        """The file of ``key`` (whether or not it exists).

        Raises:
            StorePermanent: invalid key.
        """
        return self._path(key)

    # -- helpers ----------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        check_key(key, store=self.name)
        if meant_for(key.rpartition("/")[2]) is not None:
            raise StorePermanent(
                f"store {self.name}: invalid object key {key!r}: the name looks like a temporary"
                " file of an unfinished write", store=self.name, key=key)
        return self.root / key

    def _require_root(self, key: str) -> None:
        if not self.root.is_dir():
            raise StorePermanent(
                f"store {self.name}: directory {self.root} does not exist or is not a directory"
                " (create it, or mount the disk it lives on)", store=self.name, key=key)

    def _makedirs(self, directory: Path) -> None:
        missing: list[Path] = []
        while directory != self.root and not directory.is_dir():
            missing.append(directory)
            directory = directory.parent
        for new in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(new)
            _fsync_dir(new.parent)

    def _read(self, handle: BinaryIO, key: str, chunk_size: int) -> Iterator[bytes]:
        with handle:
            while True:
                try:
                    chunk = handle.read(chunk_size)
                except OSError as exc:
                    raise self._os_error(exc, key, "reading") from exc
                if not chunk:
                    return
                yield chunk

    def _not_found(self, key: str) -> ObjectNotFound:
        return ObjectNotFound(f"store {self.name}: no object {key!r} in {self.root}",
                              store=self.name, key=key)

    def _os_error(self, exc: OSError, key: str | None, doing: str) -> StorePermanent:
        what = f"{doing} {key!r}" if key is not None else f"{doing} {self.root}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why = (f"no space left on the device (or quota) of {self.root}: free space,"
                   " or move the store")
        elif isinstance(exc, PermissionError):
            why = f"permission denied on {exc.filename or self.root}: check owner and mode"
        elif isinstance(exc, (IsADirectoryError, NotADirectoryError)):
            why = f"a directory and an object clash at {exc.filename}"
        else:
            why = f"{exc.strerror or exc} ({exc.filename or self.root})"
        return StorePermanent(f"store {self.name}: {what}: {why}", store=self.name, key=key)


def _info(key: str, st: os.stat_result) -> ObjectInfo:
    """What ``stat`` reports of a file. The etag (inode, mtime, ctime) changes whenever the
    file is replaced or written: ``zbak audit`` trusts a manifest stamp while it stays."""
    return ObjectInfo(key, st.st_size, "STANDARD", _mtime(st), Thaw.NOT_NEEDED, None, None,
                      f"{st.st_ino}.{st.st_mtime_ns}.{st.st_ctime_ns}")


def _mtime(st: os.stat_result) -> dt.datetime:
    return dt.datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=dt.UTC)


def _unfinished(name: str, key: str, st: os.stat_result) -> Unfinished:
    return Unfinished(key, name, f"temporary file {name}", st.st_size, _mtime(st))


def _size(key: str, st: os.stat_result) -> tuple[str, int]:
    return key, st.st_size


def _key_of(info: ObjectInfo) -> str:
    return info.key


_FADVISE = hasattr(os, "posix_fadvise")  # not on macOS


class _Writer:
    """The temporary file of a ``put``: writes whole chunks (``write(2)`` may write less)
    and starts the disk writes every ``WRITEBACK_STEP`` bytes (see ``FileBackend.put``).

    Args:
        fd: the file, open for writing; closed by :meth:`close`.
        mapped: turns an ``OSError`` of a write into the error to raise.
    """

    def __init__(self, fd: int, mapped: Callable[[OSError], Exception]):
        self._file = open(fd, "wb", buffering=0)  # closed by close()
        self._mapped = mapped
        self._written = 0
        self._started = 0  # bytes whose writeback was started

    def write(self, chunk: bytes) -> None:
        """Write all of ``chunk``.

        Raises:
            what ``mapped`` makes of an ``OSError``.
        """
        view = memoryview(chunk)
        try:
            while view:
                view = view[self._file.write(view):]
        except OSError as exc:
            raise self._mapped(exc) from exc
        self._written += len(chunk)
        if self._written - self._started >= WRITEBACK_STEP and _FADVISE:
            with contextlib.suppress(OSError):  # only a hint: the fsync makes it durable
                os.posix_fadvise(self._file.fileno(), self._started,
                                 self._written - self._started, os.POSIX_FADV_DONTNEED)
            self._started = self._written

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def _fsync_dir(directory: Path) -> None:
    """fsync a directory so a rename or unlink in it survives a crash (fsync(2) NOTES)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
