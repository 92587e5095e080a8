"""Column types that store ZFS values exactly on both SQLite and PostgreSQL.

``UInt64`` keeps unsigned 64-bit guids (0 .. 2**64-1) in a signed BIGINT by two's complement:
SQLite's INTEGER and PostgreSQL's BIGINT are both signed 64-bit, and NUMERIC on SQLite is a
float that silently loses the low bits of a guid. ``UtcDateTime`` stores UTC and always hands
back aware UTC datetimes; SQLite keeps no offset, so values are written as naive UTC there.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from zrepl_py.clock import UTC, ensure_utc

UINT64_MAX = 2**64 - 1
_SIGN_BIT = 2**63
_WRAP = 2**64


def to_signed64(value: int) -> int:
    """Map an unsigned 64-bit int (0 .. 2**64-1) to the signed int with the same bits.

    Raises:
        ValueError: ``value`` is negative or above 2**64-1.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"a guid must be an int, got {type(value).__name__}")
    if not 0 <= value <= UINT64_MAX:
        raise ValueError(f"guid {value} is outside the unsigned 64-bit range 0..2**64-1")
    return value - _WRAP if value >= _SIGN_BIT else value


def from_signed64(value: int) -> int:
    """Inverse of :func:`to_signed64`: a signed 64-bit int back to its unsigned value."""
    return value + _WRAP if value < 0 else value


class UInt64(sa.types.TypeDecorator[int]):
    """An unsigned 64-bit integer (a ZFS guid) stored bit-exactly in a signed BIGINT.

    Binds Python ints 0 .. 2**64-1 (``ValueError`` outside that range); results are the same
    unsigned ints. Ordering in SQL follows the signed value, so never ``ORDER BY`` a guid.
    """

    impl = sa.BigInteger
    cache_ok = True

    def process_bind_param(self, value: int | None, dialect: sa.Dialect) -> int | None:
        """Two's-complement ``value`` into the signed range (``None`` passes through)."""
        return None if value is None else to_signed64(value)

    def process_result_value(self, value: int | None, dialect: sa.Dialect) -> int | None:
        """Undo :meth:`process_bind_param`."""
        return None if value is None else from_signed64(int(value))


class UtcDateTime(sa.types.TypeDecorator[dt.datetime]):
    """A point in time: binds aware datetimes only, returns aware UTC datetimes.

    Raises ``ValueError`` on bind when given a naive datetime
    (docs/style.md#utc-everywhere-and-order-by-createtxg: zbak has none). PostgreSQL stores
    ``timestamptz``; SQLite stores the UTC wall time without offset.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None,
                           dialect: sa.Dialect) -> dt.datetime | None:
        """Convert to UTC; strip the offset for SQLite, which cannot keep it."""
        if value is None:
            return None
        if not isinstance(value, dt.datetime):
            raise ValueError(f"expected a datetime, got {type(value).__name__}")
        if value.tzinfo is None:
            raise ValueError(
                f"naive datetime {value.isoformat()} given; zbak stores aware UTC only"
            )
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: dt.datetime | None,
                             dialect: sa.Dialect) -> dt.datetime | None:
        """Return the stored instant as aware UTC."""
        return None if value is None else ensure_utc(value)
