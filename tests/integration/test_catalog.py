"""The catalog repository on real SQLite and PostgreSQL: exact values, runs, cursors, chains."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
import sqlalchemy as sa
from support.postgres import migrated_engine

from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import CursorRow, NewStream, NewVolume, SnapshotFact
from zrepl_py.catalog.types import to_signed64
from zrepl_py.errors import CatalogConflict, ChainBroken, NotInCatalog

UTC = dt.UTC
T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
SHA = "ab" * 32


@pytest.fixture
def engine(catalog_url):
    """An engine on a catalog migrated to head, on each backend."""
    with migrated_engine(catalog_url) as engine:
        yield engine


@pytest.fixture
def catalog(engine):
    return Catalog(engine)


def fact(name: str, guid: int, txg: int, at: dt.datetime = T0) -> SnapshotFact:
    return SnapshotFact(name=name, guid=guid, createtxg=txg, creation=at)


def stream(to_name: str, to_guid: int, txg: int, *, parent: int | None = None,
           from_guid: int | None = None, store: str = "cold", prefix: str | None = None,
           dataset: str = "tank/data") -> NewStream:
    return NewStream(
        dataset=dataset, store=store, kind="full" if parent is None else "incremental",
        parent_id=parent, from_guid=from_guid, to_guid=to_guid, to_name=to_name,
        to_createtxg=txg, object_prefix=prefix or f"{dataset}/{to_name}",
        storage_class="DEEP_ARCHIVE", compression="zstd", created_at=T0,
    )


def chain(catalog: Catalog) -> tuple[int, int, int]:
    """full @a (guid 1) -> inc @b (guid 2) -> inc @c (guid 3)."""
    full = catalog.add_stream(stream("a", 1, 10))
    inc1 = catalog.add_stream(stream("b", 2, 20, parent=full, from_guid=1))
    inc2 = catalog.add_stream(stream("c", 3, 30, parent=inc1, from_guid=2))
    return full, inc1, inc2


def raw_incremental(parent_id: int, from_guid: int, to_guid: int, prefix: str, dataset_id: int):
    """A hand-written INSERT that bypasses the repository entirely."""
    return sa.text(
        "INSERT INTO streams (dataset_id, store, kind, parent_id, from_guid, to_guid, to_name,"
        " to_createtxg, raw_bytes, stored_bytes, object_prefix, storage_class, compression,"
        " state, created_at) VALUES (:ds, 'cold', 'incremental', :parent, :from_guid, :to_guid,"
        " 'x', 99, 0, 0, :prefix, 'GLACIER', 'zstd', 'uploaded', :at)"
    ).bindparams(
        ds=dataset_id, parent=parent_id, from_guid=to_signed64(from_guid),
        to_guid=to_signed64(to_guid), prefix=prefix, at=T0.replace(tzinfo=None),
    )


# -- exact values -------------------------------------------------------------------------

@pytest.mark.parametrize("guid", [0, 2**63 - 1, 2**63, 2**64 - 1])
def test_guids_round_trip_exactly_across_the_whole_unsigned_64_bit_range(catalog, guid):
    catalog.sync_snapshots("local", "tank/data", [fact("s", guid, 5)], T0)
    catalog.set_cursor("job", "b:pool/x", "local", "tank/data", "pool/x", "zfs", "s", guid, 5, T0)
    full = catalog.add_stream(stream("s", guid, 5))
    assert [s.guid for s in catalog.snapshots()] == [guid]
    assert catalog.cursors()[0].guid == guid
    assert catalog.stream(full).to_guid == guid


def test_times_come_back_aware_utc_whatever_offset_they_were_given_in(catalog):
    cest = dt.timezone(dt.timedelta(hours=2))
    local_time = dt.datetime(2024, 5, 1, 14, 30, 15, 123456, tzinfo=cest)
    catalog.sync_snapshots("local", "tank/data", [fact("s", 1, 5, local_time)], local_time)
    row = catalog.snapshots()[0]
    assert row.creation == local_time and row.first_seen == local_time
    assert row.creation.tzinfo == UTC and row.creation.hour == 12
    run = catalog.start_run("job", "snapshot", None, local_time)
    catalog.finish_run(run, result="ok", now=local_time + HOUR)
    assert catalog.last_runs()[0].ended_at.utcoffset() == dt.timedelta(0)


def test_naive_datetimes_are_refused_before_reaching_the_database(catalog):
    with pytest.raises(ValueError, match="aware"):
        catalog.start_run("job", "snapshot", None, dt.datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="aware"):
        catalog.sync_snapshots("local", "tank/data", [fact("s", 1, 5, T0.replace(tzinfo=None))], T0)


def test_dataset_id_is_stable_per_host_and_name_including_spaces_and_colons(catalog):
    first = catalog.dataset_id("local", "tank/my data:2")
    assert catalog.dataset_id("local", "tank/my data:2") == first
    assert catalog.dataset_id("backup", "tank/my data:2") != first


# -- snapshots ----------------------------------------------------------------------------

def test_sync_adds_new_snapshots_and_tombstones_the_ones_zfs_no_longer_lists(catalog):
    first = catalog.sync_snapshots("local", "tank/data", [fact("a", 1, 10), fact("b", 2, 20)], T0)
    assert (first.added, first.gone) == (2, 0)
    second = catalog.sync_snapshots("local", "tank/data", [fact("b", 2, 20), fact("c", 3, 30)],
                                    T0 + HOUR)
    assert (second.added, second.gone) == (1, 1)
    assert [s.name for s in catalog.snapshots()] == ["b", "c"]
    everything = catalog.snapshots(include_destroyed=True)
    assert [(s.name, s.destroyed_at) for s in everything] == [
        ("a", T0 + HOUR), ("b", None), ("c", None)
    ]
    again = catalog.sync_snapshots("local", "tank/data", [fact("b", 2, 20), fact("c", 3, 30)], T0)
    assert (again.added, again.gone) == (0, 0)


def test_a_tombstoned_guid_is_never_brought_back_by_a_later_listing(catalog):
    catalog.sync_snapshots("local", "tank/data", [fact("a", 1, 10)], T0)
    catalog.sync_snapshots("local", "tank/data", [], T0 + HOUR)
    result = catalog.sync_snapshots("local", "tank/data", [fact("a", 1, 10)], T0 + 2 * HOUR)
    assert (result.added, result.gone) == (0, 0)
    assert catalog.snapshots() == []
    assert catalog.snapshots(include_destroyed=True)[0].destroyed_at == T0 + HOUR


def test_a_renamed_snapshot_keeps_its_row_and_takes_the_new_name(catalog):
    catalog.sync_snapshots("local", "tank/data", [fact("old", 1, 10)], T0)
    result = catalog.sync_snapshots("local", "tank/data", [fact("new", 1, 10)], T0 + HOUR)
    assert (result.added, result.gone, result.renamed) == (0, 0, 1)
    assert [(s.name, s.first_seen) for s in catalog.snapshots()] == [("new", T0)]


def test_snapshots_below_a_dataset_cover_it_and_its_children_in_createtxg_order(catalog):
    for name, guid in (("tank/a", 1), ("tank/a/b", 2), ("tank/ab", 3), ("tank/a_x/c", 4)):
        catalog.sync_snapshots("local", name, [fact("s2", guid * 10, 200), fact("s1", guid, 100)],
                               T0)
    catalog.sync_snapshots("remote", "tank/a", [fact("s1", 99, 1)], T0)
    rows = catalog.snapshots(host="local", below="tank/a")
    assert [(r.dataset, r.name) for r in rows] == [
        ("tank/a", "s1"), ("tank/a", "s2"), ("tank/a/b", "s1"), ("tank/a/b", "s2")
    ]
    assert [r.dataset for r in catalog.snapshots(below="tank/a_")] == []
    assert {r.host for r in catalog.snapshots(dataset="tank/a")} == {"local", "remote"}


# -- runs and cursors ---------------------------------------------------------------------

def test_last_runs_gives_the_latest_run_per_job_action_and_target(catalog):
    old = catalog.start_run("nightly", "replicate", "backup:pool/x", T0)
    catalog.finish_run(old, result="ok", now=T0 + HOUR, bytes=1000)
    new = catalog.start_run("nightly", "replicate", "backup:pool/x", T0 + 2 * HOUR)
    catalog.finish_run(new, result="failed", now=T0 + 3 * HOUR, error="ssh: refused")
    snap = catalog.start_run("nightly", "snapshot", None, T0)
    other = catalog.start_run("weekly", "archive", "cold", T0)
    latest = catalog.last_runs()
    assert [(r.id, r.result) for r in latest] == [
        (new, "failed"), (snap, "running"), (other, "running")
    ]
    assert latest[0].error == "ssh: refused" and latest[0].ended_at == T0 + 3 * HOUR
    assert [r.id for r in catalog.last_runs("weekly")] == [other]
    success = catalog.last_success("nightly", "replicate", "backup:pool/x")
    assert success.id == old and success.bytes == 1000
    assert catalog.last_success("nightly", "snapshot") is None


def test_a_run_can_be_finished_once_and_only_if_it_exists(catalog):
    run = catalog.start_run("nightly", "prune", None, T0)
    catalog.finish_run(run, result="partial", now=T0)
    with pytest.raises(CatalogConflict, match="already ended"):
        catalog.finish_run(run, result="ok", now=T0)
    with pytest.raises(NotInCatalog):
        catalog.finish_run(run + 100, result="ok", now=T0)
    with pytest.raises(ValueError):
        catalog.start_run("nightly", "dance", None, T0)


def test_set_cursor_creates_then_moves_one_cursor_per_job_target_and_source(catalog):
    catalog.set_cursor("n", "b:pool/x", "local", "tank/a", "pool/x/a", "zfs", "s1", 1, 10, T0)
    catalog.set_cursor("n", "b:pool/x", "local", "tank/a", "pool/x/a", "zfs", "s2", 2, 20,
                       T0 + HOUR)
    catalog.set_cursor("n", "c:/srv", "local", "tank/a", "/srv/a", "rsync", "s1", 1, 10, T0)
    rows = catalog.cursors()
    assert [(r.target, r.snapshot_name, r.guid, r.updated_at) for r in rows] == [
        ("b:pool/x", "s2", 2, T0 + HOUR), ("c:/srv", "s1", 1, T0)
    ]
    assert rows[1].method == "rsync" and rows[1].source_dataset == "tank/a"
    assert catalog.cursors("other") == []


def test_set_cursors_records_a_batch_in_one_transaction_all_or_none(catalog):
    def row(source, short, guid, when=T0, method="zfs"):
        return CursorRow("n", "b:pool/x", "local", source, f"pool/x/{source}", method, short,
                         guid, guid * 10, when)

    catalog.set_cursors([row("tank/a", "s1", 1), row("tank/b", "s1", 2)])
    catalog.set_cursors([row("tank/a", "s2", 3, T0 + HOUR), row("tank/c", "s2", 4, T0 + HOUR)])
    assert [(r.source_dataset, r.snapshot_name, r.guid) for r in catalog.cursors("n")] == [
        ("tank/a", "s2", 3), ("tank/b", "s1", 2), ("tank/c", "s2", 4)]
    with pytest.raises(ValueError):  # one bad row: none of the batch is recorded
        catalog.set_cursors([row("tank/a", "s3", 5), row("tank/b", "s3", 6, method="ftp")])
    assert [r.snapshot_name for r in catalog.cursors("n")] == ["s2", "s1", "s2"]
    catalog.set_cursors([])


# -- stream chains ------------------------------------------------------------------------

def test_a_full_and_two_incrementals_form_a_chain_with_their_volumes(catalog):
    full = catalog.add_stream(
        stream("a", 1, 10),
        [NewVolume(0, "k/0", 100, 60, SHA), NewVolume(1, "k/1", 50, 30, "cd" * 32)],
    )
    inc1 = catalog.add_stream(stream("b", 2, 20, parent=full, from_guid=1))
    inc2 = catalog.add_stream(stream("c", 3, 30, parent=inc1, from_guid=2))
    rows = catalog.streams(dataset="tank/data", store="cold")
    assert [(r.id, r.kind, r.parent_id, r.from_guid, r.to_guid) for r in rows] == [
        (full, "full", None, None, 1), (inc1, "incremental", full, 1, 2),
        (inc2, "incremental", inc1, 2, 3),
    ]
    assert [(v.index, v.key, v.sha256) for v in catalog.volumes(full)] == [
        (0, "k/0", SHA), (1, "k/1", "cd" * 32)
    ]


def test_an_incremental_whose_from_guid_is_not_its_parents_to_guid_is_refused(catalog):
    full, inc1, _ = chain(catalog)
    with pytest.raises(ChainBroken, match="starts at guid 1 .* ends at @b guid 2"):
        catalog.add_stream(stream("d", 4, 40, parent=inc1, from_guid=1))
    with pytest.raises(ChainBroken, match="does not exist"):
        catalog.add_stream(stream("d", 4, 40, parent=inc1 + 100, from_guid=3))
    with pytest.raises(ChainBroken, match="another dataset or store"):
        catalog.add_stream(stream("d", 4, 40, parent=full, from_guid=1, store="other"))
    with pytest.raises(ChainBroken, match="full stream"):
        catalog.add_stream(dataclasses.replace(stream("d", 4, 40), parent_id=full))
    assert len(catalog.streams()) == 3


def test_the_database_itself_refuses_a_raw_insert_that_breaks_guid_continuity(catalog, engine):
    full, inc1, _ = chain(catalog)
    dataset_id = catalog.dataset_id("local", "tank/data")
    with engine.connect() as connection:
        with pytest.raises(sa.exc.IntegrityError):
            connection.execute(raw_incremental(inc1, 1, 4, "raw/bad", dataset_id))
        connection.rollback()
        with pytest.raises(sa.exc.IntegrityError):  # the CHECK: an incremental needs a parent
            connection.execute(sa.text(
                "UPDATE streams SET parent_id = NULL, from_guid = NULL WHERE id = :id"
            ).bindparams(id=inc1))
        connection.rollback()
        connection.execute(raw_incremental(inc1, 2, 4, "raw/good", dataset_id))
        connection.commit()
    assert len(catalog.streams()) == 4


def test_deleting_a_parent_with_children_is_refused_by_the_repository_and_the_database(
    catalog, engine
):
    full, inc1, inc2 = chain(catalog)
    with pytest.raises(ChainBroken, match=f"streams \\[{inc1}\\] apply on it"):
        catalog.delete_stream(full)
    with engine.connect() as connection:
        with pytest.raises(sa.exc.IntegrityError):
            connection.execute(sa.text("DELETE FROM streams WHERE id = :id").bindparams(id=full))
        connection.rollback()
    assert len(catalog.streams()) == 3


def test_a_condemned_chain_is_deleted_leaf_first_with_its_volumes(catalog):
    full = catalog.add_stream(stream("a", 1, 10))
    inc1 = catalog.add_stream(stream("b", 2, 20, parent=full, from_guid=1))
    inc2 = catalog.add_stream(stream("c", 3, 30, parent=inc1, from_guid=2),
                              [NewVolume(0, "c/0", 10, 5, SHA)])
    assert len(catalog.volumes(inc2)) == 1
    with pytest.raises(ChainBroken, match="condemn the whole chain"):
        catalog.set_stream_state(full, "condemned", T0)
    with pytest.raises(CatalogConflict, match="condemn it"):
        catalog.delete_stream(inc2)
    catalog.condemn_streams([full, inc1, inc2])
    for stream_id in (inc2, inc1, full):
        catalog.delete_stream(stream_id)
    assert catalog.streams() == [] and catalog.volumes(inc2) == []


def test_stream_states_follow_upload_then_verify_and_record_when(catalog):
    full = catalog.add_stream(stream("a", 1, 10))
    catalog.set_stream_state(full, "uploaded", T0 + HOUR, raw_bytes=1000, stored_bytes=400)
    catalog.set_stream_state(full, "verified", T0 + 2 * HOUR)
    row = catalog.stream(full)
    assert (row.state, row.uploaded_at, row.verified_at) == ("verified", T0 + HOUR, T0 + 2 * HOUR)
    assert (row.raw_bytes, row.stored_bytes) == (1000, 400)
    with pytest.raises(CatalogConflict, match="from verified to uploading"):
        catalog.set_stream_state(full, "uploading", T0)


def test_a_streams_volumes_are_numbered_from_0_without_gaps_and_carry_a_sha256(catalog):
    with pytest.raises(ValueError, match="without gaps; got 2 at position 1"):
        catalog.add_stream(stream("a", 1, 10), [NewVolume(0, "a/0", 10, 5, SHA),
                                                NewVolume(2, "a/2", 10, 5, SHA)])
    with pytest.raises(ValueError, match="without gaps; got 1 at position 0"):
        catalog.add_stream(stream("a", 1, 10), [NewVolume(1, "a/1", 10, 5, SHA)])
    with pytest.raises(ValueError, match="sha256"):
        catalog.add_stream(stream("b", 2, 20, prefix="p"), [NewVolume(0, "b/0", 1, 1, "XYZ")])
    assert catalog.streams() == []
    full = catalog.add_stream(stream("a", 1, 10), [NewVolume(0, "a/0", 10, 5, SHA),
                                                   NewVolume(1, "a/1", 10, 5, SHA)])
    assert [v.index for v in catalog.volumes(full)] == [0, 1]


def test_two_streams_cannot_share_an_object_prefix_in_one_store(catalog):
    catalog.add_stream(stream("a", 1, 10, prefix="same"))
    with pytest.raises(CatalogConflict, match="unique"):
        catalog.add_stream(stream("b", 5, 50, prefix="same"))
    catalog.add_stream(stream("b", 5, 50, prefix="same", store="elsewhere"))
