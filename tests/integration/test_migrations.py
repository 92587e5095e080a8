"""Alembic migrations and engine setup, on real SQLite and a real PostgreSQL 15 cluster."""

from __future__ import annotations

import datetime as dt
import os
import stat

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from support.common import free_port

from zrepl_py.catalog import db
from zrepl_py.catalog.models import metadata, volume_table
from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import DrillRow, NewStream, NewVolume
from zrepl_py.errors import CatalogError, CatalogNotCurrent, CatalogUnavailable

T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)


def _upgraded_from(engine: sa.Engine, revision: str) -> None:
    """Upgrade ``engine``'s catalog, at ``revision``, to the head, and check that its DDL
    then matches the models."""
    assert db.upgrade(engine) == (revision, db.head_revision())
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []


@pytest.fixture
def engine(catalog_url):
    """An engine on an empty catalog database of each backend."""
    engine = db.make_engine(catalog_url)
    yield engine
    engine.dispose()


def _full(catalog: Catalog, name: str, guid: int, txg: int) -> int:
    return catalog.add_stream(
        NewStream(
            dataset="tank/data", store="cold", kind="full", to_guid=guid, to_name=name,
            to_createtxg=txg, object_prefix=f"tank/data/{name}", storage_class="STANDARD",
            compression="zstd", created_at=T0,
        )
    )


def test_upgrade_from_empty_reaches_head_and_running_it_again_changes_nothing(engine):
    """docs/reliability.md#r27-alembic: upgrade from base reaches the head; a second upgrade is a
    no-op."""
    head = db.head_revision()
    assert db.current_revision(engine) is None
    assert db.upgrade(engine) == (None, head)
    assert db.upgrade(engine) == (head, head)
    assert db.current_revision(engine) == head


def test_the_migration_scripts_have_exactly_one_head():
    """docs/reliability.md#r27-alembic: a single head."""
    script = ScriptDirectory.from_config(db._alembic_config())
    assert len(script.get_heads()) == 1
    assert script.get_heads()[0] == db.head_revision()


def test_the_models_match_the_migrated_schema(engine):
    """docs/reliability.md#r27-alembic: the models match the DDL the migrations create."""
    db.upgrade(engine)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []


def test_every_check_constraint_of_the_models_exists_in_the_migrated_schema(engine):
    db.upgrade(engine)
    inspector = sa.inspect(engine)
    for table in metadata.sorted_tables:
        wanted = {c.name for c in table.constraints if isinstance(c, sa.CheckConstraint)}
        present = {c["name"] for c in inspector.get_check_constraints(table.name)}
        assert wanted <= present, table.name


def test_downgrade_to_base_drops_a_catalog_holding_a_chain_and_upgrade_rebuilds_it(engine):
    db.upgrade(engine)
    catalog = Catalog(engine)
    full = _full(catalog, "a", 1, 10)
    catalog.add_stream(
        NewStream(
            dataset="tank/data", store="cold", kind="incremental", parent_id=full, from_guid=1,
            to_guid=2, to_name="b", to_createtxg=20, object_prefix="tank/data/b",
            storage_class="STANDARD", compression="zstd", created_at=T0,
        )
    )
    db.downgrade(engine, "base")
    assert db.current_revision(engine) is None
    assert set(sa.inspect(engine).get_table_names()) <= {"alembic_version"}
    assert db.upgrade(engine) == (None, db.head_revision())
    assert Catalog(engine).streams() == []


def test_require_current_names_both_revisions_and_zbak_init_until_upgraded(engine):
    with pytest.raises(CatalogNotCurrent, match=rf"revision none .*head is {db.head_revision()}: run `zbak init`"):
        db.require_current(engine)
    db.upgrade(engine)
    db.require_current(engine)


def test_using_an_unmigrated_catalog_says_to_run_zbak_init(engine):
    with pytest.raises(CatalogNotCurrent, match="zbak init"):
        Catalog(engine).streams()


def test_sqlite_catalog_file_is_0600_in_a_0700_directory_under_umask_022(tmp_path):
    path = tmp_path / "state" / "deeper" / "catalog.db"
    old = os.umask(0o022)
    try:
        engine = db.make_engine(f"sqlite:///{path}")
        db.upgrade(engine)
        engine.dispose()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_every_sqlite_connection_enforces_foreign_keys_and_uses_wal(tmp_path):
    engine = db.make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0
    finally:
        engine.dispose()


def test_a_malformed_catalog_url_is_a_catalog_error_naming_the_setting():
    with pytest.raises(CatalogError, match=r"\[catalog\] url"):
        db.make_engine("not a url")


def test_an_unreachable_postgresql_server_is_reported_as_unavailable():
    engine = db.make_engine(f"postgresql://nobody:secret@127.0.0.1:{free_port()}/none")
    try:
        with pytest.raises(CatalogUnavailable) as caught:
            db.current_revision(engine)
        assert "secret" not in str(caught.value)
    finally:
        engine.dispose()


def test_concurrent_writers_on_one_sqlite_file_wait_for_each_other_instead_of_failing(tmp_path):
    import threading

    url = f"sqlite:///{tmp_path / 'c.db'}"
    setup = db.make_engine(url)
    db.upgrade(setup)
    setup.dispose()
    errors: list[BaseException] = []

    def writer(job: str) -> None:
        engine = db.make_engine(url)
        catalog = Catalog(engine)
        try:
            for _ in range(15):
                run = catalog.start_run(job, "snapshot", None, T0)
                catalog.sync_snapshots("local", f"tank/{job}", [], T0)  # read, then write
                catalog.finish_run(run, result="ok", now=T0)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=writer, args=(f"job{n}",)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    check = db.make_engine(url)
    assert len(Catalog(check).last_runs()) == 3
    check.dispose()


# -- docs/reliability.md#r27-alembic: up/down consistency and data migrations with rows present
# -------------------


def _revisions() -> list[str]:
    """Every revision, base first."""
    script = ScriptDirectory.from_config(db._alembic_config())
    return [r.revision for r in reversed(list(script.walk_revisions("base", "heads")))]


def _upgrade_to(engine, revision: str) -> None:
    from alembic import command

    with engine.begin() as connection:
        command.upgrade(db._alembic_config(connection), revision)


def _schema(engine) -> dict:
    """Tables with their columns (name, type, nullable), primary key, foreign keys, unique
    constraints, indexes and check constraints, as the database reports them (Alembic's own version table left
    out: it stays, empty, after a downgrade to base)."""
    inspector = sa.inspect(engine)
    return {
        table: (
            [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)],
            inspector.get_pk_constraint(table)["constrained_columns"],
            sorted((f["name"] or "", tuple(f["constrained_columns"]), f["referred_table"])
                   for f in inspector.get_foreign_keys(table)),
            sorted((u["name"] or "", tuple(u["column_names"]))
                   for u in inspector.get_unique_constraints(table)),
            sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                   for i in inspector.get_indexes(table)),
            sorted((c["name"] or "", " ".join(c["sqltext"].split()))
                   for c in inspector.get_check_constraints(table)),
        )
        for table in sorted(inspector.get_table_names()) if table != "alembic_version"
    }


def test_every_revision_downgrades_to_the_schema_before_it_and_upgrades_again_to_the_same(engine):
    """docs/reliability.md#r27-alembic (pytest-alembic ``test_up_down_consistency``, stairway): for
    each revision in order, upgrade, downgrade one step (the schema is what it was before),
    upgrade again (the schema is what the first upgrade made)."""
    revisions = _revisions()
    assert revisions[0] == "0001" and revisions[-1] == db.head_revision()
    for revision in revisions:
        before = _schema(engine)
        _upgrade_to(engine, revision)
        after = _schema(engine)
        assert after != before, f"revision {revision} changed nothing"
        db.downgrade(engine, "-1")
        assert _schema(engine) == before, f"downgrade of {revision} left another schema"
        _upgrade_to(engine, revision)
        assert _schema(engine) == after, f"upgrade of {revision} after a downgrade differs"
        assert db.current_revision(engine) == revision


def test_downgrading_0002_with_rows_present_keeps_the_chain_and_upgrading_again_works(engine):
    """docs/reliability.md#r27-alembic (data migrations with rows present): a chain with carried
    snapshots and a thaw request in 0002; downgrade to 0001 keeps the streams and drops only what
    0002 added; upgrade back to head with those rows present; the models still match and the catalog
    accepts new rows."""
    from zrepl_py.objects.manifest import CarriedSnapshot

    db.upgrade(engine)
    catalog = Catalog(engine)
    full = catalog.add_stream(
        NewStream(dataset="tank/data", store="cold", kind="full", to_guid=1, to_name="a",
                  to_createtxg=10, object_prefix="tank/data/a", storage_class="GLACIER",
                  compression="zstd", created_at=T0),
        carried=[CarriedSnapshot("a", 1, 10)])
    catalog.add_stream(
        NewStream(dataset="tank/data", store="cold", kind="incremental", parent_id=full,
                  from_guid=1, from_name="a", to_guid=2, to_name="c", to_createtxg=30,
                  object_prefix="tank/data/c", storage_class="GLACIER", compression="zstd",
                  created_at=T0),
        carried=[CarriedSnapshot("b", 9, 20), CarriedSnapshot("c", 2, 30)])
    catalog.record_thaw(full, tier="Standard", days=7, requested_at=T0,
                        ready_by=T0 + dt.timedelta(hours=5))
    streams_before = catalog.streams()

    db.downgrade(engine, "0001")
    assert db.current_revision(engine) == "0001"
    tables = set(sa.inspect(engine).get_table_names())
    assert "streams" in tables and not {"stream_snapshots", "thaw_requests"} & tables
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT to_name, parent_id FROM streams ORDER BY id"))
        assert [tuple(r) for r in rows] == [("a", None), ("c", full)]

    _upgraded_from(engine, "0001")
    catalog = Catalog(engine)
    assert catalog.streams() == streams_before
    assert catalog.carried([s.id for s in streams_before]) == {s.id: [] for s in streams_before}
    assert catalog.thaws([full]) == {}
    tip = catalog.add_stream(
        NewStream(dataset="tank/data", store="cold", kind="incremental",
                  parent_id=streams_before[1].id, from_guid=2, from_name="c", to_guid=3,
                  to_name="d", to_createtxg=40, object_prefix="tank/data/d",
                  storage_class="GLACIER", compression="zstd", created_at=T0),
        carried=[CarriedSnapshot("d", 3, 40)])
    assert [c.name for c in catalog.carried([tip])[tip]] == ["d"]


def test_0006_keeps_bad_streams_bad_across_a_downgrade_and_their_reason_reads_as_not_recorded(
        engine):
    """docs/reliability.md#r27-alembic (rows present): streams marked bad with a reason at head;
    downgrading to 0005 keeps every row and its state and drops only the reasons; upgrading back
    leaves those reasons NULL, which readers state as not recorded, and new marks record theirs."""
    db.upgrade(engine)
    catalog = Catalog(engine)
    full = _full(catalog, "a", 1, 10)
    tip = catalog.add_stream(
        NewStream(dataset="tank/data", store="cold", kind="incremental", parent_id=full,
                  from_guid=1, from_name="a", to_guid=2, to_name="b", to_createtxg=20,
                  object_prefix="tank/data/b", storage_class="STANDARD", compression="zstd",
                  created_at=T0, state="uploaded", uploaded_at=T0))
    catalog.set_stream_state(tip, "bad", T0, reason="volume 0 (tank/data/b/vol-000000.zst)"
                             " is missing")
    assert catalog.stream(tip).bad_reason.endswith("is missing")

    db.downgrade(engine, "0005")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("streams")}
    assert "bad_reason" not in columns
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT id, state FROM streams ORDER BY id"))
        assert [tuple(r) for r in rows] == [(full, "uploading"), (tip, "bad")]

    _upgraded_from(engine, "0005")
    catalog = Catalog(engine)
    old = catalog.stream(tip)
    assert old.state == "bad" and old.bad_reason is None
    assert "not recorded" in old.why_bad
    catalog.set_stream_state(full, "bad", T0, reason="zfs receive rejected its content")
    assert catalog.stream(full).bad_reason == "zfs receive rejected its content"


def test_a_stream_is_marked_bad_only_with_a_reason_and_no_other_state_takes_one(engine):
    db.upgrade(engine)
    catalog = Catalog(engine)
    full = _full(catalog, "a", 1, 10)
    with pytest.raises(ValueError, match="reason"):
        catalog.set_stream_state(full, "bad", T0)
    with pytest.raises(ValueError, match="reason"):
        catalog.set_stream_state(full, "uploaded", T0, reason="why")
    assert catalog.stream(full).state == "uploading"


def _drill(job: str, source: str, minutes: int, result: str, **more) -> DrillRow:
    at = T0 + dt.timedelta(minutes=minutes)
    return DrillRow(job=job, source=source, kind="store", started_at=at,
                    ended_at=at + dt.timedelta(seconds=30), result=result, **more)


def test_0008_drops_the_drills_and_drill_runs_on_downgrade_keeps_every_other_run_and_upgrades_again(
        engine):
    """docs/reliability.md#r27-alembic (rows present): drills and drill runs at head; downgrading
    to 0007 drops the table and only the drill runs (a failover run stays) (the older action set has no place for
    them); upgrading back with the other runs present gives an empty drills table that takes new
    rows, and a drill run again."""
    db.upgrade(engine)
    catalog = Catalog(engine)
    catalog.record_drill(_drill("j", "cold", 0, "ok", seconds=12.5, bytes=4096, datasets=1,
                                files=3, snapshot="s1"))
    kept = catalog.start_run("j", "archive", "cold:tank/data", T0)
    failover = catalog.start_run("j", "failover", "backup:tank/data", T0)
    catalog.finish_run(catalog.start_run("j", "drill", "cold", T0), result="ok", now=T0)

    db.downgrade(engine, "0007")
    assert "drills" not in sa.inspect(engine).get_table_names()
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT id, action FROM runs ORDER BY id"))
        assert [tuple(r) for r in rows] == [(kept, "archive"), (failover, "failover")]
    with pytest.raises(CatalogError):  # the older check refuses a drill run
        Catalog(engine).start_run("j", "drill", "cold", T0)

    _upgraded_from(engine, "0007")
    catalog = Catalog(engine)
    assert catalog.last_drills() == []
    catalog.record_drill(_drill("j", "cold", 5, "failed", detail="volume 0 is corrupt"))
    assert [d.result for d in catalog.last_drills("j")] == ["failed"]
    assert catalog.start_run("j", "drill", "cold", T0) > kept


def test_the_newest_drill_and_the_newest_success_are_read_per_job_and_source(engine):
    db.upgrade(engine)
    catalog = Catalog(engine)
    catalog.record_drill(_drill("j", "cold", 0, "ok", seconds=10.0, bytes=100, datasets=1))
    catalog.record_drill(_drill("j", "cold", 10, "failed", detail="tampered"))
    catalog.record_drill(_drill("j", "backup:tank/r", 5, "ok", seconds=3.0, bytes=50, datasets=1))
    catalog.record_drill(_drill("j", "backup:tank/r", 15, "skipped", detail="no identity"))
    catalog.record_drill(_drill("k", "cold", 20, "ok", seconds=1.0, bytes=1, datasets=1))
    newest = {(d.job, d.source): d.result for d in catalog.last_drills()}
    assert newest == {("j", "cold"): "failed", ("j", "backup:tank/r"): "skipped",
                      ("k", "cold"): "ok"}
    ok = {(d.job, d.source): d.seconds for d in catalog.last_drill_successes("j")}
    assert ok == {("j", "cold"): 10.0, ("j", "backup:tank/r"): 3.0}
    with pytest.raises(ValueError, match="drill result"):
        catalog.record_drill(_drill("j", "cold", 30, "bogus"))


def test_0009_drops_the_copy_runs_on_downgrade_keeps_every_other_run_and_upgrades_again(engine):
    """docs/reliability.md#r27-alembic (rows present): a copy run at head; downgrading to 0008
    drops only the copy runs (the older action set has no place for them) and refuses new
    ones; upgrading back with the other runs present takes copy runs again."""
    db.upgrade(engine)
    catalog = Catalog(engine)
    kept = catalog.start_run("j", "archive", "cold:tank/data", T0)
    drill = catalog.start_run("j", "drill", "cold", T0)
    catalog.finish_run(catalog.start_run("j", "copy", "offsite:tank/data", T0), result="ok",
                       now=T0)

    db.downgrade(engine, "0008")
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT id, action FROM runs ORDER BY id"))
        assert [tuple(r) for r in rows] == [(kept, "archive"), (drill, "drill")]
    with pytest.raises(CatalogError):  # the older check refuses a copy run
        Catalog(engine).start_run("j", "copy", "offsite:tank/data", T0)

    _upgraded_from(engine, "0008")
    assert Catalog(engine).start_run("j", "copy", "offsite:tank/data", T0) > drill


def _volume_versions(engine) -> list[tuple]:
    """Each volume's stream, key, version id and retain-until (aware UTC), in id order."""
    v = volume_table.c
    with engine.connect() as connection:
        rows = connection.execute(sa.select(v.stream_id, v.key, v.version_id, v.retain_until)
                                  .order_by(v.id))
        return [tuple(r) for r in rows]


def test_0010_keeps_every_volume_across_a_downgrade_and_its_versions_read_as_unknown_after(
        engine):
    """docs/reliability.md#r27-alembic (rows present): a stream whose volumes have a stored
    version (one locked, one not) and a stream without; downgrading to 0009 drops only the two
    columns, every volume stays; upgrading back leaves them NULL (not known), and a new stream
    records its versions and lock date."""
    db.upgrade(engine)
    catalog = Catalog(engine)
    sha = "ab" * 32
    until = T0 + dt.timedelta(days=30)
    locked = catalog.add_stream(
        NewStream(dataset="tank/data", store="cold", kind="full", to_guid=1, to_name="a",
                  to_createtxg=10, object_prefix="tank/data/a", storage_class="STANDARD",
                  compression="zstd", created_at=T0),
        [NewVolume(0, "tank/data/a/vol-000000.zst", 10, 5, sha, "v-locked", until),
         NewVolume(1, "tank/data/a/vol-000001.zst", 10, 5, sha, "v-open", None)])
    plain = catalog.add_stream(
        NewStream(dataset="tank/data", store="dir", kind="full", to_guid=1, to_name="a",
                  to_createtxg=10, object_prefix="tank/data/a", storage_class="STANDARD",
                  compression="zstd", created_at=T0),
        [NewVolume(0, "tank/data/a/vol-000000.zst", 10, 5, sha)])
    assert _volume_versions(engine) == [
        (locked, "tank/data/a/vol-000000.zst", "v-locked", until),
        (locked, "tank/data/a/vol-000001.zst", "v-open", None),
        (plain, "tank/data/a/vol-000000.zst", None, None)]

    db.downgrade(engine, "0009")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("volumes")}
    assert not {"version_id", "retain_until"} & columns
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT stream_id, key FROM volumes ORDER BY id"))
        assert [tuple(r) for r in rows] == [
            (locked, "tank/data/a/vol-000000.zst"), (locked, "tank/data/a/vol-000001.zst"),
            (plain, "tank/data/a/vol-000000.zst")]

    _upgraded_from(engine, "0009")
    assert [v[2:] for v in _volume_versions(engine)] == [(None, None)] * 3
    catalog = Catalog(engine)
    tip = catalog.add_stream(
        NewStream(dataset="tank/data", store="cold", kind="incremental", parent_id=locked,
                  from_guid=1, from_name="a", to_guid=2, to_name="b", to_createtxg=20,
                  object_prefix="tank/data/b", storage_class="STANDARD", compression="zstd",
                  created_at=T0),
        [NewVolume(0, "tank/data/b/vol-000000.zst", 10, 5, sha, "v-new", until)])
    assert _volume_versions(engine)[-1] == (tip, "tank/data/b/vol-000000.zst", "v-new", until)


def test_0011_keeps_every_stream_across_a_downgrade_and_its_manifest_versions_read_as_unknown(
        engine):
    """docs/reliability.md#r27-alembic (rows present): a stream recording its manifest's
    versions and lock and a stream without; downgrading to 0010 drops only the three columns,
    both streams stay; upgrading back leaves them NULL (``Catalog.manifest_locks`` names
    none), and a new stream records its manifest versions, whose date the rolling lock
    moves (``set_manifest_retain_until``)."""
    db.upgrade(engine)
    catalog = Catalog(engine)
    until = T0 + dt.timedelta(days=30)

    def stream(name: str, guid: int, store: str = "cold", **versions) -> NewStream:
        return NewStream(dataset="tank/data", store=store, kind="full", to_guid=guid,
                         to_name=name, to_createtxg=guid * 10,
                         object_prefix=f"tank/data/{name}/", storage_class="STANDARD",
                         compression="zstd", created_at=T0, **versions)

    locked = catalog.add_stream(stream("a", 1, manifest_version_id="m-a",
                                       manifest_copy_version_id="c-a",
                                       manifest_retain_until=until))
    plain = catalog.add_stream(stream("a", 1, store="dir"))
    assert catalog.manifest_locks([locked, plain]) == [(locked, "m-a", "c-a", until)]

    db.downgrade(engine, "0010")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("streams")}
    assert not {"manifest_version_id", "manifest_copy_version_id",
                "manifest_retain_until"} & columns
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT id, store FROM streams ORDER BY id"))
        assert [tuple(r) for r in rows] == [(locked, "cold"), (plain, "dir")]

    _upgraded_from(engine, "0010")
    catalog = Catalog(engine)
    assert catalog.manifest_locks([locked, plain]) == []
    new = catalog.add_stream(stream("b", 2, manifest_version_id="m-b",
                                    manifest_copy_version_id="c-b", manifest_retain_until=until))
    later = until + dt.timedelta(days=1)
    catalog.set_manifest_retain_until({new: later})
    assert catalog.manifest_locks([locked, plain, new]) == [(new, "m-b", "c-b", later)]


def test_0012_keeps_every_stream_across_a_downgrade_and_its_recipients_read_as_unknown(engine):
    """docs/reliability.md#r27-alembic (rows present): a sealed stream recording its age
    recipients and a plain one; downgrading to 0011 drops only ``streams.sealed_to``, both
    streams stay; upgrading back reads the sealed one's recipients as not known (None), and a
    new stream records them again (docs/sealed.md#changing-the-recipients)."""
    db.upgrade(engine)
    catalog = Catalog(engine)
    keys = ("age1" + "a" * 58, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC")

    def stream(name: str, guid: int, store: str, **sealed) -> NewStream:
        return NewStream(dataset="tank/data", store=store, kind="full", to_guid=guid,
                         to_name=name, to_createtxg=guid * 10,
                         object_prefix=f"tank/data/{name}/", storage_class="STANDARD",
                         compression="zstd+age" if sealed else "zstd", created_at=T0,
                         **sealed)

    sealed = catalog.add_stream(stream("a", 1, "cold", sealed_to=keys))
    plain = catalog.add_stream(stream("a", 1, "dir"))
    assert [(s.id, s.sealed_to) for s in catalog.streams()] == [(sealed, keys), (plain, None)]

    db.downgrade(engine, "0011")
    assert "sealed_to" not in {c["name"] for c in sa.inspect(engine).get_columns("streams")}
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT id, store FROM streams ORDER BY id"))
        assert [tuple(r) for r in rows] == [(sealed, "cold"), (plain, "dir")]

    _upgraded_from(engine, "0011")
    catalog = Catalog(engine)
    assert [(s.id, s.sealed_to) for s in catalog.streams()] == [(sealed, None), (plain, None)]
    new = catalog.add_stream(stream("b", 2, "cold", sealed_to=keys[:1]))
    assert catalog.stream(new).sealed_to == keys[:1]
