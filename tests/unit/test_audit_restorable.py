"""The audit's restorable sets (pure): per dataset and store, what restores, what is stored but
cannot be restored, and what only a catalog merge would bring back
(docs/decisions.md#audit-names-stored-but-unrestorable-snapshots)."""

from __future__ import annotations

import datetime as dt

from zrepl_py.audit.findings import Severity
from zrepl_py.audit.restorable import (
    Snapshots,
    Stray,
    coverage,
    coverage_findings,
    ranges,
    stray,
    strays_of,
)
from zrepl_py.catalog.paths import restorable_streams
from zrepl_py.catalog.rows import StreamRow
from zrepl_py.objects.layout import parse_stream_prefix, stream_prefix
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
DS = "tank/data"


def snap(n: int) -> CarriedSnapshot:
    return CarriedSnapshot(str(n), 1_000_000 + n, 10 * (n + 1))


def row(id: int, to: int, frm: int | None = None, parent: int | None = None,
        state: str = "uploaded") -> StreamRow:
    return StreamRow(
        id=id, host="local", dataset=DS, store="cold",
        kind="full" if frm is None else "incremental", parent_id=parent,
        from_guid=None if frm is None else snap(frm).guid, to_guid=snap(to).guid,
        from_name=None if frm is None else str(frm), to_name=str(to),
        to_createtxg=snap(to).createtxg, raw_bytes=1, stored_bytes=1,
        object_prefix=_prefix(to, frm), storage_class="STANDARD", compression="zstd",
        state=state, created_at=T0, uploaded_at=T0, verified_at=None)


def _prefix(to: int, frm: int | None) -> str:
    return stream_prefix("local", DS, to_createtxg=snap(to).createtxg, to_guid=snap(to).guid,
                         from_guid=None if frm is None else snap(frm).guid)


def carried(*rows: StreamRow) -> dict[int, list[CarriedSnapshot]]:
    out = {}
    for r in rows:
        top = r.to_guid - 1_000_000
        low = top - 1 if r.from_guid is None else r.from_guid - 1_000_000
        out[r.id] = [snap(n) for n in range(low + 1, r.to_guid - 1_000_000 + 1)]
    return out


def manifest(to: int, frm: int | None) -> Manifest:
    return Manifest(host="local", dataset=DS, kind="full" if frm is None else "incremental",
                    from_snap=None if frm is None else snap(frm), to_snap=snap(to),
                    snapshots=tuple(snap(n) for n in range((frm if frm is not None else to - 1)
                                                           + 1, to + 1)),
                    volumes=(), compression="zstd", compression_level=3, send_flags=(),
                    storage_class="STANDARD", tool="zbak", created_at=T0)


def a_stray(to: int, frm: int | None, *, with_manifest: bool) -> Stray:
    leaves = {"vol-000000.zst"} | ({"manifest.json"} if with_manifest else set())
    return stray("local", DS, "cold", _prefix(to, frm), leaves,
                 manifest(to, frm) if with_manifest else None)


def names(snaps) -> list[str]:
    return [s.name or f"guid {s.guid}" for s in snaps]


def test_a_chain_cut_by_a_stray_without_manifest_lists_the_snapshots_after_it_as_unrestorable():
    rows = [row(1, 0), row(2, 3, frm=0, parent=1)]
    strays = [a_stray(4, 3, with_manifest=False), a_stray(6, 4, with_manifest=True),
              a_stray(9, 6, with_manifest=True)]
    (cov,) = coverage(rows, carried(*rows), strays)
    assert names(cov.restorable) == ["0", "1", "2", "3"]
    assert names(cov.unrestorable) == ["4", "5", "6", "7", "8", "9"]
    assert cov.broken_at == "@4" and len(cov.dead) == 3
    assert cov.line() == "restorable: @0..@3 (4); stored but unrestorable: @4..@9 (6)"
    (finding,) = coverage_findings([cov], job="j")
    assert finding.severity is Severity.ERROR and "zbak archive --full" in finding.action
    assert "@4..@9" in finding.problem


def test_stray_manifests_that_complete_a_chain_are_not_catalogued_not_unrestorable():
    rows = [row(1, 0)]
    strays = [a_stray(2, 0, with_manifest=True)]
    (cov,) = coverage(rows, carried(*rows), strays)
    assert names(cov.not_catalogued) == ["1", "2"] and cov.unrestorable == ()
    assert coverage_findings([cov], job="j") == []


def test_lost_snapshots_older_than_a_newer_restorable_chain_are_info():
    rows = [row(1, 0), row(5, 9)]  # a new full @9 after the break
    strays = [a_stray(4, 0, with_manifest=False)]
    (cov,) = coverage(rows, carried(*rows), strays)
    assert names(cov.restorable) == ["0", "9"] and names(cov.unrestorable) == ["guid 1000004"]  # nothing names it
    (finding,) = coverage_findings([cov], job="j")
    assert finding.severity is Severity.INFO


def test_a_partial_upload_is_not_a_stored_stream_and_a_bad_parent_cuts_its_children():
    rows = [row(1, 0), row(2, 1, frm=0, parent=1, state="bad"), row(3, 2, frm=1, parent=2)]
    partial = stray("local", DS, "cold", _prefix(3, 2), {"vol-000000.zst", "progress.json"}, None)
    (cov,) = coverage(rows, carried(*rows), [partial])
    assert names(cov.restorable) == ["0"] and names(cov.unrestorable) == ["1", "2"]
    assert cov.stray_only == () and restorable_streams(rows) == {1}


def test_ranges_never_join_snapshots_across_one_outside_the_set():
    order = [snap(n) for n in range(6)]
    assert ranges([snap(0), snap(1), snap(2), snap(4)], order) == "@0..@2, @4"
    assert ranges([snap(0), snap(5)], order) == "@0, @5"


def test_strays_are_stream_directories_with_volumes_the_catalog_does_not_own():
    owned = {_prefix(0, None)}
    keys = [_prefix(0, None) + "vol-000000.zst", _prefix(1, 0) + "vol-000000.zst",
            _prefix(1, 0) + "manifest.json", _prefix(2, 1) + "progress.json",
            "local/tank/data/notastream/vol-000000.zst"]
    found = strays_of(keys, owned, "local", "cold")
    assert found == {_prefix(1, 0): (DS, {"vol-000000.zst", "manifest.json"})}
    assert parse_stream_prefix(_prefix(1, 0)) == ("incremental", snap(0).guid, snap(1).guid,
                                                   snap(1).createtxg)


def test_a_stray_without_manifest_nothing_applies_on_is_not_counted_while_an_archive_runs():
    rows = [row(1, 0)]
    strays = [a_stray(1, 0, with_manifest=False)]
    (cov,) = coverage(rows, carried(*rows), strays, archive_running=True)
    assert cov.unrestorable == ()
    (cov,) = coverage(rows, carried(*rows), strays)
    assert names(cov.unrestorable) == ["guid 1000001"]


def test_a_coverage_keeps_its_snapshots_as_columns_that_read_back_as_the_same_snapshots():
    snaps = [CarriedSnapshot("a", 2**64 - 1, 10), CarriedSnapshot("", 7, 20)]
    kept = Snapshots(snaps)
    assert len(kept) == 2 and list(kept) == snaps and kept[1] == snaps[1]
    assert kept == tuple(snaps) and kept[:1] == (snaps[0],) and kept != tuple(snaps[:1])
    assert kept + Snapshots() == tuple(snaps) and () + kept == tuple(snaps)
    assert hash(kept) == hash(Snapshots(snaps)) and Snapshots() == ()
