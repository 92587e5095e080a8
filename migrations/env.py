"""Alembic environment for the zbak catalog, driven from ``zrepl_py.catalog.db`` (no alembic.ini).

``zrepl_py.catalog.db.upgrade`` passes an open connection in ``config.attributes["connection"]``;
only online migrations are supported (offline SQL scripts would skip the SQLite pragmas).
"""

from __future__ import annotations

from alembic import context

from zrepl_py.catalog.models import metadata
from zrepl_py.daemon.store import include_object  # leaves the daemon's schedule table out

target_metadata = metadata


def run_migrations_online() -> None:
    """Run the migrations on the connection handed over by zbak."""
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError(
            "run catalog migrations through `zbak init` (zrepl_py.catalog.db.upgrade),"
            " not the alembic command line"
        )
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        include_object=include_object,
        # SQLite cannot ALTER constraints; later migrations rebuild tables in batch mode.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) catalog migrations are not supported")
run_migrations_online()
