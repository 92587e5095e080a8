"""The ``catalog`` fixture: a real SQLite catalog in the test's tmp_path, migrated to the
head revision (Alembic), closed at teardown. A test module may define its own ``catalog``.
``catalogued_versions`` reads what a ``zbak`` process recorded of each volume's version,
``recorded_versions`` of every object's, ``set_recorded_locks`` moves the locks it recorded.
``initialised_state`` gives a config's state dir what ``zbak init --no-checks`` leaves there,
copied from one real init per test process."""

from __future__ import annotations

import atexit
import datetime as dt
import shutil
import tempfile
import tomllib
from pathlib import Path

import pytest
import sqlalchemy as sa

from zrepl_py.catalog import db
from zrepl_py.catalog.models import stream_table, volume_table
from zrepl_py.catalog.repository import Catalog
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY

_template: Path | None = None
"""The state dir one real ``zbak init --no-checks`` made in this process (see
``initialised_state``); None until first asked for."""


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


def _template_state() -> Path:
    """The state dir of one real ``zbak init --no-checks`` process on a config with nothing
    but ``state_dir``, made on first use and removed when this process exits."""
    global _template
    if _template is None:
        from support.cli import run_zbak

        base = Path(tempfile.mkdtemp(prefix="zbak-init-template-"))
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        config = base / "zbak.toml"
        state = base / "state"
        config.write_text(f'state_dir = "{state}"\n')
        status, out, err = run_zbak("--config", str(config), "init", "--no-checks")
        assert status == ExitStatus.OK, out + err
        _template = state
    return _template


def initialised_state(config: Path) -> None:
    """Give ``config``'s new state dir what ``zbak init --no-checks`` leaves there: the 0700
    directory and its SQLite catalog migrated to the head revision, copied (modes kept) from
    the state dir of one real ``zbak init --no-checks`` this process ran
    (docs/decisions.md#tests-copy-a-freshly-initialised-catalog). For set-ups only: a test
    whose subject is ``zbak init`` runs it.

    Args:
        config: a zbak config file whose ``state_dir`` does not hold a catalog yet and that
            names no ``[catalog]`` (the catalog is the default ``STATE_DIR/catalog.sqlite``).

    Raises:
        AssertionError: the config names another catalog, the state dir already holds one,
            or the one real init failed.
    """
    doc = tomllib.loads(config.read_text())
    assert "catalog" not in doc, f"{config}: [catalog] is set; run zbak init for it"
    state = Path(doc["state_dir"])
    assert not (state / "catalog.sqlite").exists(), f"{state} already holds a catalog"
    shutil.copytree(_template_state(), state, dirs_exist_ok=True)
