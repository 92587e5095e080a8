"""The ``catalog`` fixture: a real SQLite catalog in the test's tmp_path, migrated to the
head revision (Alembic), closed at teardown. A test module may define its own ``catalog``.
``catalogued_versions`` reads what a ``zbak`` process recorded of each volume's version."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from zrepl_py.catalog import db
from zrepl_py.catalog.models import volume_table
from zrepl_py.catalog.repository import Catalog


@pytest.fixture
def catalog(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'catalog.sqlite'}")
    db.upgrade(engine)
    yield Catalog(engine)
    engine.dispose()


def catalogued_versions(catalog: Path) -> list[tuple]:
    """``(key, version_id, retain_until)`` of every volume in the SQLite catalog file
    ``catalog``, in id order."""
    engine = db.make_engine(f"sqlite:///{catalog}")
    try:
        v = volume_table.c
        with engine.connect() as connection:
            return [tuple(r) for r in connection.execute(
                sa.select(v.key, v.version_id, v.retain_until).order_by(v.id))]
    finally:
        engine.dispose()
