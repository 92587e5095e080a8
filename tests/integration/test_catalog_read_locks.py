"""The catalog's read-only methods take no write lock on SQLite: ``zbak status``, ``list`` and
the planners read while another process (an archive recording streams, the daemon) holds
the write lock, without waiting for it (``CatalogBase._transaction(read_only=True)``: a
deferred ``BEGIN``, where writes begin ``BEGIN IMMEDIATE``)."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest
from support.postgres import migrated_engine

from zrepl_py.catalog import db
from zrepl_py.catalog.repository import Catalog

READS = {
    "cursors": lambda c: c.cursors(),
    "last_runs": lambda c: c.last_runs(),
    "running_runs": lambda c: c.running_runs("local"),
    "newest_run_time": lambda c: c.newest_run_time(),
    "snapshots_by_guid": lambda c: c.snapshots_by_guid([("local", "tank/a", 1)]),
    "dataset_names": lambda c: c.dataset_names(),
    "carried": lambda c: c.carried([1]),
    "thaws": lambda c: c.thaws([1]),
    "volume_totals": lambda c: c.volume_totals(),
    "volume_totals_of": lambda c: c.volume_totals_of([1]),
    "carried_columns": lambda c: c.carried_columns(),
    "carrying": lambda c: c.carrying([1]),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_a_read_does_not_wait_for_another_process_holding_the_write_lock(
        tmp_path, monkeypatch, read):
    # A write would fail at once; a read that waited would take the whole timeout
    # (docs/reliability.md#in-process-hooks-kept).
    monkeypatch.setattr(db, "SQLITE_BUSY_TIMEOUT_MS", 100)
    path = tmp_path / "catalog.db"
    with migrated_engine(f"sqlite:///{path}") as engine:
        catalog = Catalog(engine)
        catalog.dataset_id("local", "tank/a")
        with contextlib.closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as writer:
            writer.execute("BEGIN IMMEDIATE")
            READS[read](catalog)
            writer.execute("COMMIT")
