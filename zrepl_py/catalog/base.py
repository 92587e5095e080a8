"""What every part of the catalog repository shares: the engine, one short transaction per
call, dataset ids, and the checks and query pieces several parts use (see ``repository``)."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterable, Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from zrepl_py.catalog.db import reading, reads_concurrently, translate
from zrepl_py.catalog.models import Dataset, Snapshot, Stream
from zrepl_py.clock import UTC, ensure_utc
from zrepl_py.errors import CatalogConflict, CatalogError

CHUNK = 500  # ids per IN (...) list, well under SQLite's bound-parameter limit
WRAP64 = 2**64
"""Added to a guid read back signed (raw driver value) to make it unsigned (``types.UInt64``)."""


def require_aware(what: str, value: dt.datetime) -> dt.datetime:
    """Return ``value`` if it is an aware datetime; ``ValueError`` otherwise."""
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise ValueError(f"{what} must be an aware UTC datetime, got {value!r}")
    return value


def require_one_of(what: str, value: str, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is in ``allowed``; ``ValueError`` naming the choices otherwise."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(allowed)}")
    return value


def require_size(what: str, value: int) -> int:
    """Return ``value`` if it is a non-negative int (bytes); ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative number of bytes, got {value!r}")
    return value


def chunks(ids: Sequence[int]) -> Iterator[Sequence[int]]:
    """Split ``ids`` into slices short enough for one ``IN (...)`` list."""
    for start in range(0, len(ids), CHUNK):
        yield ids[start : start + CHUNK]


def scope_conditions(host: str | None, below: str | None, store: str | None) -> list:
    """WHERE conditions selecting streams (joined with their dataset) of a bulk read."""
    conditions = []
    if host is not None:
        conditions.append(Dataset.host == host)
    if below is not None:
        conditions.append(sa.or_(
            Dataset.name == below,
            Dataset.name.startswith(below.rstrip("/") + "/", autoescape=True),
        ))
    if store is not None:
        conditions.append(Stream.store == store)
    return conditions


def stream_scope(host: str | None, below: str | None, store: str | None) -> list:
    """WHERE conditions on streams alone (datasets through ``IN (subquery)``), for reads
    that map dataset ids to names themselves instead of joining."""
    conditions = []
    if host is not None or below is not None:
        conditions.append(Stream.dataset_id.in_(
            sa.select(Dataset.id).where(*scope_conditions(host, below, None))))
    if store is not None:
        conditions.append(Stream.store == store)
    return conditions


def raw_rows(session: Session, query: sa.Select) -> list[tuple]:
    """Run ``query`` and fetch its rows straight from the DBAPI cursor: plain tuples, no
    SQLAlchemy Row objects and no column type processing (twice as fast on large reads).
    Only for columns whose raw driver values the caller converts (:func:`utc_of`,
    :data:`WRAP64`) or wants as they are (ints, strings)."""
    result = session.connection().execute(query)
    try:
        return result.cursor.fetchall()
    finally:
        result.close()


def utc_of(value: dt.datetime | str | None) -> dt.datetime | None:
    """A time column's raw driver value (:func:`raw_rows`) as aware UTC: SQLite hands back
    the naive UTC text ``UtcDateTime`` wrote, PostgreSQL's driver a datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        return dt.datetime.fromisoformat(value).replace(tzinfo=UTC)
    return ensure_utc(value)


SNAPSHOT_COLUMNS = (Dataset.host, Dataset.name, Snapshot.name, Snapshot.guid, Snapshot.createtxg,
                     Snapshot.creation, Snapshot.first_seen, Snapshot.destroyed_at)
"""A :class:`SnapshotRow`'s fields in order, for Core selects joining datasets and snapshots
(typed: guids unsigned, times aware UTC)."""


class CatalogBase:
    """The engine and short transactions every part of ``Catalog`` works through."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._reader = reading(engine)

    @property
    def reads_concurrently(self) -> bool:
        """Whether this catalog's read methods may run in several threads at once (each
        on its own connection, seeing the same database; see ``db.reads_concurrently``)."""
        return reads_concurrently(self._engine)

    @contextlib.contextmanager
    def _session(
        self, doing: str, *, on_integrity: type[CatalogError] = CatalogConflict,
        read_only: bool = False,
    ) -> Iterator[Session]:
        """One transaction, committed on success; database errors translated (see db.translate).
        ``read_only``: the block only reads (on SQLite the transaction takes no write lock)."""
        with translate(doing, on_integrity=on_integrity):
            bind = self._reader if read_only else self._engine
            with Session(bind, expire_on_commit=False) as session, session.begin():
                yield session

    def dataset_id(self, host: str, name: str) -> int:
        """Return the id of dataset ``name`` on ``host`` ("local" for this machine), creating it."""
        with self._session(f"recording dataset {host}:{name}") as session:
            return self._dataset_id(session, host, name)

    @staticmethod
    def _dataset_id(session: Session, host: str, name: str) -> int:
        """Get or create the dataset row inside ``session``; safe against a concurrent insert."""
        if not host or not name:
            raise ValueError(f"a dataset needs a host and a name, got {host!r}, {name!r}")
        query = sa.select(Dataset.id).where(Dataset.host == host, Dataset.name == name)
        found = session.scalar(query)
        if found is not None:
            return found
        try:
            with session.begin_nested():
                row = Dataset(host=host, name=name)
                session.add(row)
            return row.id
        except sa.exc.IntegrityError:
            # Another process added it between our SELECT and INSERT (PostgreSQL; SQLite's
            # BEGIN IMMEDIATE already serialises writers).
            return session.scalars(query).one()
