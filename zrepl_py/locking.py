"""Per-dataset locks shared by the daemon and manual runs (exit 3 when taken).

A lock is an ``flock(2)`` on a file under ``<state_dir>/locks``; the kernel drops it when
the process dies, so a crashed run never leaves a stale lock on this host. The file holds
the owner's pid and action for the error message.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from pathlib import Path
from typing import Iterator

from zrepl_py.errors import Locked
from zrepl_py.statedir import ensure_private_dir


def lock_path(state_dir: Path, key: str) -> Path:
    """Return the lock file for ``key`` (e.g. ``local:tank/data``); names are hashed so any
    dataset name maps to a safe file name."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return state_dir / "locks" / f"{digest}.lock"


@contextlib.contextmanager
def dataset_lock(state_dir: Path, key: str, action: str) -> Iterator[None]:
    """Hold the exclusive lock for ``key`` while the block runs.

    Args:
        state_dir: zbak's state directory (created 0700 if missing).
        key: what is locked, ``HOST:DATASET`` of the job's source.
        action: the command taking the lock, for the message another run sees.

    Raises:
        Locked: at once (never waits) when another process holds it.
    """
    path = lock_path(state_dir, key)
    ensure_private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise Locked(
                f"{key} is locked by {holder}; nothing done. Wait for that run to finish "
                f"(or check `zbak status`) and try again."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({action})".encode(), 0)
        yield
    finally:
        os.close(fd)
