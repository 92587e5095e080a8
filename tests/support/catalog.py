"""The ``catalog`` fixture: a real SQLite catalog in the test's tmp_path, migrated to the
head revision (Alembic), closed at teardown. A test module may define its own ``catalog``."""

from __future__ import annotations

import pytest

from zrepl_py.catalog import db
from zrepl_py.catalog.repository import Catalog


@pytest.fixture
def catalog(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'catalog.sqlite'}")
    db.upgrade(engine)
    yield Catalog(engine)
    engine.dispose()
