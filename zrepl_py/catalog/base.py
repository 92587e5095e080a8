"""What every part of the catalog repository shares: the engine, one short transaction per
call, dataset ids, and the checks and query pieces several parts use (see ``repository``)."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeAlias, overload

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from zrepl_py.catalog.db import reading, reads_concurrently, translate
from zrepl_py.catalog.models import dataset_table, snapshot_table, stream_table
from zrepl_py.clock import ensure_utc
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


Condition: TypeAlias = "sa.ColumnElement[bool]"
"""A WHERE condition."""

AnyRow: TypeAlias = "sa.Row[Any]"
"""A result row of any shape."""

AnySelect: TypeAlias = "sa.Select[*tuple[Any, ...]]"
"""A SELECT of any columns."""

AnyCompound: TypeAlias = "sa.CompoundSelect[*tuple[Any, ...]]"
"""A UNION of SELECTs of any columns."""


def scope_conditions(host: str | None, below: str | None, store: str | None,
                     datasets: Sequence[int] | None = None) -> list[Condition]:
    """WHERE conditions selecting streams (joined with their dataset) of a bulk read;
    ``datasets``: only these dataset ids as well (None: any; at most :data:`CHUNK` of
    them, one bound parameter each)."""
    conditions: list[Condition] = []
    if datasets is not None:
        conditions.append(dataset_table.c.id.in_(datasets))
    if host is not None:
        conditions.append(dataset_table.c.host == host)
    if below is not None:
        conditions.append(sa.or_(
            dataset_table.c.name == below,
            dataset_table.c.name.startswith(below.rstrip("/") + "/", autoescape=True),
        ))
    if store is not None:
        conditions.append(stream_table.c.store == store)
    return conditions


def stream_scope(host: str | None, below: str | None, store: str | None,
                 datasets: Sequence[int] | None = None) -> list[Condition]:
    """WHERE conditions on streams alone (datasets through ``IN (subquery)``), for reads
    that map dataset ids to names themselves instead of joining; ``datasets`` as in
    :func:`scope_conditions`."""
    conditions: list[Condition] = []
    if datasets is not None:
        conditions.append(stream_table.c.dataset_id.in_(datasets))
    if host is not None or below is not None:
        conditions.append(stream_table.c.dataset_id.in_(
            sa.select(dataset_table.c.id).where(*scope_conditions(host, below, None))))
    if store is not None:
        conditions.append(stream_table.c.store == store)
    return conditions


def raw_rows(conn: sa.Connection, query: sa.Executable) -> list[tuple[Any, ...]]:
    """Run ``query`` and fetch its rows straight from the DBAPI cursor: plain tuples, no
    SQLAlchemy Row objects and no column type processing (twice as fast on large reads).
    Only for columns whose raw driver values the caller converts (:func:`utc_of`,
    :data:`WRAP64`) or wants as they are (ints, strings)."""
    result = conn.execute(query)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


BATCH_ROWS = 5000
"""Rows fetched from the driver at a time by :func:`raw_batches`."""


def raw_batches(conn: sa.Connection, query: sa.Executable) -> Iterator[list[tuple[Any, ...]]]:
    """:func:`raw_rows` in batches of :data:`BATCH_ROWS`, for reads that turn each row into
    something else: only one batch of the driver's tuples (and their time texts) is alive
    beside what the caller keeps (``fetchall`` of 100,000 streams held 40 MiB of them at
    once, the peak of ``zbak prune``)."""
    result = conn.execute(query)
    try:
        while batch := result.cursor.fetchmany(BATCH_ROWS):
            yield list(batch)
    finally:
        result.close()


def new_id(inserted: sa.CursorResult[Any]) -> int:
    """The primary key of the one row ``inserted`` (an INSERT's result) added.

    Raises:
        CatalogError: the database reported no key (not an INSERT of one row).
    """
    key = inserted.inserted_primary_key
    if key is None:
        raise CatalogError("the database reported no id for the row just inserted")
    return int(key[0])


@overload
def utc_of(value: dt.datetime | str) -> dt.datetime: ...
@overload
def utc_of(value: None) -> None: ...
def utc_of(value: dt.datetime | str | None) -> dt.datetime | None:
    """A time column's raw driver value (:func:`raw_rows`) as aware UTC: SQLite hands back
    the naive UTC text ``UtcDateTime`` wrote, PostgreSQL's driver a datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        # Parsing the offset in is five times faster than ``.replace(tzinfo=UTC)`` after
        # (CPython 3.11; 750,000 times per ``zbak status`` of 100,000 streams). A text that
        # carries its own offset (not written by zbak) takes the slow path.
        try:
            return dt.datetime.fromisoformat(value + "+00:00")
        except ValueError:
            return ensure_utc(dt.datetime.fromisoformat(value))
    return ensure_utc(value)


SNAPSHOT_COLUMNS = (dataset_table.c.host, dataset_table.c.name, snapshot_table.c.name,
                    snapshot_table.c.guid, snapshot_table.c.createtxg, snapshot_table.c.creation,
                    snapshot_table.c.first_seen, snapshot_table.c.destroyed_at)
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
    def _transaction(
        self, doing: str, *, on_integrity: type[CatalogError] = CatalogConflict,
        read_only: bool = False,
    ) -> Iterator[sa.Connection]:
        """One transaction on a connection, committed on success; database errors translated
        (see db.translate). ``read_only``: the block only reads (on SQLite the transaction
        takes no write lock)."""
        with translate(doing, on_integrity=on_integrity):
            bind = self._reader if read_only else self._engine
            with bind.begin() as conn:
                yield conn

    @staticmethod
    def _row(conn: sa.Connection, table: sa.Table, row_id: int) -> AnyRow | None:
        """The row of ``table`` whose id is ``row_id``, or None."""
        return conn.execute(sa.select(table).where(table.c.id == row_id)).first()

    def dataset_id(self, host: str, name: str) -> int:
        """Return the id of dataset ``name`` on ``host`` ("local" for this machine), creating it."""
        with self._transaction(f"recording dataset {host}:{name}") as conn:
            return self._dataset_id(conn, host, name)

    @staticmethod
    def _dataset_id(conn: sa.Connection, host: str, name: str) -> int:
        """Get or create the dataset row inside ``conn``'s transaction; safe against a
        concurrent insert."""
        if not host or not name:
            raise ValueError(f"a dataset needs a host and a name, got {host!r}, {name!r}")
        query = sa.select(dataset_table.c.id).where(dataset_table.c.host == host,
                                                    dataset_table.c.name == name)
        found: int | None = conn.scalar(query)
        if found is not None:
            return found
        try:
            with conn.begin_nested():
                return new_id(conn.execute(sa.insert(dataset_table).values(host=host, name=name)))
        except sa.exc.IntegrityError:
            # Another process added it between our SELECT and INSERT (PostgreSQL; SQLite's
            # BEGIN IMMEDIATE already serialises writers).
            known: int = conn.scalars(query).one()
            return known
