"""The floor's witness journal on the backup host: read it, add a witness, keep it small.

One file (``--floor-journal``, default ``~/.local/state/zbak/floor-journal.tsv``, 0600 in a
0700 directory), one line per witness (``serve.floor.Witness``). Only ``zbak serve`` writes
it, and nothing the master sends can name a file, so the master cannot forge or drop a
witness; a witness lost anyway (a crash, a full disk, the file deleted) makes snapshots look
younger, never older.

Every change happens under an exclusive ``flock(2)`` of ``FILE.lock``, which a destroy or
rollback also holds from its floor check until zfs has finished (``serve.guard``): two floor
checks never interleave with each other's commands.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from zrepl_py.runtime.statedir import ensure_private_dir, write_private_file
from zrepl_py.serve.floor import Witness, compacted, parse_journal, worth_recording

DEFAULT_JOURNAL = Path(".local/state/zbak/floor-journal.tsv")
"""The journal, relative to the home directory (XDG Base Directory spec's state home)."""

COMPACT_AFTER = 4096
"""Lines per pool beyond which a new witness rewrites the journal compacted
(``floor.compacted`` leaves about 750 lines for the last month of hourly witnesses plus one
a day before, per pool)."""


@contextlib.contextmanager
def locked(journal: Path) -> Iterator[None]:
    """Hold the journal's exclusive lock (``JOURNAL.lock``, created 0600) while inside.

    Raises:
        OSError, UnsafeDirectory: the journal's directory or lock cannot be made or opened.
    """
    ensure_private_dir(journal.parent)
    fd = os.open(journal.with_name(journal.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


def read(journal: Path) -> list[Witness]:
    """The journal's witnesses (none when it does not exist yet).

    Raises:
        OSError: it exists but cannot be read.
    """
    try:
        return parse_journal(journal.read_text(encoding="utf-8", errors="replace"))
    except FileNotFoundError:
        return []


def add(journal: Path, witness: Witness, known: list[Witness]) -> None:
    """Append ``witness`` when it tells something ``known`` (the journal as read under the
    same lock) does not; rewrite the journal compacted once it is long. Call under
    ``locked``.

    Raises:
        OSError: the journal cannot be written.
    """
    if not worth_recording(witness, known):
        return
    if len(known) >= COMPACT_AFTER * len({w.pool_guid for w in known}):
        kept = compacted([*known, witness], witness.at)
        write_private_file(journal, "".join(w.line() for w in kept).encode())
        return
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, witness.line().encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def witness_time() -> dt.datetime:
    """This host's clock for a witness: aware UTC in whole seconds (the journal's
    resolution), rounded up so a witness is never dated before what it saw."""
    moment = dt.datetime.now(dt.UTC)
    whole = moment.replace(microsecond=0)
    return whole if whole == moment else whole + dt.timedelta(seconds=1)
