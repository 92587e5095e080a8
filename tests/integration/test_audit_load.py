"""The graph audit as ``zbak audit`` loads it (the database checks volumes and carried
snapshots, ``audit.load``) finds exactly what the pure checks find over every row, on real
SQLite and PostgreSQL catalogs with one defect of each kind."""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3

import pytest
import sqlalchemy as sa
from support.postgres import migrated_engine

from zrepl_py.audit.findings import Severity
from zrepl_py.audit.graph import CarriedTable, GraphInput, audit_graph, volume_totals
from zrepl_py.audit.load import load_graph_input
from zrepl_py.catalog.models import (
    dataset_table,
    run_table,
    snapshot_table,
    stream_snapshot_table,
    stream_table,
    volume_table,
)
from zrepl_py.catalog.repository import Catalog

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
SHA = "ab" * 32


def guid(dataset: int, n: int) -> int:
    return 2**63 + 1000 * dataset + n  # above 2**63: stored negative, read back unsigned


@pytest.fixture
def engine(catalog_url):
    with migrated_engine(catalog_url) as engine:
        yield engine


@pytest.fixture
def catalog(engine):
    return Catalog(engine)


class Builder:
    """Rows written with plain INSERTs (past the repository's own checks, within the
    database's constraints): streams of snapshot numbers n (guid(d, n), createtxg 10n)."""

    def __init__(self):
        self.rows: dict[sa.Table, list[dict]] = {
            t: [] for t in (dataset_table, snapshot_table, stream_table, volume_table,
                            stream_snapshot_table, run_table)}
        self.next = {m: 0 for m in self.rows}

    def add(self, model, **row) -> int:
        self.next[model] += 1
        self.rows[model].append({"id": self.next[model], **row})
        return self.next[model]

    def dataset(self, name: str, snapshots: int, *, createtxg: dict[int, int] | None = None) -> int:
        d = self.add(dataset_table, host="local", name=name)
        for n in range(snapshots):
            self.add(snapshot_table, dataset_id=d, name=f"s{n}", guid=guid(d, n),
                     createtxg=(createtxg or {}).get(n, 10 * n), creation=T0 + n * HOUR,
                     first_seen=T0, destroyed_at=None)
        return d

    def stream(self, d: int, to: int, *, frm: int | None = None, parent: int | None = None,
               state: str = "verified", kind: str | None = None, carried=None,
               volumes=((0, 100, 10),)) -> int:
        kind = kind or ("full" if frm is None else "incremental")
        sid = self.next[stream_table] + 1
        self.add(stream_table, dataset_id=d, store="cold", kind=kind, parent_id=parent,
                 from_guid=None if frm is None else guid(d, frm),
                 to_guid=guid(d, to), from_name=None if frm is None else f"s{frm}",
                 to_name=f"s{to}", to_createtxg=10 * to,
                 raw_bytes=sum(v[1] for v in volumes) or 100,
                 stored_bytes=sum(v[2] for v in volumes) or 10,
                 object_prefix=f"local/{d}/{sid}/", storage_class="STANDARD",
                 compression="zstd", state=state, created_at=T0, uploaded_at=T0,
                 verified_at=None)
        snaps = carried if carried is not None else (
            (to,) if frm is None else range(frm + 1, to + 1))
        for n in snaps:
            self.add(stream_snapshot_table, stream_id=sid, name=f"s{n}", guid=guid(d, n),
                     createtxg=10 * n)
        for index, raw, stored in volumes:
            self.add(volume_table, stream_id=sid, index=index, key=f"local/{d}/{sid}/{index}",
                     raw_bytes=raw, stored_bytes=stored, sha256=SHA)
        return sid

    def write(self, engine: sa.Engine) -> None:
        with engine.begin() as conn:
            for model, rows in self.rows.items():
                if rows:
                    conn.execute(sa.insert(model), rows)


HOUR = dt.timedelta(hours=1)


def defective_catalog(engine: sa.Engine) -> dict[str, int]:
    """One healthy chain and one stream per defect; returns the defect streams by name."""
    b = Builder()
    ok = b.dataset("tank/ok", 10)
    f = b.stream(ok, 0)
    i = b.stream(ok, 4, frm=0, parent=f)
    b.stream(ok, 9, frm=4, parent=i, state="uploaded")
    bad = b.dataset("tank/bad", 40, createtxg={33: 999})
    s = {}
    s["gap"] = b.stream(bad, 0, volumes=((1, 100, 10),))
    b.stream(bad, 2, frm=0, parent=s["gap"])
    s["sums"] = b.stream(bad, 3, volumes=((0, 60, 5), (1, 40, 5)))
    catalog_sums = s["sums"]
    s["none"] = b.stream(bad, 5, volumes=())
    s["no tip"] = b.stream(bad, 7, carried=(6,))
    f2 = b.stream(bad, 10)
    s["outside"] = b.stream(bad, 14, frm=10, parent=f2, carried=(10, 12, 14))
    s["full of two"] = b.stream(bad, 16, carried=(15, 16))
    f3 = b.stream(bad, 20)
    s["bad"] = b.stream(bad, 24, frm=20, parent=f3, state="bad")
    b.stream(bad, 26, frm=24, parent=s["bad"])
    s["condemned"] = b.stream(bad, 28, state="condemned", volumes=())
    b.stream(bad, 29, frm=28, parent=s["condemned"])
    f4 = b.stream(bad, 30)
    s["conflict"] = b.stream(bad, 34, frm=30, parent=f4)
    b.stream(bad, 35, frm=34, parent=s["conflict"], state="uploading", volumes=())
    s["bare"] = b.stream(bad, 36, carried=())
    b.add(run_table, job="job", action="archive", target="cold:tank/bad",
          started_at=T0 + 39 * HOUR, ended_at=T0 + 40 * HOUR, result="ok", bytes=0, error=None)
    b.write(engine)
    # the volume rows of "sums" add up to 100 / 10 like the stream row: break the row
    with engine.begin() as conn:
        conn.execute(sa.update(stream_table).where(stream_table.c.id == catalog_sums)
                     .values(raw_bytes=101))
    return s


def in_memory(catalog: Catalog, loaded: GraphInput) -> GraphInput:
    """The same input with every stream, volume and carried row read into Python."""
    return GraphInput(streams=catalog.bulk_streams(host="local"),
                      volumes=volume_totals(catalog.bulk_volumes(host="local")),
                      carried=CarriedTable.from_mapping(catalog.bulk_carried(host="local")),
                      snapshots=loaded.snapshots, cursors=loaded.cursors,
                      archives=loaded.archives)


def test_the_database_screen_fails_exactly_the_streams_whose_volumes_or_carried_rows_break_a_rule(
        engine, catalog):
    s = defective_catalog(engine)
    assert catalog.screen_streams(host="local") == {
        s[k] for k in ("gap", "sums", "none", "no tip", "outside", "full of two")}
    assert catalog.screen_streams(host="local", below="tank/ok") == set()
    assert catalog.screen_streams(host="elsewhere") == set()


def test_the_loaded_audit_gives_the_same_findings_as_the_pure_checks_over_every_row(
        engine, catalog):
    s = defective_catalog(engine)
    # a cursor naming @s33 loads its snapshot row, whose createtxg (999) the carried row of
    # "conflict" contradicts
    catalog.set_cursor("job", "b:pool/x", "local", "tank/bad", "pool/x", "zfs", "s33",
                       guid(2, 33), 330, T0)
    loaded = load_graph_input(catalog, host="local", archives=[("job", "cold")],
                              cursors=catalog.cursors())
    # a file or server catalog runs the screen in a thread beside the link read
    assert catalog.reads_concurrently
    assert loaded.screened.failed == catalog.screen_streams(host="local")
    found = audit_graph(loaded)
    assert found == audit_graph(in_memory(catalog, loaded))
    errors = {f.stream: f.problem for f in found if f.severity is Severity.ERROR}
    words = {"gap": "numbered 1..1", "sums": "add up to 100 raw / 10 stored",
             "none": "no volumes", "no tip": "do not include its to-snapshot @s7",
             "outside": "@s10 outside its createtxg range (100, 140]",
             "full of two": "carries 2 snapshots", "bad": "it is bad",
             "condemned": "it is condemned", "conflict": "the source had it at 999"}
    for name, word in words.items():
        assert word in errors.get(s[name], ""), (name, found)
    assert s["bare"] not in errors
    # the newest snapshot before the last archive run (by createtxg: @s33, at 999) has no
    # restorable copy: a warning
    assert any(f.severity is Severity.WARNING and "tank/bad@s33" in f.problem
               and "no restorable chain" in f.problem for f in found)


def test_a_job_scope_reads_only_its_datasets(engine, catalog):
    defective_catalog(engine)
    loaded = load_graph_input(catalog, host="local", below="tank/ok")
    assert {s.dataset for s in loaded.streams} == {"tank/ok"}
    assert audit_graph(loaded) == []


def test_an_in_memory_sqlite_catalog_screens_in_line_and_finds_the_same_streams():
    """A memory database is one per thread (or one shared connection): no screen thread."""
    with migrated_engine("sqlite://") as engine:
        catalog = Catalog(engine)
        assert not catalog.reads_concurrently
        s = defective_catalog(engine)
        loaded = load_graph_input(catalog, host="local")
        assert loaded.screened.failed == {
            s[k] for k in ("gap", "sums", "none", "no tip", "outside", "full of two")}


def test_the_audit_reads_take_no_write_lock_on_sqlite(tmp_path):
    """Another process holding the write lock (an archive recording streams) does not make
    the audit's reads wait for it, nor does the audit block it (deferred transactions)."""
    path = tmp_path / "catalog.db"
    with migrated_engine(f"sqlite:///{path}") as engine:
        s = defective_catalog(engine)
        with contextlib.closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as writer:
            writer.execute("BEGIN IMMEDIATE")
            loaded = load_graph_input(Catalog(engine), host="local")
            assert s["gap"] in loaded.screened.failed and len(loaded.streams) == 20
            writer.execute("UPDATE streams SET verified_at = NULL")
            writer.execute("COMMIT")


def test_reads_scoped_to_each_dataset_give_together_what_the_whole_scope_gives(engine, catalog):
    """What ``audit.job`` reads per batch of datasets (``datasets=`` ids): the same rows and
    the same graph findings, dataset by dataset, as one read of the scope."""
    s = defective_catalog(engine)
    counts = catalog.dataset_streams(host="local")
    assert [(d.name, d.stores) for d in counts] == [("tank/bad", {"cold": 17}),
                                                   ("tank/ok", {"cold": 3})]
    assert catalog.dataset_streams(host="local", below="tank/ok")[0].streams == 3
    whole = load_graph_input(catalog, host="local", archives=[("job", "cold")])
    parts = [load_graph_input(catalog, host="local", archives=[("job", "cold")],
                              datasets=[d.id]) for d in counts]
    assert sorted(audit_graph(whole), key=repr) == sorted(
        (f for part in parts for f in audit_graph(part)), key=repr)
    assert set().union(*(p.screened.failed for p in parts)) == whole.screened.failed
    assert sorted(link for p in parts for link in p.streams) == sorted(whole.streams)
    for read in (catalog.bulk_streams, catalog.bulk_volumes, catalog.bulk_carried,
                 catalog.manifest_stamps):
        together = [read(host="local", datasets=[d.id]) for d in counts]
        if isinstance(together[0], dict):
            assert {k: v for t in together for k, v in t.items()} == read(host="local")
        else:
            assert [r for t in together for r in t] == read(host="local")
    assert {k: v for d in counts for k, v in
            catalog.known_snapshots(host="local", datasets=[d.id]).items()} == \
        catalog.known_snapshots(host="local")
    assert s["gap"] in parts[0].screened.failed
