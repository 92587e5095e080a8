"""Read a snapshot's files where the snapshot lives, through any executor.

The same functions serve a dataset on this machine (``LocalExecutor``), a host zbak logs in
to (``SSHExecutor``) and ``zbak serve``'s own host (its file verbs run them with a
``LocalExecutor``, ``serve.files``), so every way of reading files reads them alike. The
directory they read is a snapshot view (``replication.snapshot_view``: ``.zfs/snapshot/NAME``
or a temporary clone). Programs used, all in Debian's essential set or coreutils:

- GNU ``find -P A B ... -maxdepth 0 -printf FORMAT``: what each path is, without following
  a symlink (find(1) ``-P``; ``%y`` type, ``%s`` size, ``%T@`` mtime with nanoseconds,
  ``%l`` a symlink's target, ``%p`` the path), records ended by NUL bytes so any name
  survives;
- ``sha256sum -z -b``: a file's SHA-256 (``-z`` ends the line with NUL and leaves the name
  unescaped, coreutils 8.30 and later);
- GNU ``tar --create --format=posix --xattrs --xattrs-include=*``: the files as a POSIX
  (pax) tar stream with modes, numeric owners, mtimes with nanoseconds, symlinks, hard
  links and extended attributes (``SCHILY.xattr.NAME`` records; tar(1), "--xattrs"); it
  never follows a symlink below a path and stays on the view's file system
  (``--one-file-system``), so child datasets are not read.

A path is read only when every directory it is reached through is a real directory in the
snapshot: a symlink there (``link -> /etc``) would make ``tar`` or ``sha256sum`` read the
host's own files instead of the snapshot's (docs/decisions.md#a-file-path-is-relative-to-the-dataset).
"""

from __future__ import annotations

import contextlib
import dataclasses
import decimal
import posixpath
import re
from collections.abc import Collection, Iterator, Sequence

from zrepl_py.errors import CommandFailed, RestoreError
from zrepl_py.files.paths import ROOT, parents
from zrepl_py.files.versions import ABSENT, FileState
from zrepl_py.proc.executor import Executor
from zrepl_py.replication.snapshot_view import snapshot_view
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.model import SnapshotInfo
from zrepl_py.zfs.names import DatasetName, SnapshotName

TAR = "tar"
FIND = "find"
SHA256SUM = "sha256sum"
KINDS = {"f": "file", "d": "directory", "l": "symlink", "b": "block device",
         "c": "character device", "p": "fifo", "s": "socket", "D": "door"}
"""find's ``%y`` letters and the words zbak shows for them."""

_FIELDS = 5  # %y %s %T@ %l %p, each ended by NUL
_HASH = re.compile(r"[0-9a-f]{64}")


class PathUnreadable(RestoreError):
    """A PATH is not in the snapshot, or is reached through something that is not a
    directory there (a symlink, a file); nothing was read."""


@dataclasses.dataclass(frozen=True)
class Stat:
    """What a path is in a snapshot (``find -P``: never follows a symlink).

    Attributes:
        kind: a word of ``KINDS`` (``file``, ``directory``, ``symlink``, ...).
        size: bytes (``st_size``).
        mtime_ns: modification time, nanoseconds since the epoch (UTC).
        target: a symlink's target, else "".
    """

    kind: str
    size: int = 0
    mtime_ns: int = 0
    target: str = ""


def tar_argv(view: str, paths: Sequence[str]) -> list[str]:
    """The ``tar`` that writes ``paths`` (relative, ``files.paths``) of the directory
    ``view`` to stdout as a POSIX tar stream (see the module doc)."""
    return [TAR, "--create", "--file=-", "--format=posix", "--xattrs", "--xattrs-include=*",
            "--numeric-owner", "--one-file-system", "-C", view, "--", *paths]


def _absolute(view: str, path: str) -> str:
    return view if path == ROOT else posixpath.join(view, path)


def stat_paths(executor: Executor, view: str, paths: Sequence[str]) -> dict[str, Stat]:
    """``{path: Stat}`` of each of ``paths`` (relative to ``view``) that exists, in one
    ``find`` on ``executor``'s host; a path that does not exist is left out.

    Raises:
        CommandFailed: find failed for another reason than a missing path, or printed
            something that is not its records.
    """
    absolute = {_absolute(view, p): p for p in paths}
    done = executor.run([FIND, "-P", *absolute, "-maxdepth", "0", "-printf",
                         "%y\\0%s\\0%T@\\0%l\\0%p\\0"], check=False)
    fields = done.text.split("\0")
    found: dict[str, Stat] = {}
    if len(fields) % _FIELDS != 1 or fields[-1]:
        raise CommandFailed(list(done.argv), done.returncode,
                            f"unexpected find output: {done.text[-200:]!r}", executor.host)
    for i in range(0, len(fields) - 1, _FIELDS):
        kind, size, mtime, target, where = fields[i:i + _FIELDS]
        if where not in absolute or not size.isdigit():
            raise CommandFailed(list(done.argv), done.returncode,
                                f"unexpected find record for {where!r}", executor.host)
        found[absolute[where]] = Stat(KINDS.get(kind, kind), int(size), _nanoseconds(mtime),
                                      target)
    if done.returncode != 0 and len(found) == len(absolute):
        raise CommandFailed(list(done.argv), done.returncode, done.error_text, executor.host)
    return found


def _nanoseconds(text: str) -> int:
    """find's ``%T@`` (``1700000000.1234567890``: seconds, a point, 10 digits) in ns."""
    try:
        return int(decimal.Decimal(text).scaleb(9).to_integral_value(decimal.ROUND_FLOOR))
    except decimal.InvalidOperation:
        return 0


def readable(executor: Executor, view: str, paths: Sequence[str], snapshot: str) -> dict[str, Stat]:
    """Check that each of ``paths`` exists in the view of ``snapshot`` and is reached through
    real directories only; return their ``Stat``.

    Raises:
        PathUnreadable: one is missing or reached through a symlink or a file (every such
            path named, with what is in the way).
        CommandFailed: see ``stat_paths``.
    """
    wanted = sorted({q for p in paths for q in (*parents(p), p)})
    stats = stat_paths(executor, view, wanted)
    problems = []
    for path in paths:
        blocked = next((q for q in parents(path) if q in stats and stats[q].kind != "directory"),
                       None)
        if blocked is not None:
            what = stats[blocked]
            shown = f"{what.kind} -> {what.target}" if what.target else what.kind
            problems.append(f"{path!r} is reached through {blocked!r}, a {shown} in"
                            f" @{snapshot}: name the {what.kind} itself, or the path it"
                            " points to")
        elif path not in stats:
            problems.append(f"{path!r} is not in @{snapshot}")
    if problems:
        raise PathUnreadable("; ".join(problems) + "; nothing was read")
    return {p: stats[p] for p in paths}


def sha256_of(executor: Executor, view: str, path: str) -> str:
    """The SHA-256 (hex) of the file ``path`` in ``view``, computed on its host.

    Raises:
        CommandFailed: sha256sum failed (unreadable file) or printed no hash.
    """
    done = executor.run([SHA256SUM, "-z", "-b", "--", _absolute(view, path)])
    digest = done.text[:64]
    if not _HASH.fullmatch(digest):
        raise CommandFailed(list(done.argv), done.returncode,
                            f"unexpected sha256sum output {done.text[:80]!r}", executor.host)
    return digest


@contextlib.contextmanager
def tar_of(zfs: Zfs, snapshot: SnapshotName, paths: Sequence[str]) -> Iterator[list[str]]:
    """While the block runs, a view of ``snapshot`` exists on ``zfs``'s host and every one
    of ``paths`` is readable in it (``readable``); yields the ``tar`` argv to run there.

    Raises:
        PathUnreadable: a path is missing or reached through a non-directory.
        SnapshotViewError, DatasetNotFound, ZfsError, CommandFailed: from the view and find.
    """
    with snapshot_view(zfs, snapshot) as view:
        readable(zfs.executor, view, paths, snapshot.short)
        yield tar_argv(view, paths)


def file_states(zfs: Zfs, dataset: DatasetName, path: str,
                guids: Collection[int] = ()) -> Iterator[FileState]:
    """``path``'s state in each snapshot of ``dataset`` on ``zfs``'s host (only those whose
    guid is in ``guids``, when given), oldest first (createtxg): one view per snapshot,
    made and removed in turn. A path missing from a snapshot, or reached there through
    something that is not a directory, is ``ABSENT``.

    Raises:
        DatasetNotFound: the dataset does not exist.
        SnapshotViewError, ZfsError, CommandFailed: from the views, find and sha256sum.
    """
    snapshots = zfs.tree(dataset, recursive=False).snapshots(dataset)
    for snap in snapshots:
        if guids and snap.guid not in guids:
            continue
        with snapshot_view(zfs, snap.name) as view:
            yield _state(zfs.executor, view, path, snap)


def _state(executor: Executor, view: str, path: str, snap: SnapshotInfo) -> FileState:
    stats = stat_paths(executor, view, [*parents(path), path])
    blocked = any(stats.get(q, Stat("")).kind != "directory" for q in parents(path))
    found = stats.get(path)
    if found is None or blocked:
        return FileState(snap.short, snap.guid, ABSENT)
    digest = sha256_of(executor, view, path) if found.kind == "file" else ""
    return FileState(snap.short, snap.guid, found.kind, found.size, found.mtime_ns, digest,
                     found.target)
