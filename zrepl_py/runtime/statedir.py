"""The state directory: private (0700) whatever the umask, as docs/reliability.md#r41-file-modes
asks, and its small state files written atomically (the catalog high-water marks,
docs/reliability.md#r25-catalog-rollback-detection)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from zrepl_py.errors import UnsafeDirectory


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents mode 0700, and make ``path`` 0700; return it.

    ``Path.mkdir(parents=True)`` would create the parents with the umask's mode (0777 under
    umask 000), so each missing level is made and chmod-ed here. An existing ``path`` that is
    shared (see ``refuse_shared``) is refused, never chmod-ed: another user's files may be in
    it (docs/decisions.md#a-shared-state-directory-is-refused).

    Raises:
        UnsafeDirectory: ``path`` exists, writable by group or others or not owned by us.
        OSError: when a directory cannot be created or chmod-ed.
    """
    missing = []
    level = path
    while not level.is_dir():
        missing.append(level)
        level = level.parent
    if not missing:
        refuse_shared(path)
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)
        os.chmod(directory, 0o700)
    os.chmod(path, 0o700)
    return path


def refuse_shared(path: Path) -> None:
    """Raise ``UnsafeDirectory`` when directory ``path`` is writable by group or others
    (e.g. 1777, like /tmp) or owned by another user than this process's effective one."""
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022 or info.st_uid != os.geteuid():
        raise UnsafeDirectory(
            f"{path} is shared (mode {mode:04o}, owner uid {info.st_uid}): zbak keeps its catalog,"
            " locks and host keys there and will not change its mode; point state_dir at a"
            " directory of its own (it is created 0700)")


def write_private_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably, mode 0600, creating its parent
    directories 0700: a temporary file in the same directory is written, fsync-ed and renamed
    over ``path`` (rename(2) is atomic), then the directory is fsync-ed, so a crash leaves the
    old or the new content, never a mix.

    Raises:
        OSError: the file or its directories cannot be written.
    """
    parent = ensure_private_dir(path.parent)
    tmp = parent / f".{path.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
