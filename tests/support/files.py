"""What the file-restore tests compare: a tree's every attribute a restore keeps, read from a
directory, a snapshot (through a clone, zfs-fuse has no .zfs) or a restored copy; and the
tree they restore."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import time
from pathlib import Path

from support.cli import prop, zfs

NEWLINE = "new\nline"
"""A file name with a newline, as a real file system may hold it."""


def xattrs_of(path: Path) -> dict[str, bytes]:
    """The extended attributes of ``path`` (not following a symlink); {} where the file
    system has none (zfs-fuse)."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            return {}
        raise
    return {n: os.getxattr(path, n, follow_symlinks=False) for n in names}


def stat_of(path: Path) -> tuple:
    """``(mode, uid, gid, mtime_ns, symlink target, content, xattrs)`` of ``path`` (lstat)."""
    st = os.lstat(path)
    link = stat.S_ISLNK(st.st_mode)
    xattrs = {} if link else xattrs_of(path)
    return (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns,
            os.readlink(path) if link else None,
            path.read_bytes() if stat.S_ISREG(st.st_mode) else None, xattrs)


def tree_state(root: Path, below: str = "") -> dict[str, tuple]:
    """``{relative path: stat_of}`` of everything below ``root/below`` (``below`` included
    when given)."""
    start = root / below if below else root
    found = {below: stat_of(start)} if below else {}
    for dirpath, dirnames, filenames in os.walk(start):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = stat_of(path)
    return found


def hard_linked(root: Path, *names: str) -> bool:
    """True when ``names`` below ``root`` are one inode."""
    return len({os.lstat(root / n).st_ino for n in names}) == 1


def snapshot_state(snapshot: str, below: str = "") -> dict[str, tuple]:
    """``tree_state`` of a zfs-fuse snapshot's files, read through a temporary clone."""
    pool = snapshot.split("/", 1)[0]
    clone = f"{pool}/cmp-{os.getpid()}-{time.monotonic_ns()}"
    zfs("clone", snapshot, clone)
    try:
        return tree_state(Path(prop(clone, "mountpoint")), below)
    finally:
        for _ in range(20):
            if subprocess.run(["zfs", "destroy", clone], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)


def views_left(pool: str) -> list[str]:
    """zbak's temporary view clones on ``pool`` (none once a run ended)."""
    out = zfs("list", "-H", "-o", "name", "-r", pool)
    return [n for n in out.split() if n.split("/")[-1].startswith("zbak-view-")]


def populate(mount: Path, version: int) -> None:
    """The tree the tests restore, at ``version`` (1, 2, ...): ``home/alice`` (a file with
    hard link and relative symlink, mode 2775), ``home/tool`` (setuid, owned 1234:5678),
    ``home/<name with a newline>``, ``trap/`` (a symlink to /etc/passwd, one up and out);
    mtimes set to whole seconds (zfs-fuse keeps no more)."""
    alice = mount / "home" / "alice"
    alice.mkdir(parents=True, exist_ok=True)
    notes = alice / "notes.txt"
    notes.write_bytes(f"version {version}\n".encode() * 5000)
    if not (alice / "hard").exists():
        os.link(notes, alice / "hard")
        os.symlink("notes.txt", alice / "link")
    tool = mount / "home" / "tool"
    tool.write_bytes(b"#!/bin/sh\necho tool\n")
    os.chown(tool, 1234, 5678)
    os.chmod(tool, 0o4750)
    (mount / "home" / NEWLINE).write_bytes(b"odd name %d" % version)
    os.chmod(alice, 0o2775)
    trap = mount / "trap"
    if not trap.exists():
        trap.mkdir()
        os.symlink("/etc/passwd", trap / "passwd")
        os.symlink("../../..", trap / "up")
        (trap / "plain").write_bytes(b"plain")
    base = 1_600_000_000 + version * 1000
    for offset, path in enumerate((notes, tool, alice, mount / "home")):
        os.utime(path, (base + offset, base + offset))


def rich_tree(root: Path) -> None:
    """A tree with everything a restore keeps, made below ``root`` on a file system with
    extended attributes and nanosecond times: ``home/alice`` (mode 2775, an xattr) with
    ``notes.txt`` (11000 bytes, a binary xattr), its hard link ``hard`` and symlink ``link``;
    ``home/tool`` (setuid, owned 1234:5678); ``home/<name with a newline>``; every mtime
    with nanoseconds."""
    alice = root / "home" / "alice"
    alice.mkdir(parents=True)
    notes = alice / "notes.txt"
    notes.write_bytes(b"dear diary\n" * 1000)
    os.setxattr(notes, "user.binary", b"\x00\xff\n\x80zbak")
    os.setxattr(alice, "user.dir", b"d")
    os.link(notes, alice / "hard")
    os.symlink("notes.txt", alice / "link")
    tool = root / "home" / "tool"
    tool.write_bytes(b"#!/bin/sh\n")
    os.chown(tool, 1234, 5678)
    os.chmod(tool, 0o4750)
    (root / "home" / NEWLINE).write_bytes(b"odd name")
    os.chmod(alice, 0o2775)
    for path, ns in ((notes, 981_173_106_123_456_789), (tool, 1_000_000_000_000_000_001),
                     (alice, 1_500_000_000_999_999_999)):
        os.utime(path, ns=(ns, ns))
    os.utime(alice / "link", ns=(5, 1_600_000_000_000_000_007), follow_symlinks=False)
