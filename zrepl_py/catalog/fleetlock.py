"""Dataset locks shared by the hosts of one PostgreSQL catalog (a fleet), beside each host's
own file lock (``locking``); docs/decisions.md#dataset-locks-across-hosts.

A host's ``flock`` is seen only through its own state directory, so two hosts sharing a
catalog would both work on one dataset: write one chain, or prune what the other archives.
Where the catalog is PostgreSQL, ``locking.dataset_lock`` also takes a session-level advisory
lock (``pg_try_advisory_lock``) on a connection of its own and keeps it until the block ends.
PostgreSQL holds such a lock until it is released or the session ends (PostgreSQL docs,
"Explicit Locking", "Advisory Locks"):

* the key is the first 8 bytes of the SHA-256 of the lock key (``HOST:DATASET``, ``target
  ...``), as a signed 64-bit number (``advisory_key``);
* the holder is described by its session's ``application_name`` (``zbak ACTION pid PID on
  HOST``), which another host reads from ``pg_locks`` joined with ``pg_stat_activity`` for its
  exit-3 message and for ``holder`` (an audit reads beside an archive, not beside a prune);
* a process that dies ends its session, and with it the lock, at once; a host that vanishes
  is noticed by the server's TCP keepalives, set to about a minute on the lock's session;
* the holder checks its session every ``CHECK_EVERY`` seconds (the lock's heartbeat): a
  session that is gone has lost the lock, and the run stops with ``LockBroken``, as when its
  file lock is taken over. The lock's connection has client keepalives too, so that check
  cannot hang on a dead network for the kernel's 15 minutes of retransmissions.
"""

from __future__ import annotations

import hashlib
import re
import threading

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from zrepl_py.catalog.db import make_engine, translate
from zrepl_py.errors import LockBroken, Locked
from zrepl_py.locking import LockRecord

CHECK_EVERY = 30.0
"""Seconds between two checks of a held lock's session."""
KEEPALIVE = 10
"""Seconds of the TCP keepalives on the lock's session, both ends: idle time before the
first probe and between probes; 3 lost probes drop the connection (40 s)."""
_CLIENT_KEEPALIVES = {"keepalives": 1, "keepalives_idle": KEEPALIVE,
                      "keepalives_interval": KEEPALIVE, "keepalives_count": 3}
"""libpq connection parameters (libpq docs, "Parameter Key Words")."""
_SERVER_KEEPALIVES = {"tcp_keepalives_idle": str(KEEPALIVE),
                      "tcp_keepalives_interval": str(KEEPALIVE), "tcp_keepalives_count": "3"}
"""The same on the server's side of the session (user-settable, PostgreSQL docs "Connection
Settings"): the server drops a vanished host's session, and so its locks."""
_NAME_BYTES = 63
"""``application_name`` is cut to NAMEDATALEN - 1 bytes by the server."""
_DESCRIBED = re.compile(r"zbak (?P<action>.+) pid (?P<pid>[0-9]+) on (?P<host>.*)", re.DOTALL)
_HOLDER = sa.text(
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND l.classid::bigint = :high AND l.objid::bigint = :low")


def advisory_key(key: str) -> int:
    """The advisory lock number of lock key ``key``: a signed 64-bit integer."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)


def described(record: LockRecord) -> str:
    """The ``application_name`` of a lock's session: ``zbak ACTION pid PID on HOST``, cut to
    what the server keeps (the host's name last, so it is what a long name loses)."""
    text = f"zbak {record.action} pid {record.pid} on {record.host}"
    return text.encode()[:_NAME_BYTES].decode(errors="ignore")


def parse_described(name: str, now: float) -> LockRecord | None:
    """The holder an ``application_name`` from ``described`` names (token empty, refreshed
    ``now``); None for another application's name."""
    found = _DESCRIBED.fullmatch(name)
    if found is None:
        return None
    return LockRecord(found["host"], int(found["pid"]), found["action"], "", now)


class FleetLease:
    """A held advisory lock: its session, checked by the lock's heartbeat thread and released
    by the holder's (a mutex keeps the two apart)."""

    def __init__(self, connection: Connection, key: str, number: int):
        self._connection, self._key, self._number = connection, key, number
        self._mutex = threading.Lock()

    def check(self) -> None:
        """Raise ``LockBroken`` when the session holding the lock is gone.

        Raises:
            LockBroken: the query failed: the connection, and so the lock, is lost.
        """
        with self._mutex:
            try:
                self._connection.exec_driver_sql("SELECT 1")
            except sa.exc.SQLAlchemyError as exc:
                raise LockBroken(
                    f"the lock of {self._key} held in the catalog was lost with its database"
                    f" session ({str(exc).splitlines()[0]}): another host may take it, so this"
                    " run stops") from None

    def release(self) -> None:
        """Unlock and close the session (closing alone would unlock it: errors are ignored)."""
        with self._mutex:
            try:
                self._connection.execute(sa.select(sa.func.pg_advisory_unlock(self._number)))
            except sa.exc.SQLAlchemyError:
                pass
            finally:
                self._connection.close()


class FleetLocks:
    """Advisory locks on the PostgreSQL catalog at ``url`` (``locking.SharedLocks``): one
    connection per held lock, none pooled.

    Raises (constructor):
        ExtraMissing, CatalogError: as ``db.make_engine``.
    """

    check_every = CHECK_EVERY

    def __init__(self, url: str):
        checked = make_engine(url)  # the URL's checks and driver; its pool stays unused
        parsed = checked.url
        checked.dispose()
        extra = {k: v for k, v in _CLIENT_KEEPALIVES.items() if k not in parsed.query}
        self._engine: Engine = sa.create_engine(parsed, poolclass=sa.pool.NullPool,
                                                connect_args=extra)

    def acquire(self, key: str, record: LockRecord) -> FleetLease:
        """Take the lock of ``key`` for ``record``'s holder, never waiting.

        Raises:
            Locked: another session (another host, or a process here) holds it.
            CatalogUnavailable, CatalogError: the catalog cannot be reached.
        """
        number = advisory_key(key)
        with translate(f"taking the lock of {key} in the catalog"):
            connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            try:
                settings = {"application_name": described(record), **_SERVER_KEEPALIVES}
                for name, value in settings.items():
                    connection.execute(sa.select(sa.func.set_config(name, value, False)))
                taken = connection.execute(
                    sa.select(sa.func.pg_try_advisory_lock(number))).scalar_one()
                if taken:
                    return FleetLease(connection, key, number)
                found = self._holder(connection, number, record.refreshed)
            except BaseException:
                connection.close()
                raise
        connection.close()
        who = found.describe() if found else "a session that has just ended"
        raise Locked(f"{key} is locked by {who}, through the catalog this host shares"
                     " with others; nothing done. Wait for that run to finish and try again.")

    def holder(self, key: str, now: float) -> LockRecord | None:
        """Who holds the lock of ``key`` now (any host), or None; a look, not a promise.

        Raises:
            CatalogUnavailable, CatalogError: the catalog cannot be reached.
        """
        with translate(f"reading the holder of {key} in the catalog"), \
                self._engine.connect() as connection:
            return self._holder(connection, advisory_key(key), now)

    @staticmethod
    def _holder(connection: Connection, number: int, now: float) -> LockRecord | None:
        unsigned = number & 0xFFFFFFFFFFFFFFFF
        names = connection.execute(_HOLDER, {"high": unsigned >> 32,
                                             "low": unsigned & 0xFFFFFFFF}).scalars().all()
        for name in names:
            found = parse_described(name or "", now)
            if found is not None:
                return found
        return None

    def close(self) -> None:
        """Close the engine (a held lease keeps its own connection until released)."""
        self._engine.dispose()
