"""Per-dataset locks shared by the daemon and manual runs (exit 3 when taken).

A lock is an ``flock(2)`` on a file under ``<state_dir>/locks``; the kernel drops it when
the process dies, so a crashed run never blocks this host. The file also holds a record
(host, pid, action, a random token, the last refresh as Unix seconds) for the message
another run sees, and for state directories shared between hosts, where another host's
``flock`` may not be seen (restic ``lock_file.go``, borg ``fslocking``;
docs/reliability.md#r29-stale-locks):

* a record left behind (its ``flock`` free) is stale when it comes from this host and its
  pid is dead, or when it was not refreshed for ``ttl`` seconds; a record from another host
  is NOT stale until its ttl ran out, whatever its pid;
* the holder refreshes its record every ``ttl / 3`` seconds (a heartbeat thread), and a
  holder whose record aged past the ttl can still refresh it as long as nobody took it;
* when another process took the lock over (rewrote or removed the file), the holder's next
  refresh raises ``LockBroken`` and the holding process is interrupted: it stops rather
  than go on unprotected. The interruption is a SIGINT to the main thread; where SIGINT is
  ignored (bash starts a script's ``zbak ... &`` with SIGINT ignored, and Python keeps an
  ignored SIGINT), the lock installs, while it is held, a handler that raises for a broken
  lock only, so other SIGINTs stay ignored;
* a refresh racing an in-place takeover can write the holder's record back over the taker's;
  the taker's own next refresh then finds that and stops instead: one of the two goes on, as
  in any takeover.

A clean release empties the record, so only a crash leaves one behind.

Hosts that share a catalog but not a state directory (a fleet on PostgreSQL) see each other's
runs through ``SharedLocks`` (``catalog.fleetlock``): ``dataset_lock`` takes the lock there
too, after the file lock, and its heartbeat checks it is still held
(docs/decisions.md#dataset-locks-across-hosts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from zrepl_py.errors import LockBroken, Locked
from zrepl_py.runtime.statedir import ensure_private_dir

log = logging.getLogger(__name__)

LOCK_TTL = 1800.0
"""Seconds after its last refresh a lock record of another host counts as stale."""


def lock_path(state_dir: Path, key: str) -> Path:
    """Return the lock file for ``key`` (e.g. ``local:tank/data``); names are hashed so any
    dataset name maps to a safe file name."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return state_dir / "locks" / f"{digest}.lock"


@dataclasses.dataclass(frozen=True)
class LockRecord:
    """What a lock file says about its holder.

    Attributes:
        host: the holder's host name (``socket.gethostname()``).
        pid: the holder's process id on that host.
        action: the command holding it (``replicate``, ``prune``...).
        token: random hex, unique per acquisition: tells the holder its record from another's.
        refreshed: the last refresh, Unix seconds (UTC).
    """

    host: str
    pid: int
    action: str
    token: str
    refreshed: float

    def dumps(self) -> bytes:
        """The record as the file holds it (one JSON object)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def loads(cls, data: bytes) -> LockRecord | None:
        """Parse a file's content; None for an empty file, a pre-record file (``pid N
        (action)``) or anything unreadable."""
        try:
            raw = json.loads(data.decode())
            return cls(str(raw["host"]), int(raw["pid"]), str(raw["action"]), str(raw["token"]),
                       float(raw["refreshed"]))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None

    def describe(self) -> str:
        """``pid N (action) on HOST`` for messages."""
        return f"pid {self.pid} ({self.action}) on {self.host}"


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists on this host (``kill(pid, 0)``, kill(2): EPERM
    means it exists but belongs to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(record: LockRecord, *, host: str, now: float, ttl: float,
             alive: Callable[[int], bool] = pid_alive) -> bool:
    """Whether a lock record may be taken over (pure but for ``alive``; restic ``stale()``).

    Args:
        record: the record found in the lock file.
        host: this host's name.
        now: Unix seconds.
        ttl: seconds without refresh after which any record is stale.
        alive: tells whether a pid of THIS host is running.

    Returns:
        True when the record was not refreshed for more than ``ttl`` seconds, or when it
        comes from this host and its pid is not running. A record of another host is never
        stale before its ttl: its pid means nothing here.
    """
    if now - record.refreshed > ttl:
        return True
    return record.host == host and not alive(record.pid)


class SharedLease(Protocol):
    """A lock held where other hosts see it (``SharedLocks.acquire``)."""

    def check(self) -> None:
        """Raise ``LockBroken`` when the lock is no longer held."""

    def release(self) -> None:
        """Give the lock back (never raises)."""


class SharedLocks(Protocol):
    """Locks other hosts see: those of a catalog the hosts share (``catalog.fleetlock``).

    Attributes:
        check_every: seconds between two checks of a held lock (the heartbeat's most).
    """

    check_every: float

    def acquire(self, key: str, record: LockRecord) -> SharedLease:
        """Take ``key``'s lock for ``record``'s holder at once; raise ``Locked`` if held."""

    def holder(self, key: str, now: float) -> LockRecord | None:
        """Who holds ``key``'s lock now (any host), or None."""


class Lease:
    """A held lock: refresh it, or learn that it was broken.

    Attributes:
        path: the lock file.
        record: this holder's current record.
        broken: the LockBroken a refresh raised, else None.
        shared: the same lock where other hosts see it, or None.
    """

    def __init__(self, path: Path, fd: int, record: LockRecord, clock: Callable[[], float],
                 shared: SharedLease | None = None):
        self.path, self._fd, self.record, self._clock = path, fd, record, clock
        self.broken: LockBroken | None = None
        self.shared = shared

    def still_mine(self) -> bool:
        """True when the file at ``path`` is the one locked and holds this holder's token."""
        try:
            same = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            return False
        found = LockRecord.loads(os.pread(self._fd, 4096, 0))
        return same and found is not None and found.token == self.record.token

    def refresh(self) -> None:
        """Write a new refresh time into the record, even after it aged past the ttl, and
        check the shared lock.

        Raises:
            LockBroken: the file was removed, replaced or rewritten by another holder, or
                the shared lock was lost.
        """
        if not self.still_mine():
            self.broken = LockBroken(
                f"the lock {self.path} held by {self.record.describe()} was taken over by"
                " another process that judged it stale: stopping")
            raise self.broken
        if self.shared is not None:
            try:
                self.shared.check()
            except LockBroken as exc:
                self.broken = exc
                raise
        self.record = dataclasses.replace(self.record, refreshed=self._clock())
        _write(self._fd, self.record)


def _write(fd: int, record: LockRecord) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.dumps(), 0)


def _heartbeat(lease: Lease, every: float, stop: threading.Event,
               on_broken: Callable[[LockBroken], None]) -> None:
    while not stop.wait(every):
        try:
            lease.refresh()
        except LockBroken as exc:
            log.error("%s", exc)
            on_broken(exc)
            return
        except OSError as exc:  # a full or vanished state dir: the next beat tries again
            log.warning("could not refresh the lock %s: %s", lease.path, exc)


_HELD: list[Lease] = []
"""The leases this process holds (the SIGINT handler of ``_interrupt_even_if_ignored``)."""


def _interrupt_even_if_ignored() -> Callable[[], None]:
    """Make ``_interrupt`` reach the main thread while SIGINT is ignored: install a handler
    raising KeyboardInterrupt when one of the held leases is broken (another SIGINT is
    ignored, as before); return what puts the old handler back. Nothing to do when SIGINT
    is handled already, or off the main thread (where handlers cannot be set)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):
        return lambda: None

    def broken_only(_signum: int, _frame: object) -> None:
        if any(lease.broken is not None for lease in _HELD):
            raise KeyboardInterrupt("lock taken over")

    signal.signal(signal.SIGINT, broken_only)

    def restore() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    return restore


def _interrupt(_exc: LockBroken) -> None:
    # A real SIGINT, not _thread.interrupt_main(): that only sets a flag, which a main thread
    # blocked in sleep() or a read does not see until the call returns (signal(7): EINTR).
    main = threading.main_thread().ident
    if main is not None:  # None only before the main thread started
        signal.pthread_kill(main, signal.SIGINT)


def holder(state_dir: Path, key: str, *, ttl: float = LOCK_TTL,
           clock: Callable[[], float] = time.time, host: str | None = None,
           shared: SharedLocks | None = None) -> LockRecord | None:
    """Who holds the lock for ``key`` now, without taking it (read-only readers that may
    run beside some holders, e.g. ``zbak audit`` beside ``zbak archive``).

    Args:
        shared: also ask there (another host's run) when no file record names a holder.

    Returns:
        The holder's record, or None when the lock is free: no file, an empty record (a clean
        release) or a stale one (``is_stale``: a crashed holder), and no holder in ``shared``.
        Taking the lock an instant later may still fail or succeed: this is a look, not a
        promise.
    """
    try:
        found = LockRecord.loads(lock_path(state_dir, key).read_bytes())
    except FileNotFoundError:
        found = None
    now = clock()
    if found is not None and not is_stale(found, host=host or socket.gethostname(), now=now,
                                          ttl=ttl):
        return found
    return shared.holder(key, now) if shared is not None else None


@contextlib.contextmanager
def dataset_lock(state_dir: Path, key: str, action: str, *, ttl: float = LOCK_TTL,
                 heartbeat: float | None = None, clock: Callable[[], float] = time.time,
                 host: str | None = None,
                 on_broken: Callable[[LockBroken], None] = _interrupt,
                 shared: SharedLocks | None = None) -> Iterator[Lease]:
    """Hold the exclusive lock for ``key`` while the block runs; yield its Lease.

    Args:
        state_dir: zbak's state directory (created 0700 if missing).
        key: what is locked, ``HOST:DATASET`` of the job's source.
        action: the command taking the lock, for the message another run sees.
        ttl: seconds after which a record nobody refreshed is stale (module doc).
        heartbeat: seconds between refreshes; None: ``ttl / 3``; 0: no heartbeat thread.
        clock: Unix seconds (tests inject a fake).
        host: this host's name; None: ``socket.gethostname()``.
        on_broken: called from the heartbeat thread when the lock was taken over; the
            default sends SIGINT to the main thread (KeyboardInterrupt with Python's default
            handler, turned into LockBroken when it leaves this block).
        shared: also take the lock there, after the file lock (hosts sharing a catalog);
            the heartbeat then runs at least every ``shared.check_every`` seconds and
            checks it too.

    Raises:
        Locked: at once (never waits) when another process holds it, or its record is not
            stale (another host within its ttl), or ``shared`` has it held.
        LockBroken: the lock was taken over while the block ran.
    """
    here = host or socket.gethostname()
    path = lock_path(state_dir, key)
    ensure_private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    stop = threading.Event()
    lease = None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            found = LockRecord.loads(os.pread(fd, 4096, 0))
            holder = (found.describe() if found else
                      os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process")
            raise Locked(
                f"{key} is locked by {holder}; nothing done. Wait for that run to finish "
                f"(or check `zbak status`) and try again."
            ) from None
        found = LockRecord.loads(os.pread(fd, 4096, 0))
        now = clock()
        if found is not None and not is_stale(found, host=here, now=now, ttl=ttl):
            raise Locked(
                f"{key} is locked by {found.describe()} (lock file {path}, refreshed"
                f" {now - found.refreshed:.0f} s ago; stale after {ttl:.0f} s); nothing done."
                " Wait for that run to finish and try again.")
        record = LockRecord(here, os.getpid(), action, secrets.token_hex(8), now)
        taken = shared.acquire(key, record) if shared is not None else None
        if found is not None:
            log.warning("taking over the stale lock of %s held by %s", key, found.describe())
        _write(fd, record)
        lease = Lease(path, fd, record, clock, taken)
        _HELD.append(lease)
        restore = _interrupt_even_if_ignored()
        every = ttl / 3 if heartbeat is None else heartbeat
        if heartbeat is None and shared is not None:
            every = min(every, shared.check_every)
        if every > 0:
            threading.Thread(target=_heartbeat, args=(lease, every, stop, on_broken),
                             name=f"lock-heartbeat {key}", daemon=True).start()
        try:
            yield lease
        except KeyboardInterrupt:
            if lease.broken is not None:
                raise lease.broken from None
            raise
        finally:
            restore()
        if lease.broken is not None:
            raise lease.broken
    finally:
        stop.set()
        if lease is not None:
            _HELD.remove(lease)
            if lease.shared is not None:
                lease.shared.release()
        if lease is not None and lease.still_mine():
            os.ftruncate(fd, 0)  # a clean release leaves no record behind
        os.close(fd)
