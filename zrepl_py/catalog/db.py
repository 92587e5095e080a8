"""Opening the catalog database and bringing its schema to the current Alembic head.

Alembic is driven programmatically (no alembic.ini): the scripts live in the repository's
``migrations/`` directory, or in ``<sys.prefix>/share/zbak/migrations`` once installed.
Alembic itself is imported only to migrate: every command's schema check
(``require_current``) reads the ``alembic_version`` table with SQLAlchemy Core and compares it
with ``HEAD_REVISION``, which spares each ``zbak`` run about 0.1 s of imports.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine

from zrepl_py.config.extras import CATALOG, for_catalog
from zrepl_py.errors import (
    CatalogConflict,
    CatalogError,
    CatalogNotCurrent,
    CatalogUnavailable,
    ZbakError,
)
from zrepl_py.runtime.extras import require

if TYPE_CHECKING:
    from alembic.config import Config

HEAD_REVISION = "0012"
"""The revision the models match: the single head of ``migrations/versions`` (a test keeps
them equal, so a new migration cannot ship without moving this)."""
VERSION_TABLE = "alembic_version"
"""Alembic's bookkeeping table: one row, column ``version_num``."""
SQLITE_BUSY_TIMEOUT_MS = 10_000
# Serialises concurrent `zbak init` runs on one PostgreSQL catalog (any constant will do).
_PG_MIGRATION_LOCK = 0x7A62616B


# Typed constraint classes: psycopg's SQLSTATE, sqlite3's extended result code name (3.11+).
_PG_SQLSTATE = {"23503": "foreign_key", "23514": "check", "23505": "unique", "23502": "not_null"}
_SQLITE_CODE = {
    "SQLITE_CONSTRAINT_FOREIGNKEY": "foreign_key",
    "SQLITE_CONSTRAINT_CHECK": "check",
    "SQLITE_CONSTRAINT_UNIQUE": "unique",
    "SQLITE_CONSTRAINT_PRIMARYKEY": "unique",
    "SQLITE_CONSTRAINT_NOTNULL": "not_null",
    # ON DELETE RESTRICT fires as an internal trigger; the catalog defines no triggers itself.
    "SQLITE_CONSTRAINT_TRIGGER": "foreign_key",
}
# "no such table" (SQLite) and undefined_table (PostgreSQL 42P01): the schema was never created.
_MISSING_TABLE_SQLSTATE = "42P01"


def integrity_kind(exc: sa.exc.IntegrityError) -> str:
    """Classify a constraint violation as foreign_key, check, unique, not_null or other.

    Reads the driver's typed code (psycopg ``sqlstate``, sqlite3 ``sqlite_errorname``).
    """
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate:
        return _PG_SQLSTATE.get(sqlstate, "other")
    return _SQLITE_CODE.get(getattr(orig, "sqlite_errorname", ""), "other")


def _driver_message(exc: sa.exc.DBAPIError) -> str:
    """The first line of the driver's own message, without SQLAlchemy's statement dump."""
    text = str(exc.orig).strip() or type(exc.orig).__name__
    return text.splitlines()[0]


def _missing_table(exc: sa.exc.DBAPIError) -> bool:
    """True when ``exc`` says a catalog table does not exist (schema never migrated)."""
    if getattr(exc.orig, "sqlstate", None) == _MISSING_TABLE_SQLSTATE:
        return True
    return getattr(exc.orig, "sqlite_errorname", "") == "SQLITE_ERROR" and str(
        exc.orig
    ).startswith("no such table")


@contextlib.contextmanager
def translate(
    doing: str, *, on_integrity: type[CatalogError] = CatalogConflict
) -> Iterator[None]:
    """Turn SQLAlchemy and driver errors raised inside the block into CatalogError subclasses.

    Args:
        doing: what was being done, e.g. ``"adding stream tank/a@3 to store cold"``; it starts
            every message.
        on_integrity: the class raised for foreign-key and check violations (``ChainBroken``
            where chains are written); duplicate keys always raise ``CatalogConflict``.

    Raises:
        CatalogNotCurrent: a table is missing (run ``zbak init``).
        CatalogUnavailable: connection refused, authentication failed, database locked.
        on_integrity: a foreign-key or check constraint refused the write.
        CatalogConflict: a unique constraint refused the write.
        CatalogError: any other database error.
    """
    try:
        yield
    except ZbakError:
        raise
    except sa.exc.IntegrityError as exc:
        kind = integrity_kind(exc)
        cls = CatalogConflict if kind == "unique" else on_integrity
        raise cls(
            f"{doing}: the catalog database refused it ({kind} constraint:"
            f" {_driver_message(exc)})"
        ) from exc
    except (sa.exc.OperationalError, sa.exc.ProgrammingError) as exc:
        if _missing_table(exc):
            raise CatalogNotCurrent(
                f"{doing}: the catalog has no schema ({_driver_message(exc)}): run `zbak init`"
            ) from exc
        if isinstance(exc, sa.exc.OperationalError):
            raise CatalogUnavailable(
                f"{doing}: the catalog database is unavailable ({_driver_message(exc)}): check"
                " [catalog] url, that the server runs and accepts this user, or that no other"
                " process keeps the SQLite file locked"
            ) from exc
        raise CatalogError(f"{doing}: {_driver_message(exc)}") from exc
    except sa.exc.DBAPIError as exc:
        raise CatalogError(f"{doing}: {_driver_message(exc)}") from exc
    except sa.exc.SQLAlchemyError as exc:
        raise CatalogError(f"{doing}: {exc}") from exc


def make_engine(url: str) -> Engine:
    """Create the engine for catalog URL ``url`` (a SQLAlchemy URL string).

    SQLite file URLs: a missing parent directory is created with mode 0700 and a missing
    database file with mode 0600, whatever the umask; every connection gets
    ``foreign_keys=ON`` (without it SQLite ignores the chain constraints), WAL and a
    busy timeout of ``SQLITE_BUSY_TIMEOUT_MS``, and transactions start with ``BEGIN IMMEDIATE``
    so a read-then-write transaction waits for a concurrent writer instead of failing.
    ``postgresql://`` without a driver means psycopg 3.

    Raises:
        ExtraMissing: a PostgreSQL URL without psycopg installed (``zbak[postgresql]``).
        CatalogError: the URL does not parse, names an unknown driver, or the SQLite
            directory or file cannot be created.
    """
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise CatalogError(
            f"catalog url {url!r} is not a SQLAlchemy URL ({exc}): set [catalog] url to e.g."
            " sqlite:////var/lib/zbak/catalog.db or postgresql://USER@HOST/DB"
        ) from None
    require(for_catalog(parsed.drivername), CATALOG)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    backend = parsed.get_backend_name()
    try:
        if backend == "sqlite":
            _prepare_sqlite_file(parsed)
            engine = sa.create_engine(parsed)
            _configure_sqlite(engine)
        else:
            engine = sa.create_engine(parsed, pool_pre_ping=True)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as exc:
        raise CatalogError(
            f"cannot open catalog {_shown(parsed)}: {exc}; use a sqlite:// or postgresql:// URL"
        ) from None
    return engine


def _shown(url: URL) -> str:
    """The URL with its password hidden, for messages and logs."""
    return url.render_as_string(hide_password=True)


def _prepare_sqlite_file(url: URL) -> None:
    """Create the SQLite file's directory (0700) and the file itself (0600) when missing."""
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database).expanduser()
    try:
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(path.parent, 0o700)  # mkdir's mode is filtered through the umask
        if not path.exists():
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
    except FileExistsError:
        pass  # another process created it first; its mode is its own business
    except OSError as exc:
        raise CatalogError(
            f"cannot create the SQLite catalog {path}: {exc.strerror}; check that the state"
            " directory is writable or set [catalog] url"
        ) from None


def _configure_sqlite(engine: Engine) -> None:
    """Install the per-connection pragmas and explicit transaction control for SQLite."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event, not pysqlite, decide when transactions start
        # (SQLAlchemy docs, "Serializable isolation / Savepoints / Transactional DDL").
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            if engine.url.database not in (None, "", ":memory:"):
                cursor.execute("PRAGMA journal_mode=WAL")
        finally:
            cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        # A read-only transaction begins deferred: it takes no write lock, so it neither waits
        # for nor blocks a writer or another reader (WAL).
        reading = connection.get_execution_options().get(READING_OPTION)
        connection.exec_driver_sql("BEGIN" if reading else "BEGIN IMMEDIATE")


READING_OPTION = "zbak_reading"
"""Execution option marking an engine's transactions read-only (see :func:`reading`)."""


def reading(engine: Engine) -> Engine:
    """``engine`` for read-only transactions (same pool): on SQLite they begin deferred
    (``BEGIN``, no write lock), where writes begin ``BEGIN IMMEDIATE``; elsewhere unchanged."""
    return engine.execution_options(**{READING_OPTION: True})


def reads_concurrently(engine: Engine) -> bool:
    """Whether two threads reading through ``engine`` at once see the same database on
    their own connections: not for SQLite memory databases, whose pools give each thread its
    own database or share one connection (SQLAlchemy docs, "Threading/Pooling Behavior")."""
    return not isinstance(engine.pool, (sa.pool.SingletonThreadPool, sa.pool.StaticPool))


def migrations_dir() -> Path:
    """Return the Alembic script directory: ``migrations/`` beside the package, else installed.

    Raises:
        CatalogError: neither location holds an ``env.py``.
    """
    candidates = [
        Path(__file__).resolve().parents[2] / "migrations",
        Path(sys.prefix) / "share" / "zbak" / "migrations",
    ]
    for candidate in candidates:
        if (candidate / "env.py").is_file():
            return candidate
    raise CatalogError(
        "the catalog migrations are missing (looked in "
        + ", ".join(str(c) for c in candidates)
        + "): reinstall zbak"
    )


def _alembic_config(connection: sa.Connection | None = None) -> Config:
    """An Alembic Config pointing at :func:`migrations_dir`, optionally bound to ``connection``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """Return the single head revision of the migration scripts (e.g. ``"0001"``).

    Raises:
        CatalogError: the scripts have more than one head (a packaging bug).
    """
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_alembic_config())
    heads = script.get_heads()
    if len(heads) != 1:
        raise CatalogError(
            f"the catalog migrations have {len(heads)} heads {heads}: reinstall zbak"
        )
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    """Return the revision the database is at, ``None`` for an empty (never migrated) database.

    Reads ``alembic_version`` directly (what Alembic's ``MigrationContext`` reads; the
    table has one row once migrated, none after a downgrade to base).

    Raises:
        CatalogUnavailable: the database cannot be reached.
        CatalogError: any other database failure, or more than one version row (a database
            Alembic would call "multiple heads").
    """
    with translate(f"reading the schema revision of {_shown(engine.url)}"):
        with engine.connect() as connection:
            return _version_of(connection)


def _version_of(connection: sa.Connection) -> str | None:
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    rows = connection.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(rows) > 1:
        raise CatalogError(f"the catalog records {len(rows)} schema revisions {rows}: restore it"
                           " from a backup or ask for help; zbak will not guess")
    return rows[0] if rows else None


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Run ``alembic upgrade head`` on ``engine``; return ``(revision before, revision after)``.

    Idempotent: at head already, nothing changes and both values are the head. On PostgreSQL an
    advisory lock serialises concurrent upgrades; on SQLite ``BEGIN IMMEDIATE`` does.

    Raises:
        CatalogUnavailable: the database cannot be reached.
        CatalogError: a migration failed (the transaction is rolled back where the database
            supports transactional DDL).
    """
    from alembic import command

    with translate(f"upgrading the catalog schema of {_shown(engine.url)}"):
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
            before = _version_of(connection)
            command.upgrade(_alembic_config(connection), "head")
            after = _version_of(connection)
    if after is None:
        raise CatalogError(f"the catalog of {_shown(engine.url)} names no schema revision after"
                           " alembic upgrade head")
    return before, after


def downgrade(engine: Engine, revision: str) -> None:
    """Run ``alembic downgrade REVISION`` (``"base"`` empties the catalog: all rows are lost).

    Raises:
        CatalogUnavailable: the database cannot be reached.
        CatalogError: a migration failed.
    """
    from alembic import command

    with translate(f"downgrading the catalog schema of {_shown(engine.url)} to {revision}"):
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
            command.downgrade(_alembic_config(connection), revision)


def require_current(engine: Engine) -> None:
    """Check the catalog schema is at head before any command uses it.

    Raises:
        CatalogNotCurrent: the database is empty or at another revision; the message says
            ``catalog is at revision X, head is Y: run `zbak init```.
        CatalogUnavailable: the database cannot be reached.
    """
    current = current_revision(engine)
    head = HEAD_REVISION
    if current != head:
        shown = current if current is not None else "none (empty database)"
        raise CatalogNotCurrent(f"catalog is at revision {shown}, head is {head}: run `zbak init`")
