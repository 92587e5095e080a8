"""Write a tar stream of a snapshot's files into a directory, and nowhere else.

The stream comes from ``tar`` on the host where the snapshot lives (``snapshot_files``), which
may be a backup host zbak trusts less than itself, so every member is checked here as if it
were hostile (docs/decisions.md#restored-files-are-checked-like-a-hostile-archive). Python's
``tarfile`` reads it (``r|``: one pass, nothing spooled) and each member passes a check that
does what its ``data`` filter does for paths (Python docs, tarfile "Extraction filters") but
keeps the snapshot's modes and owners, which that filter would change:

- a member whose name is absolute or has a ``..`` component, or that lies outside the
  requested paths, is refused;
- a symlink whose target is absolute or leads out of DIR, a hard link to a name outside
  the requested paths or whose real path (``os.path.realpath``) is outside DIR, a device
  file, a fifo or a socket is refused;
- the real path (symlinks resolved, ``os.path.realpath``) of every member's directory must
  be inside DIR, so nothing is written through a symlink, whether DIR held it before or the
  stream brought it;
- an existing file is replaced only with ``overwrite`` (it is removed first, so the write
  never goes through a symlink or into another hard link of the inode); an existing
  directory is kept and filled in; a directory in the place of a file is never removed.

Refused members are skipped and listed; the rest is restored. Kept for what is restored:
content, mode (setuid, setgid and sticky bits too), owner and group as numbers (when run as
root; ``tarfile`` changes owners only then), mtime to the nanosecond (the pax ``mtime``
record, read here instead of ``TarInfo.mtime``, a float), symlinks with their own mtime,
hard links, and extended attributes (pax ``SCHILY.xattr.NAME`` records, which ``tarfile``
reads but does not apply; a value is bytes, carried as surrogate escapes). Directories get
their mode, owner and mtime after their content, deepest first (``TarFile.extractall``).
"""

from __future__ import annotations

import copy
import dataclasses
import decimal
import os
import posixpath
import stat
import tarfile
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Protocol, cast

from zrepl_py.errors import RestoreError
from zrepl_py.files.paths import ROOT, member_path, within

if TYPE_CHECKING:
    from _typeshed import StrOrBytesPath

XATTR_PREFIX = "SCHILY.xattr."
"""pax record keyword prefix of an extended attribute (star(1) and GNU tar write it)."""


class Readable(Protocol):
    """A binary stream ``extract`` reads (``SendReader``, a file)."""

    def read(self, size: int, /) -> bytes:
        """Up to ``size`` bytes; b"" at the end."""
        ...


class ExtractError(RestoreError):
    """The stream could not be written into DIR (not a tar stream, a write failed); what
    was written so far stays."""


@dataclasses.dataclass
class Extracted:
    """What ``extract`` did.

    Attributes:
        members: members restored (files, directories, links).
        bytes: bytes of file content written.
        refused: one line per member not restored, with why (the name ``repr``-quoted, so
            a name with a newline stays one line).
        warnings: attributes that could not be set (e.g. an extended attribute the file
            system of DIR does not take), one line each.
    """

    members: int = 0
    bytes: int = 0
    refused: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _ns(pax: Mapping[str, str], fallback: float) -> int:
    """A pax time record (``1700000000.123456789``) in ns, else ``fallback`` seconds."""
    text = pax.get("mtime")
    if text is not None:
        try:
            return int(decimal.Decimal(text).scaleb(9).to_integral_value(decimal.ROUND_FLOOR))
        except decimal.InvalidOperation:
            pass
    return int(fallback * 1_000_000_000)


class _Checked(tarfile.TarFile):
    """``TarFile`` that applies extended attributes and nanosecond mtimes (the module doc).

    ``chown`` runs for every member once it is written (directories: at the end, before
    ``utime`` and ``chmod``), so attributes are set while a read-only file can still be
    written by its owner, and before the mtime (setting an attribute changes only ctime).
    """

    warnings: list[str]

    def chown(self, tarinfo: tarfile.TarInfo, targetpath: StrOrBytesPath,
              numeric_owner: bool) -> None:
        super().chown(tarinfo, targetpath, numeric_owner)
        for key, value in tarinfo.pax_headers.items():
            if not key.startswith(XATTR_PREFIX):
                continue
            name = key[len(XATTR_PREFIX):]
            try:
                os.setxattr(targetpath, name, value.encode("utf-8", "surrogateescape"),
                            follow_symlinks=False)
            except OSError as exc:
                self.warnings.append(f"extended attribute {name!r} of {tarinfo.name!r} not"
                                     f" restored: {exc.strerror or exc}")
        if tarinfo.issym():  # tarfile sets no times on a symlink
            ns = _ns(tarinfo.pax_headers, tarinfo.mtime)
            try:
                os.utime(targetpath, ns=(ns, ns), follow_symlinks=False)
            except OSError as exc:
                self.warnings.append(f"mtime of symlink {tarinfo.name!r} not restored:"
                                     f" {exc.strerror or exc}")

    def utime(self, tarinfo: tarfile.TarInfo, targetpath: StrOrBytesPath) -> None:
        ns = _ns(tarinfo.pax_headers, tarinfo.mtime)
        try:
            os.utime(targetpath, ns=(ns, ns))
        except OSError as exc:
            raise tarfile.ExtractError(f"could not set the mtime of {tarinfo.name!r}:"
                                       f" {exc.strerror or exc}") from exc


@dataclasses.dataclass
class _Check:
    """The member check of the module doc, called on each member as it is read: the member
    to write (renamed to its path in DIR), or None."""

    root: str
    paths: Sequence[str]
    overwrite: bool
    done: Extracted

    def __call__(self, member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = member_path(member.name)
        why = self._refusal(member, name)
        if why is not None:
            self.done.refused.append(f"{member.name!r}: {why}")
            return None
        if name == ROOT:
            return None  # the dataset's root itself is DIR: its attributes stay DIR's
        assert name is not None
        member = copy.copy(member)  # TarInfo.replace is Python 3.11.4's
        member.name = name
        self.done.members += 1
        if member.isreg():
            self.done.bytes += member.size
        return member

    def _refusal(self, member: tarfile.TarInfo, name: str | None) -> str | None:
        """Why ``member`` is not restored, or None; removes a file it may replace."""
        if name is None:
            return "an absolute name or a '..' component"
        if not within(name, self.paths):
            return "outside the requested paths"
        if member.ischr() or member.isblk():
            return "a device file (never restored)"
        if member.isfifo():
            return "a fifo (never restored)"
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            return f"an unsupported member type {member.type!r}"
        if member.issym():
            target = member.linkname
            lands = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
            if target.startswith("/") or lands == ".." or lands.startswith("../"):
                return f"a symlink to {target!r}, which leads out of the directory"
        if member.islnk():
            target_name = member_path(member.linkname)
            if target_name is None or not within(target_name, self.paths):
                return f"a hard link to {member.linkname!r}, outside the restored paths"
            # os.link follows symlinks, and the link's mode, owner and mtime are then set on
            # the inode: through a symlink DIR held before, that would change a file outside.
            source = os.path.realpath(os.path.join(self.root, target_name))
            if not _inside(source, self.root):
                return (f"a hard link to {member.linkname!r}, which leads out of the"
                        f" directory (to {source!r})")
        if name == ROOT:
            return None
        path = os.path.join(self.root, name)
        real_parent = os.path.realpath(os.path.dirname(path))
        if not _inside(real_parent, self.root):
            return f"its directory leads out of the directory (to {real_parent!r})"
        return self._make_room(member, path)

    def _make_room(self, member: tarfile.TarInfo, path: str) -> str | None:
        try:
            there = os.lstat(path)
        except FileNotFoundError:
            return None
        if stat.S_ISDIR(there.st_mode):
            if member.isdir():
                return None  # filled in; its attributes are set at the end
            return "a directory is in its place (zbak never removes a directory)"
        if not self.overwrite:
            return "exists (pass --overwrite to replace it)"
        os.unlink(path)  # replaced, never written through (a symlink, another hard link)
        return None


def extract(stream: Readable, into: str, paths: Sequence[str], *,
            overwrite: bool) -> Extracted:
    """Restore the members of the tar ``stream`` that lie in ``paths`` into the directory
    ``into`` (which must exist), checking each (the module doc).

    Args:
        stream: a readable binary stream (``read(size)``) of a POSIX tar archive.
        into: the directory to write into; resolved (``realpath``) once.
        paths: the requested paths (``files.paths``); a member outside them is refused.
        overwrite: replace existing files (never directories).

    Returns:
        What was restored and refused.

    Raises:
        ExtractError: the stream is not a tar archive, a member could not be written (disk
            full, permission), or an attribute of a directory could not be set.
        Whatever ``stream.read`` raises (e.g. ``PipelineFailed`` of the producing tar).
    """
    root = os.path.realpath(into)
    done = Extracted()
    check = _Check(root, list(paths), overwrite, done)
    try:
        with _Checked.open(fileobj=cast(IO[bytes], stream), mode="r|", errorlevel=2) as archive:
            assert isinstance(archive, _Checked)
            archive.warnings = done.warnings
            checked = (m for m in map(check, archive) if m is not None)
            if hasattr(tarfile, "fully_trusted_filter"):
                # Python 3.11.4+ (PEP 706) filters members itself, and from 3.14 with its
                # "data" filter unless told otherwise, which would change modes and owners.
                archive.extractall(root, checked, numeric_owner=True, filter="fully_trusted")
            else:  # Debian bookworm's 3.11.2: no filters; the members come checked
                archive.extractall(root, checked, numeric_owner=True)
    except tarfile.ReadError as exc:
        raise ExtractError(f"the stream of the files is not a tar archive ({exc}); what"
                           f" was restored before stays in {root}") from exc
    except (tarfile.TarError, OSError) as exc:
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ExtractError(f"restoring into {root} failed: {what}; what was restored"
                           " before stays") from exc
    return done


def drain(stream: Readable, size: int = 1 << 16) -> None:
    """Read ``stream`` to its end (the zero blocks after a tar archive), so its producer
    finishes and its exit status is checked (``SendReader.read`` raises at the end when
    the producer failed)."""
    while stream.read(size):
        pass


def prepare_directory(into: str, paths: Sequence[str], *, overwrite: bool) -> str:
    """Create ``into`` (mode 0700, its parent must exist) when missing; refuse a requested
    path that exists in it without ``overwrite``; return its real path.

    Raises:
        RestoreError: ``into`` is not a directory, its parent is missing, or (without
            ``overwrite``) a requested path exists in it.
    """
    try:
        os.mkdir(into, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RestoreError(f"cannot create --into-dir {into}: {exc.strerror or exc}") from exc
    if not os.path.isdir(into):
        raise RestoreError(f"--into-dir {into} exists and is not a directory")
    root = os.path.realpath(into)
    if not overwrite:
        present = [p for p in paths if p != ROOT and os.path.lexists(os.path.join(root, p))]
        if present:
            raise RestoreError(
                f"{', '.join(repr(p) for p in present)} already in {root}: pass --overwrite"
                " to replace what the snapshot has (directories are filled in, never"
                " removed), or restore into another --into-dir; nothing was read")
    return root

