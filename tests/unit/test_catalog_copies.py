"""Catalog exports and manifests are checksummed, stored twice and read with a fallback; a store
behind this machine's high-water mark is refused (docs/reliability.md#r25-catalog-rollback-detection
and docs/reliability.md#r26-catalog-metadata-copy-with-checksum). Objects live in a
``file://`` store in a temporary directory; the rest is plain data."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest

from zrepl_py.catalog.export import (
    CatalogExport,
    StoreGuard,
    check_generation,
    export_rows,
    load_export,
    mark_file,
    read_mark,
)
from zrepl_py.catalog.rebuild import export_states
from zrepl_py.catalog.rows import StreamRow
from zrepl_py.errors import (
    CatalogExportCorrupt,
    CatalogReplay,
    ExitStatus,
    ObjectNotFound,
    StreamCorrupt,
)
from zrepl_py.objects.checked import read_with_copy
from zrepl_py.objects.layout import MANIFEST, copy_key, export_key
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest, VolumeRecord
from zrepl_py.stores.file import FileBackend

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
KEY = export_key("node1", "data")


def stream_row(i: int, state: str = "uploaded") -> StreamRow:
    return StreamRow(
        id=i, host="local", dataset="tank/data", store="cold", kind="full" if i == 1 else
        "incremental", parent_id=None if i == 1 else i - 1, from_guid=None if i == 1 else 2**63 + i - 1,
        to_guid=2**63 + i, from_name=None if i == 1 else str(i - 1), to_name=str(i),
        to_createtxg=10 * i, raw_bytes=100, stored_bytes=50,
        object_prefix=f"local/tank/data/{i:020d}-x/", storage_class="STANDARD",
        compression="zstd", state=state, created_at=T0, uploaded_at=T0,
        verified_at=T0 if state == "verified" else None)


def manifest() -> Manifest:
    snap = CarriedSnapshot("b", 2**64 - 1, 9)
    return Manifest(host="local", dataset="tank/data", kind="full", from_snap=None,
                    to_snap=snap, snapshots=(snap,),
                    volumes=(VolumeRecord(0, "p/vol-000000.zst", 13, 6, "a" * 64),),
                    compression="zstd", compression_level=3, send_flags=(),
                    storage_class="STANDARD", tool="zbak test", created_at=T0)


@pytest.fixture
def store(tmp_path):
    (tmp_path / "store").mkdir()
    backend = FileBackend("cold", tmp_path / "store")
    yield backend
    backend.close()


def flip_a_digit(data: bytes, needle: bytes) -> bytes:
    """``data`` with the first digit after ``needle`` changed: still valid JSON."""
    at = data.index(needle) + len(needle)
    while not chr(data[at]).isdigit():
        at += 1
    return data[:at] + (b"1" if data[at:at + 1] != b"1" else b"2") + data[at + 1:]


def put(backend, key: str, data: bytes) -> None:
    backend.put(key, [data])


def get(backend, key: str) -> bytes:
    return b"".join(backend.get(key))


# -- docs/reliability.md#r26-catalog-metadata-copy-with-checksum: checksummed manifests with a .copy
# ------------------------------------------


def test_a_manifest_whose_bytes_changed_but_still_parse_fails_its_checksum():
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: a changed digit (valid JSON,
    plausible value) is caught by the sha256."""
    data = manifest().to_json()
    with pytest.raises(StreamCorrupt, match="does not match its sha256"):
        Manifest.from_json(flip_a_digit(data, b'"createtxg"'), "store:key")


def test_a_manifest_without_a_checksum_from_an_older_zbak_still_reads_but_unknown_fields_do_not():
    obj = json.loads(manifest().to_json())
    obj.pop("sha256")
    assert Manifest.from_json(json.dumps(obj).encode(), "k") == manifest()
    obj["sha265"] = "x"  # a damaged key name must not pass as a legacy manifest
    with pytest.raises(StreamCorrupt, match="unknown field"):
        Manifest.from_json(json.dumps(obj).encode(), "k")


@pytest.mark.parametrize("damage", ["changed", "missing"])
def test_a_damaged_or_missing_primary_manifest_is_read_from_its_copy(store, damage):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: the copy is used when the
    primary fails its checksum or is gone."""
    key = "local/tank/data/p/" + MANIFEST
    data = manifest().to_json()
    put(store, key, data)
    put(store, copy_key(key), data)
    if damage == "changed":
        put(store, key, flip_a_digit(data, b'"raw_bytes"'))
    else:
        store.delete(key)
    loaded = read_with_copy(store, key, Manifest.from_json, StreamCorrupt)
    assert loaded.value == manifest()
    assert loaded.from_copy and loaded.key == copy_key(key)


def test_a_manifest_whose_primary_and_copy_are_both_damaged_fails_naming_both(store):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: both copies bad is a loud
    StreamCorrupt naming both keys."""
    key = "p/" + MANIFEST
    data = manifest().to_json()
    put(store, key, flip_a_digit(data, b'"raw_bytes"'))
    put(store, copy_key(key), data[:-20])
    with pytest.raises(StreamCorrupt) as caught:
        read_with_copy(store, key, Manifest.from_json, StreamCorrupt)
    assert f"cold:{key}" in str(caught.value) and copy_key(key) in str(caught.value)


def test_a_manifest_missing_in_both_places_is_object_not_found(store):
    with pytest.raises(ObjectNotFound):
        read_with_copy(store, "p/" + MANIFEST, Manifest.from_json, StreamCorrupt)


# -- docs/reliability.md#r26-catalog-metadata-copy-with-checksum: the catalog export envelope
# -------------------------------------------------


def export(generation: int = 3) -> CatalogExport:
    return CatalogExport(generation, T0, "node1", "data", "cold", "zbak test",
                         tuple(export_rows([stream_row(1, "verified"), stream_row(2)])))


def test_an_export_survives_the_json_round_trip_and_lists_streams_with_64_bit_guids():
    data = export().to_json()
    assert CatalogExport.from_json(data, "k") == export()
    body = json.loads(data)["catalog"]
    assert body["streams"][1]["to_guid"] == str(2**63 + 2)
    assert body["streams"][0]["verified_at"] == "2026-05-01T12:00:00Z"


def test_condemned_streams_are_left_out_of_the_export():
    assert [r["prefix"] for r in export_rows([stream_row(1), stream_row(2, "condemned")])] == [
        stream_row(1).object_prefix]


@pytest.mark.parametrize("damage", [
    lambda d: flip_a_digit(d, b'"generation"'),
    lambda d: flip_a_digit(d, b'"to_createtxg"'),
    lambda d: d[: len(d) // 2],
    lambda d: b"",
    lambda d: d.replace(b"zbak-catalog/1", b"zbak-catalog/2"),
])
def test_a_damaged_export_is_refused_with_its_location(damage):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: any change to an export's bytes
    is caught."""
    with pytest.raises(CatalogExportCorrupt, match="catalog export store:key"):
        CatalogExport.from_json(damage(export().to_json()), "store:key")


def test_an_export_with_a_damaged_primary_loads_from_its_copy_and_is_reported_unhealthy(store):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: corrupt primary export -> the
    copy is used."""
    put(store, KEY, flip_a_digit(export().to_json(), b'"generation"'))
    put(store, copy_key(KEY), export().to_json())
    loaded = load_export(store, KEY)
    assert loaded.export == export() and not loaded.healthy


def test_an_export_whose_copy_is_missing_or_differs_is_unhealthy(store):
    put(store, KEY, export().to_json())
    assert not load_export(store, KEY).healthy
    put(store, copy_key(KEY), export(2).to_json())
    assert not load_export(store, KEY).healthy
    put(store, copy_key(KEY), export().to_json())
    assert load_export(store, KEY).healthy


def test_an_export_whose_primary_and_copy_are_both_damaged_fails_loudly(store):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: both bad -> CatalogExportCorrupt
    naming both keys."""
    put(store, KEY, b"{")
    put(store, copy_key(KEY), flip_a_digit(export().to_json(), b'"generation"'))
    with pytest.raises(CatalogExportCorrupt) as caught:
        load_export(store, KEY)
    assert KEY in str(caught.value) and copy_key(KEY) in str(caught.value)


# -- docs/reliability.md#r25-catalog-rollback-detection: rollback detection
# ----------------------------------------------------------


@pytest.mark.parametrize("found, mark, refused", [
    (None, None, False),   # nothing written by this machine, nothing there: first run
    (4, None, False),      # another machine (or a lost state dir) wrote it
    (4, 4, False),
    (5, 4, False),         # ahead: the mark is written only after both puts
    (3, 4, True),          # rolled back
    (None, 4, True),       # replaced or emptied
])
def test_an_export_behind_the_local_high_water_mark_or_missing_is_a_replay(
        tmp_path, found, mark, refused):
    """docs/reliability.md#r25-catalog-rollback-detection: the decision table of
    ``check_generation``."""
    if not refused:
        check_generation(KEY, "cold", found, mark, tmp_path / "m")
        return
    with pytest.raises(CatalogReplay) as caught:
        check_generation(KEY, "cold", found, mark, tmp_path / "m")
    message = str(caught.value)
    assert KEY in message and str(tmp_path / "m") in message and f"generation {mark}" in message


def test_catalog_replay_exits_1_like_other_failures():
    assert CatalogReplay.exit_status == ExitStatus.FAILED
    assert CatalogExportCorrupt.exit_status == ExitStatus.FAILED


def test_publish_writes_primary_and_copy_then_the_mark_and_counts_generations_up(store, tmp_path):
    """docs/reliability.md#r25-catalog-rollback-detection: each changed publish raises the
    generation by one; unchanged rows write nothing."""
    state = tmp_path / "state"
    guard = StoreGuard(store, "cold", state, job="data", node="node1")
    guard.check()
    assert guard.publish([stream_row(1)], T0) == 1
    assert load_export(store, KEY).healthy
    assert read_mark(mark_file(state, "cold", KEY)).generation == 1
    assert guard.publish([stream_row(1)], T0) is None
    again = StoreGuard(store, "cold", state, job="data", node="node1")
    assert again.publish([stream_row(1), stream_row(2)], T0) == 2
    assert [r["prefix"] for r in load_export(store, KEY).export.streams] == [
        stream_row(1).object_prefix, stream_row(2).object_prefix]


def test_an_older_export_put_back_in_the_store_is_refused_by_every_guard(store, tmp_path):
    """docs/reliability.md#r25-catalog-rollback-detection: a store rolled back to an older export is
    refused with CatalogReplay, also by a guard without a job (restore)."""
    state = tmp_path / "state"
    StoreGuard(store, "cold", state, job="data", node="node1").publish([stream_row(1)], T0)
    old_primary, old_copy = get(store, KEY), get(store, copy_key(KEY))
    StoreGuard(store, "cold", state, job="data", node="node1").publish(
        [stream_row(1), stream_row(2)], T0)
    put(store, KEY, old_primary)
    put(store, copy_key(KEY), old_copy)
    for guard in (StoreGuard(store, "cold", state, job="data", node="node1"),
                  StoreGuard(store, "cold", state)):
        with pytest.raises(CatalogReplay, match="has generation 1, but this machine wrote"
                                                " generation 2"):
            guard.check()
    # another job's guard on the same store sees the replay too: the whole store is behind
    with pytest.raises(CatalogReplay):
        StoreGuard(store, "cold", state, job="other", node="node1").check()
    # removing the mark, as the message says, accepts the store as it is
    mark_file(state, "cold", KEY).unlink()
    guard = StoreGuard(store, "cold", state, job="data", node="node1")
    guard.check()
    assert guard.publish([stream_row(1), stream_row(2)], T0) == 2


def test_a_store_whose_export_vanished_is_refused(store, tmp_path):
    """docs/reliability.md#r25-catalog-rollback-detection: a missing export where this machine wrote
    one means a replaced store."""
    state = tmp_path / "state"
    StoreGuard(store, "cold", state, job="data", node="node1").publish([stream_row(1)], T0)
    store.delete(KEY)
    store.delete(copy_key(KEY))
    with pytest.raises(CatalogReplay, match="is missing"):
        StoreGuard(store, "cold", state).check()


def test_a_damaged_primary_export_is_repaired_by_the_next_publish(store, tmp_path):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: the copy carries the check; the
    next publish rewrites both."""
    state = tmp_path / "state"
    StoreGuard(store, "cold", state, job="data", node="node1").publish([stream_row(1)], T0)
    put(store, KEY, b"garbage")
    guard = StoreGuard(store, "cold", state, job="data", node="node1")
    guard.check()
    assert guard.publish([stream_row(1)], T0) == 2
    assert load_export(store, KEY).healthy


def test_both_exports_damaged_stop_the_guard_naming_keys_and_mark(store, tmp_path):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: both damaged -> the run fails
    loudly, saying what to delete."""
    state = tmp_path / "state"
    StoreGuard(store, "cold", state, job="data", node="node1").publish([stream_row(1)], T0)
    put(store, KEY, b"garbage")
    put(store, copy_key(KEY), b"{}")
    with pytest.raises(CatalogExportCorrupt) as caught:
        StoreGuard(store, "cold", state).check()
    message = str(caught.value)
    assert KEY in message and copy_key(KEY) in message
    assert str(mark_file(state, "cold", KEY)) in message


def test_the_newest_export_wins_for_a_stream_listed_twice():
    older = dataclasses.replace(export(1), streams=tuple(export_rows([stream_row(1)])))
    newer = dataclasses.replace(export(1), written_at=T0 + dt.timedelta(hours=1),
                                streams=tuple(export_rows([stream_row(1, "verified")])))
    rows = export_states([("b", newer), ("a", older)])
    assert rows[stream_row(1).object_prefix]["state"] == "verified"
