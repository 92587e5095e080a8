"""The ``catalog`` fixture: a real SQLite catalog in the test's tmp_path, migrated to the
head revision (Alembic), closed at teardown. A test module may define its own ``catalog``.
``catalogued_versions`` reads what a ``zbak`` process recorded of each volume's version,
``recorded_versions`` of every object's, ``set_recorded_locks`` moves the locks it recorded."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import sqlalchemy as sa

from zrepl_py.catalog import db
from zrepl_py.catalog.models import stream_table, volume_table
from zrepl_py.catalog.repository import Catalog
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY


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


def recorded_versions(catalog: Path) -> list[tuple[str, str]]:
    """``(key, version_id)`` of every object version the SQLite catalog file ``catalog``
    records: each stream's manifest and manifest copy, then each volume (keys below the
    store's prefix)."""
    engine = db.make_engine(f"sqlite:///{catalog}")
    try:
        s, v = stream_table.c, volume_table.c
        with engine.connect() as connection:
            found = []
            for prefix, manifest, copy in connection.execute(sa.select(
                    s.object_prefix, s.manifest_version_id, s.manifest_copy_version_id)
                    .order_by(s.id)):
                found += [(prefix + MANIFEST, manifest), (prefix + MANIFEST_COPY, copy)]
            return found + [(r[0], r[1]) for r in connection.execute(
                sa.select(v.key, v.version_id).order_by(v.id))]
    finally:
        engine.dispose()


def set_recorded_locks(catalog: Path, until: dt.datetime, *, under: str = "") -> None:
    """Make the SQLite catalog file ``catalog`` record ``until`` as the lock of every volume
    and manifest of the streams whose object prefix starts with ``under`` (what a test
    writes beside the same change in the store, to age a lock)."""
    engine = db.make_engine(f"sqlite:///{catalog}")
    try:
        with engine.begin() as connection:
            connection.execute(sa.update(volume_table).where(
                volume_table.c.key.startswith(under, autoescape=True)).values(
                retain_until=until))
            connection.execute(sa.update(stream_table).where(
                stream_table.c.object_prefix.startswith(under, autoescape=True)).values(
                manifest_retain_until=until))
    finally:
        engine.dispose()
