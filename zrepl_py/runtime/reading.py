"""Read the small files an admin points zbak at (the config, secret files, age identity
and recipients files) safely.

Only a regular file is read, and at most ``limit`` bytes of it
(docs/decisions.md#bad-input-is-one-line-and-its-exit-code): a FIFO would block the command forever
and ``/dev/zero`` would fill memory. The file is opened with ``O_NONBLOCK`` so that even opening a
FIFO with no writer returns at once, then checked with ``fstat`` on the descriptor that is read (no
window between the check and the read).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CONFIG_LIMIT = 1024 * 1024
"""Bytes a config file may have (1 MiB: the longest example config is under 10 KiB)."""
SECRET_LIMIT = 64 * 1024
"""Bytes a secret file may have (64 KiB: a password, token or URL)."""


def open_to_others(path: str | os.PathLike[str]) -> int | None:
    """The permission bits of ``path`` when every user may read it (``o+r``), else None
    (also when it cannot be stat-ed: reading it reports that)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None
    return mode if mode & stat.S_IROTH else None


class NotReadable(OSError):
    """The path is not a regular file, or is larger than allowed; ``strerror`` says which."""


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """Return the bytes of the regular file at ``path`` (at most ``limit`` bytes).

    Raises:
        NotReadable: not a regular file (FIFO, device, directory, socket) or larger than
            ``limit`` bytes.
        OSError: it cannot be opened or read (missing, permission denied).
    """
    fd = os.open(Path(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise NotReadable(0, f"{kind} (only regular files are read)", str(path))
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(65536, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise NotReadable(0, f"larger than {limit} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)
