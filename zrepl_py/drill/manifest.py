"""A snapshot's file manifest: every file, directory and link of one dataset's snapshot with
its metadata and the SHA-256 of its content, and the comparison of two manifests (what a
drill checks: docs/drills.md#what-a-drill-checks).

``walk(root)`` lists a directory tree (a snapshot's read-only view,
``replication.snapshot_view``) without following links or crossing into another file system;
``read(zfs, snapshot, program=...)`` makes the manifest where the snapshot is: in this process
for this machine, else by running ``zbak digest SNAPSHOT`` on the host (served by ``zbak
serve --allow-drill`` itself behind a forced command), whose output ``dump``/``load`` define:
JSON lines, a header ``{"format": "zbak-files/1", "snapshot": NAME}``, one object per entry
and a last line ``{"end": COUNT}``, so a cut output is never taken for a short manifest.

What is compared per path (``compare``, pure): the kind (file, dir, link, other), the
permission bits, owner and group, the size and SHA-256 of a file's content, a link's target,
and the modification time (ZFS sends every one of these: a received snapshot has them
exactly). Paths are relative, ``/``-separated, the bytes of a non-UTF-8 name kept
as surrogate escapes (PEP 383), in byte order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

from zrepl_py.errors import DigestError
from zrepl_py.replication.snapshot_view import remove_dead_views, snapshot_view
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import SnapshotName

FORMAT = "zbak-files/1"
"""The format named in the header line of ``dump``'s output."""
CHUNK = 1 << 20  # bytes read at a time while hashing a file
SHOWN = 10
"""Differences named in a comparison's message; the rest are counted."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One path of a snapshot.

    Attributes:
        path: relative to the snapshot's root, ``/``-separated.
        kind: ``file``, ``dir``, ``link`` or ``other`` (fifo, socket, device).
        mode: the permission bits (``stat.S_IMODE``).
        uid / gid: the owner and group ids.
        size: bytes of a file's content or a link's target; 0 for the others.
        mtime_ns: the modification time (ns since the epoch).
        sha256: hex SHA-256 of a file's content or a link's target; "" for the others.
    """

    path: str
    kind: str
    mode: int
    uid: int
    gid: int
    size: int
    mtime_ns: int
    sha256: str


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def _file_sha256(path: bytes) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _entry(path: bytes, relative: bytes, st: os.stat_result) -> Entry:
    kind = _kind(st.st_mode)
    sha, size = "", 0
    if kind == "file":
        sha, size = _file_sha256(path)
    elif kind == "link":
        target = os.readlink(path)
        sha, size = hashlib.sha256(target).hexdigest(), len(target)
    return Entry(os.fsdecode(relative), kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                 size, st.st_mtime_ns, sha)


def walk(root: str) -> Iterator[Entry]:
    """Every path below ``root`` (not ``root`` itself) in byte order of the path, depth
    first; never follows a link nor enters another file system (a child dataset's
    mountpoint shows as the empty directory it is in this one). A top-level ``.zfs`` (an
    OpenZFS dataset with ``snapdir=visible``) is left out.

    Raises:
        OSError: a path cannot be read.
    """
    top = os.fsencode(root)
    device = os.lstat(top).st_dev

    def below(directory: bytes, relative: bytes) -> Iterator[Entry]:
        with os.scandir(directory) as entries:
            found = sorted(entries, key=lambda e: e.name)
        for item in found:
            if not relative and item.name == b".zfs":
                continue
            path, rel = item.path, (relative + b"/" + item.name if relative else item.name)
            st = os.lstat(path)
            yield _entry(path, rel, st)
            if stat.S_ISDIR(st.st_mode) and st.st_dev == device:
                yield from below(path, rel)

    yield from below(top, b"")


def dump(entries: Iterable[Entry], snapshot: str, out: IO[str]) -> int:
    """Write ``entries`` as ``zbak-files/1`` JSON lines (see the module doc); return how
    many were written."""
    out.write(json.dumps({"format": FORMAT, "snapshot": snapshot}) + "\n")
    count = 0
    for entry in entries:
        out.write(json.dumps(dataclasses.asdict(entry), separators=(",", ":")) + "\n")
        count += 1
    out.write(json.dumps({"end": count}) + "\n")
    out.flush()
    return count


def load(text: str, where: str) -> list[Entry]:
    """Parse ``dump``'s output.

    Raises:
        DigestError: not a ``zbak-files/1`` manifest, a malformed line, or no end line with
            the right count (the output was cut); the message names ``where``.
    """
    lines = text.splitlines()
    if not lines or not lines[0].startswith(f'{{"format": "{FORMAT}"'):
        raise DigestError(f"{where} printed no {FORMAT} manifest (first line:"
                          f" {lines[0][:200] if lines else 'none'!r})")
    try:
        end = json.loads(lines[-1]) if len(lines) > 1 else {}
        entries = [_parsed(json.loads(line)) for line in lines[1:-1]]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DigestError(f"{where} printed a malformed manifest: {exc}") from None
    if end.get("end") != len(entries):
        raise DigestError(f"{where} printed a cut manifest: {len(entries)} entries, its end"
                          f" line says {end.get('end', 'nothing')}")
    return entries


def _parsed(item: dict[str, Any]) -> Entry:
    fields = {f.name: f.type for f in dataclasses.fields(Entry)}
    if set(item) != set(fields):
        raise ValueError(f"an entry has the keys {sorted(item)}")
    entry = Entry(**item)
    if not all(isinstance(getattr(entry, name), str if kind == "str" else int)
               for name, kind in fields.items()):
        raise ValueError(f"an entry has a value of the wrong type: {item}")
    return entry


@contextlib.contextmanager
def _view(zfs: Zfs, snapshot: SnapshotName) -> Iterator[str]:
    """``snapshot_view`` of ``snapshot``, after removing the views a killed run of this
    machine left on its pool (``remove_dead_views``: a drill killed while it compared files)."""
    remove_dead_views(zfs, snapshot.dataset.pool)
    with snapshot_view(zfs, snapshot) as path:
        yield path


def read(zfs: Zfs, snapshot: SnapshotName, *, program: str = "zbak") -> list[Entry]:
    """The manifest of ``snapshot`` on ``zfs``'s host: walked in this process on this
    machine (through ``snapshot_view``), else printed by ``program digest --zfs ZFS
    SNAPSHOT`` run there (``zbak`` on the host, or ``zbak serve --allow-drill`` answering for it).

    Raises:
        DigestError: a path could not be read, or the host's output is not a whole manifest.
        DatasetNotFound, SnapshotViewError, ZfsError, HostUnreachable: from the view or
            the command.
    """
    if zfs.host == "local":
        with _view(zfs, snapshot) as path:
            try:
                return list(walk(path))
            except OSError as exc:
                raise DigestError(f"cannot read {snapshot}'s files: {exc}") from None
    where = f"{program} digest {snapshot} on {zfs.host}"
    done = zfs.executor.run([program, "digest", "--zfs", zfs.zfs, str(snapshot)], check=False)
    if done.returncode != 0:
        raise DigestError(f"{where} failed (exit {done.returncode}):"
                          f" {done.error_text or done.text[-500:]}")
    return load(done.text, where)


def print_manifest(zfs: Zfs, snapshot: SnapshotName, out: IO[str]) -> int:
    """Write the manifest of ``snapshot`` on this machine to ``out`` (what ``zbak digest``
    and ``zbak serve``'s digest verb print); return the entries written.

    Raises:
        DigestError: a path could not be read.
        DatasetNotFound, SnapshotViewError, ZfsError: from the view.
    """
    with _view(zfs, snapshot) as path:
        try:
            return dump(walk(path), str(snapshot), out)
        except OSError as exc:
            raise DigestError(f"cannot read {snapshot}'s files: {exc}") from None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What ``compare`` found.

    Attributes:
        compared: paths of the source's manifest that were compared.
        files: regular files among them.
        differences: one line per differing path, at most ``SHOWN``.
        count: how many paths differ in all (missing, extra or changed).
    """

    compared: int
    files: int
    differences: tuple[str, ...]
    count: int

    @property
    def same(self) -> bool:
        """True when no path differs."""
        return self.count == 0

    def message(self) -> str:
        """``3 path(s) differ: a.bin: content (sha256); ...`` (empty when the same)."""
        if self.same:
            return ""
        more = f"; {self.count - len(self.differences)} more" if self.count > len(self.differences) else ""
        return f"{self.count} path(s) differ: " + "; ".join(self.differences) + more


_FIELDS = (("kind", "kind"), ("sha256", "content (sha256)"), ("size", "size"),
           ("mode", "mode"), ("uid", "owner"), ("gid", "group"), ("mtime_ns", "mtime"))


def compare(source: Sequence[Entry], restored: Sequence[Entry]) -> Comparison:
    """Compare the restored snapshot's manifest with the source's, path by path (pure; see
    the module doc for the fields)."""
    have = {e.path: e for e in restored}
    differences: list[str] = []
    count = 0
    for entry in source:
        other = have.pop(entry.path, None)
        if other is None:
            what = f"{entry.path}: missing from the restored copy"
        else:
            changed = [label for field, label in _FIELDS
                       if getattr(entry, field) != getattr(other, field)]
            if not changed:
                continue
            what = f"{entry.path}: {', '.join(changed)}"
        count += 1
        if len(differences) < SHOWN:
            differences.append(what)
    for path in sorted(have, key=os.fsencode):
        count += 1
        if len(differences) < SHOWN:
            differences.append(f"{path}: only in the restored copy")
    return Comparison(len(source), sum(1 for e in source if e.kind == "file"),
                      tuple(differences), count)

