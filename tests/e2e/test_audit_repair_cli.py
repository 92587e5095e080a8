"""``zbak audit`` is read-only; ``--max-duration`` rotates; ``--repair`` is separate, asks
first and only makes safe repairs
(docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit): real zfs-fuse pool,
chains written by ``zbak archive`` into a ``file://`` store, the CLI run in-process."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import support.cli
from support.cli import file_archive_config, prop, zfs

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs


class Zbak(support.cli.Zbak):
    def engine(self):
        from zrepl_py.catalog.db import make_engine
        from zrepl_py.config.loading import load_config

        return make_engine(load_config(self.config).catalog_url)

    def catalog(self):
        from zrepl_py.catalog.repository import Catalog

        return Catalog(self.engine())

    def json(self, *args):
        status, out, err = self(*args, "--json")
        return status, json.loads(out) if out.strip() else None, err


@pytest.fixture
def archived(zpool, tmp_path, capsys):
    """DATA archived to a file:// store as a full @0, an incremental @0 -> @1 and one
    @1 -> @2 (three streams, one volume each)."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    config, store = file_archive_config(tmp_path, data)
    run = Zbak(config, capsys)
    assert run("init", "--no-checks")[0] == ExitStatus.OK
    for step in range(3):
        (mount / f"f{step}.bin").write_bytes(os.urandom(100_000))
        zfs("snapshot", f"{data}@{step}")
        status, out, err = run("archive")
        assert status == ExitStatus.OK, out + err
    return run, data, store


def store_state(store: Path) -> dict[str, str]:
    """Every file of the store (temporary files too) with its SHA-256."""
    return {str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file()}


AUDIT_MEMORY = {"manifest_seen", "manifest_read_at"}
"""Columns where an audit notes which manifests it read (``catalog.stamps``)."""


def catalog_state(run) -> dict[str, list]:
    """Every catalog table but ``runs`` (each audit records its own run), row by row, and
    without the audit's notes of the manifests it read."""
    engine = run.engine()
    meta = sa.MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        return {name: sorted(map(tuple, conn.execute(sa.select(
                    *(c for c in table.columns if c.name not in AUDIT_MEMORY))).all()), key=repr)
                for name, table in meta.tables.items() if name != "runs"}


def test_a_plain_audit_changes_neither_the_store_nor_the_catalog(archived):
    """docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit: ``zbak audit``
    without --deep or --repair is read-only (but for its run and its notes of the manifests it
    read), even on a store with a leftover temporary file and a condemned stream it reports."""
    run, data, store = archived
    newest = max(run.catalog().streams(dataset=data), key=lambda s: s.to_createtxg)
    run.catalog().condemn_streams([newest.id])
    stray = next(store.rglob("*.zst")).parent / ".vol.partial-abcd1234"
    stray.write_bytes(b"half an upload")
    os.utime(stray, (time.time() - 30 * 86400,) * 2)
    store_before, catalog_before = store_state(store), catalog_state(run)
    status, doc, err = run.json("audit")
    assert status == ExitStatus.AUDIT_FINDINGS, (doc, err)  # the unfinished prune is reported
    assert store_state(store) == store_before
    assert catalog_state(run) == catalog_before


def test_max_duration_reads_at_least_one_stream_per_run_least_recently_verified_first(archived):
    """docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit (borg check
    --max-duration): with a budget of 0 s each run reads one stream, the least recently verified;
    progress survives between runs (separate invocations), so three runs verify all three streams
    and the fourth starts over."""
    run, data, store = archived
    ids = sorted(s.id for s in run.catalog().streams(dataset=data))
    seen = []
    for _ in range(4):
        status, doc, err = run.json("audit", "--deep", "--max-duration", "0")
        assert status == ExitStatus.OK, (doc, err)
        job = doc["jobs"][0]
        seen += job["verified"]
        assert len(job["verified"]) == 1
        assert job["not_read"] == 2
        assert any("--max-duration ran out" in f["problem"] for f in doc["findings"])
    assert seen == ids + [ids[0]]
    assert all(s.state == "verified" for s in run.catalog().streams(dataset=data))


def test_max_duration_large_enough_reads_everything(archived):
    """docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit: a budget that
    does not run out changes nothing."""
    run, data, store = archived
    status, doc, err = run.json("audit", "--max-duration", "3600")
    assert status == ExitStatus.OK and doc["deep"] is True, (doc, err)
    assert len(doc["jobs"][0]["verified"]) == 3 and doc["jobs"][0]["not_read"] == 0


def _damage(run, data, store):
    """A stale temporary file (8 days old), a fresh one, and the newest stream condemned
    as by a prune that stopped before deleting it."""
    oldest = min(run.catalog().streams(dataset=data), key=lambda s: s.to_createtxg)
    folder = store / oldest.object_prefix  # not the condemned stream's: that one goes whole
    stale, fresh = folder / ".vol.partial-stale001", folder / ".vol.partial-fresh001"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    os.utime(stale, (time.time() - 8 * 86400,) * 2)
    newest = max(run.catalog().streams(dataset=data), key=lambda s: s.to_createtxg)
    run.catalog().condemn_streams([newest.id])
    return stale, fresh, newest


def test_repair_without_yes_and_without_a_terminal_is_refused_and_changes_nothing(archived):
    """docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit: --repair is
    explicit: no terminal to ask on and no --yes is a usage error, and neither the store nor the
    catalog changes."""
    run, data, store = archived
    _damage(run, data, store)
    store_before, catalog_before = store_state(store), catalog_state(run)
    status, out, err = run("audit", "--repair")
    assert status == ExitStatus.USAGE and "--yes" in err
    assert store_state(store) == store_before and catalog_state(run) == catalog_before


def test_repair_aborts_stale_uploads_and_finishes_an_interrupted_prune_then_audits_clean(archived):
    """docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit / 15: ``--repair
    --yes`` removes the temporary file older than --stale-uploads-days (not the fresh one) and
    deletes the condemned stream's objects, then its row; the audit that follows no longer reports
    an unfinished prune, and a second repair has nothing left to do."""
    run, data, store = archived
    stale, fresh, newest = _damage(run, data, store)
    prefix = newest.object_prefix
    assert any(k.startswith(prefix) for k in store_state(store))
    status, doc, err = run.json("audit", "--repair", "--yes", "--stale-uploads-days", "7")
    # what remains is the truth after the prune: @2 is no longer archived
    assert status == ExitStatus.AUDIT_FINDINGS, (doc, err)
    fresh_key = str(fresh.parent.relative_to(store) / "vol")
    assert [(f["severity"], f["problem"].split(" (")[0]) for f in doc["findings"]] == [
        ("warning", f"local:{data}@2"),
        ("info", f"an unfinished upload of {fresh_key}")]  # the fresh one, reported
    (repair,) = doc["repair"]
    assert repair["finished_streams"] == [newest.id] and repair["errors"] == {}
    assert len(repair["aborted_uploads"]["cold"]) == 1
    assert not stale.exists() and fresh.exists()
    assert [k for k in store_state(store) if k.startswith(prefix)] == []
    assert newest.id not in {s.id for s in run.catalog().streams(dataset=data)}
    assert run.json("audit", "--repair", "--yes")[1]["repair"][0]["finished_streams"] == []


def test_prune_and_repair_take_the_datasets_exclusive_lock_and_exit_3_when_it_is_held(archived):
    """docs/reliability.md#r28-concurrent-runs: while another run holds the job's dataset lock,
    ``zbak prune`` and ``zbak audit --repair`` fail fast with exit 3 (Locked) and change
    nothing."""
    from zrepl_py.locking import dataset_lock

    run, data, store = archived
    newest = max(run.catalog().streams(dataset=data), key=lambda s: s.to_createtxg)
    run.catalog().condemn_streams([newest.id])
    before = store_state(store), catalog_state(run)
    with dataset_lock(run.config.parent / "state", f"local:{data}", "replicate", heartbeat=0):
        for args in (("prune",), ("audit", "--repair", "--yes")):
            status, out, err = run(*args)
            assert status == ExitStatus.LOCKED and "locked by" in err, out + err
    assert (store_state(store), catalog_state(run)) == before
