"""The graph audit (pure): chains, continuity, orphans, volumes, restorable snapshots, archive
lag and replica cursors, table-driven over plain catalog rows."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from zrepl_py.audit.findings import Severity
from zrepl_py.audit.graph import (
    ArchiveExpectation,
    CarriedTable,
    GraphInput,
    TargetListing,
    audit_graph,
    volume_totals,
)
from zrepl_py.catalog.rows import CursorRow, SnapshotRow, StreamLink, StreamRow, VolumeRow
from zrepl_py.objects.manifest import CarriedSnapshot

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
DS = "tank/data"


def guid(n: int) -> int:
    return 1_000_000 + n


def stream(id: int, to: int, *, frm: int | None = None, parent: int | None = None,
           state: str = "uploaded", kind: str | None = None, dataset: str = DS,
           store: str = "cold", carried: tuple[int, ...] | None = None) -> tuple[StreamRow, list[CarriedSnapshot], list[VolumeRow]]:
    """A stream of snapshot numbers (snapshot n: name "sn", guid 1_000_000+n, createtxg 10n)."""
    kind = kind or ("full" if frm is None else "incremental")
    row = StreamRow(
        id=id, host="local", dataset=dataset, store=store, kind=kind, parent_id=parent,
        from_guid=None if frm is None else guid(frm), to_guid=guid(to),
        from_name=None if frm is None else f"s{frm}", to_name=f"s{to}", to_createtxg=10 * to,
        raw_bytes=100, stored_bytes=10, object_prefix=f"local/{dataset}/{id}/",
        storage_class="STANDARD", compression="zstd", state=state, created_at=T0,
        uploaded_at=T0, verified_at=None)
    snaps = carried if carried is not None else (
        (to,) if frm is None else tuple(range(frm + 1, to + 1)))
    carried_rows = [CarriedSnapshot(f"s{n}", guid(n), 10 * n) for n in snaps]
    volumes = [VolumeRow(id * 10, id, 0, f"local/{dataset}/{id}/vol-000000.zst", 100, 10, "a" * 64)]
    return row, carried_rows, volumes


def graph_input(*specs, snapshots=(), cursors=(), archives=(), targets=None, volumes=None):
    rows = [s[0] for s in specs]
    carried = {s[0].id: s[1] for s in specs}
    vols = volumes if volumes is not None else {s[0].id: s[2] for s in specs}
    return GraphInput(streams=rows, volumes=volume_totals(vols),
                      carried=CarriedTable.from_mapping(carried), snapshots=list(snapshots),
                      cursors=list(cursors), archives=list(archives), targets=targets or {})


def snap_row(n: int, *, destroyed: bool = False, hours: int | None = None, dataset: str = DS) -> SnapshotRow:
    created = T0 + dt.timedelta(hours=n if hours is None else hours)
    return SnapshotRow("local", dataset, f"s{n}", guid(n), 10 * n, created, created,
                       T0 + dt.timedelta(days=30) if destroyed else None)


def problems(findings, severity=None):
    return [f for f in findings if severity is None or f.severity is severity]


CHAIN = [stream(1, 0), stream(2, 4, frm=0, parent=1), stream(3, 9, frm=4, parent=2)]


def test_a_healthy_chain_gives_no_findings():
    assert audit_graph(graph_input(*CHAIN)) == []


def test_the_lean_stream_links_audit_the_same_as_full_rows():
    data = graph_input(*CHAIN[:1], stream(2, 4, frm=0, parent=1, state="bad"), CHAIN[2])
    links = [StreamLink(*(getattr(s, f) for f in StreamLink._fields)) for s in data.streams]
    assert audit_graph(dataclasses.replace(data, streams=links)) == audit_graph(data)


@pytest.mark.parametrize("specs, stream_id, words", [
    # a parent missing from the catalog: the incremental is an orphan
    ([stream(2, 4, frm=0, parent=1), stream(3, 9, frm=4, parent=2)], 2,
     ["parent stream 1 is not in the catalog", "1 living stream(s) applying after it"]),
    # guid continuity broken: starts at another guid than its parent ends at
    ([CHAIN[0], stream(2, 4, frm=1, parent=1)], 2, ["guid continuity"]),
    # an incremental ending before its parent
    ([CHAIN[0], stream(2, 4, frm=0, parent=1), stream(3, 3, frm=4, parent=2, carried=())], 3,
     ["not after its parent's"]),
    # a parent in another dataset
    ([stream(1, 0, dataset="tank/other"), stream(2, 4, frm=0, parent=1)], 2,
     ["of local:tank/other"]),
    # a full that names a parent
    ([CHAIN[0], stream(2, 4, parent=1, kind="full")], 2, ["it is a full but names parent 1"]),
    # an incremental without parent: the chain has no full
    ([stream(2, 4, frm=0)], 2, ["without a parent stream"]),
    # a bad stream cuts off what follows it
    ([CHAIN[0], stream(2, 4, frm=0, parent=1, state="bad"), CHAIN[2]], 2,
     ["it is bad", "1 living stream(s) applying after it", "@s1, @s2, @s3, @s4, @s5"]),
    # a condemned parent with living children (an orphan left by a broken prune)
    ([stream(1, 0, state="condemned"), CHAIN[1], CHAIN[2]], 1,
     ["it is condemned", "2 living stream(s)"]),
    # the carried snapshots do not include the to-snapshot
    ([CHAIN[0], stream(2, 4, frm=0, parent=1, carried=(1, 2, 3))], 2,
     ["do not include its to-snapshot @s4"]),
    # a carried snapshot outside the stream's range
    ([CHAIN[0], stream(2, 4, frm=0, parent=1, carried=(0, 3, 4))], 2,
     ["@s0 outside its createtxg range (0, 40]"]),
    # a full carrying several snapshots
    ([stream(1, 2, carried=(1, 2))], 1, ["carries 2 snapshots"]),
])
def test_a_broken_chain_is_one_error_at_its_break_point(specs, stream_id, words):
    """docs/reliability.md#r20-chain-validity: missing parent, broken guid continuity, a bad
    ancestor, a condemned parent with living children: each reported once, with its reason, at the
    break."""
    found = audit_graph(graph_input(*specs))
    errors = problems(found, Severity.ERROR)
    assert [f.stream for f in errors] == [stream_id], found
    for word in words:
        assert word in errors[0].problem
    assert errors[0].action and errors[0].level == "graph"


def test_parents_forming_a_cycle_are_reported_not_followed_forever():
    """docs/reliability.md#r20-chain-validity: a parent cycle is reported, not followed."""
    a = stream(1, 4, frm=9, parent=2)
    b = stream(2, 9, frm=4, parent=1)
    found = audit_graph(graph_input(a, b))
    assert any("form a cycle through streams [1, 2]" in f.problem for f in found)


def test_a_finding_names_the_full_its_chain_starts_at():
    found = audit_graph(graph_input(CHAIN[0], stream(2, 4, frm=0, parent=1, state="bad"), CHAIN[2]))
    assert [(f.stream, f.chain, f.dataset, f.store) for f in problems(found, Severity.ERROR)] == [
        (2, 1, DS, "cold")]


def test_snapshots_another_restorable_chain_carries_are_not_listed_as_lost():
    """docs/reliability.md#r20-chain-validity: an incremental past a bad ancestor is not restorable;
    what another chain carries is."""
    specs = [CHAIN[0], stream(2, 4, frm=0, parent=1, state="bad"),
             stream(4, 3, carried=(3,)), stream(5, 4, frm=3, parent=4)]
    error, = problems(audit_graph(graph_input(*specs)), Severity.ERROR)
    assert "3 archived snapshot(s) have no restorable copy in store cold: @s1, @s2, @s3" not in error.problem
    assert "2 archived snapshot(s) have no restorable copy in store cold: @s1, @s2" in error.problem


def test_a_condemned_stream_without_living_children_is_an_unfinished_prune_warning():
    found = audit_graph(graph_input(stream(1, 0, state="condemned"),
                                    stream(2, 4, frm=0, parent=1, state="condemned"),
                                    stream(3, 5, carried=(5,))))
    assert [(f.severity, f.stream) for f in found] == [
        (Severity.WARNING, 1), (Severity.WARNING, 2)]
    assert "zbak prune" in found[0].action


def test_an_upload_in_progress_is_only_information():
    found = audit_graph(graph_input(*CHAIN[:2], stream(3, 9, frm=4, parent=2, state="uploading")))
    assert [(f.severity, f.stream) for f in found] == [(Severity.INFO, 3)]


def test_a_chain_that_branches_is_information():
    found = audit_graph(graph_input(*CHAIN, stream(4, 7, frm=4, parent=2)))
    assert [(f.severity, f.stream) for f in found] == [(Severity.INFO, 2)]


@pytest.mark.parametrize("volumes, words", [
    ({}, "no volumes"),
    ({2: [VolumeRow(1, 2, 1, "k", 100, 10, "a" * 64)]}, "numbered 1..1"),
    ({2: [VolumeRow(1, 2, 0, "k", 100, 10, "a" * 64), VolumeRow(2, 2, 1, "k2", 5, 1, "a" * 64)]},
     "add up to 105 raw / 11 stored"),
])
def test_volume_rows_must_be_numbered_from_zero_and_add_up(volumes, words):
    base = {1: CHAIN[0][2], 3: CHAIN[2][2]}
    found = audit_graph(graph_input(*CHAIN, volumes={**base, **volumes}))
    error, = problems(found, Severity.ERROR)
    assert error.stream == 2 and words in error.problem


def test_a_carried_guid_at_another_createtxg_than_the_source_had_is_an_error():
    other = dataclasses.replace(snap_row(2), createtxg=999)
    error, = problems(audit_graph(graph_input(*CHAIN, snapshots=[other])), Severity.ERROR)
    assert error.stream == 2 and "the source had it at 999" in error.problem


def test_the_newest_snapshot_before_the_last_archive_run_must_be_restorable():
    expect = ArchiveExpectation("local", DS, "cold", T0 + dt.timedelta(hours=9, minutes=30))
    snaps = [snap_row(n) for n in range(12)]
    assert audit_graph(graph_input(*CHAIN, snapshots=snaps, archives=[expect])) == []
    late = ArchiveExpectation("local", DS, "cold", T0 + dt.timedelta(hours=11, minutes=30))
    warning, = audit_graph(graph_input(*CHAIN, snapshots=snaps, archives=[late]))
    assert warning.severity is Severity.WARNING and f"{DS}@s11" in warning.problem
    # the tip's chain is bad: the archived snapshot is not restorable
    bad = [CHAIN[0], CHAIN[1], stream(3, 9, frm=4, parent=2, state="bad")]
    found = audit_graph(graph_input(*bad, snapshots=snaps, archives=[expect]))
    assert [f.severity for f in found] == [Severity.ERROR, Severity.WARNING]


def test_destroyed_snapshots_do_not_count_as_the_newest_to_archive():
    expect = ArchiveExpectation("local", DS, "cold", T0 + dt.timedelta(hours=11, minutes=30))
    snaps = [snap_row(n) for n in range(10)] + [snap_row(10, destroyed=True), snap_row(11, destroyed=True)]
    assert audit_graph(graph_input(*CHAIN, snapshots=snaps, archives=[expect])) == []


def test_a_dataset_never_archived_is_information():
    expect = ArchiveExpectation("local", "tank/new", "cold", None)
    finding, = audit_graph(graph_input(*CHAIN, archives=[expect]))
    assert finding.severity is Severity.INFO and "never been archived" in finding.problem


def cursor(n: int, method: str = "zfs") -> CursorRow:
    return CursorRow("job", "backup:pool/bak", "local", DS, "pool/bak/data", method, f"s{n}",
                     guid(n), 10 * n, T0)


@pytest.mark.parametrize("snaps, listing, expected", [
    ([snap_row(9)], frozenset({guid(9)}), []),
    ([], frozenset({guid(9)}), [(Severity.ERROR, "never saw on the source")]),
    ([snap_row(9, destroyed=True)], frozenset({guid(9)}), [(Severity.WARNING, "destroyed on the source")]),
    ([snap_row(9)], frozenset({guid(8)}), [(Severity.ERROR, "on the target has no such snapshot")]),
    ([snap_row(9)], None, [(Severity.WARNING, "could not list")]),
])
def test_a_replica_cursor_must_exist_on_the_source_and_on_the_target(snaps, listing, expected):
    target = TargetListing("backup:pool/bak", "pool/bak/data", listing,
                           None if listing is not None else "host unreachable")
    found = audit_graph(graph_input(*CHAIN, snapshots=snaps, cursors=[cursor(9)],
                                    targets={("backup:pool/bak", "pool/bak/data"): target}))
    assert len(found) == len(expected), [f.problem for f in found]
    assert [(f.severity, w) for f, (_, w) in zip(found, expected, strict=True)
            if w in f.problem] == expected
    assert all(f.target == "backup:pool/bak" and f.job == "job" for f in found)


def test_an_rsync_cursor_is_not_looked_up_on_a_zfs_target():
    found = audit_graph(graph_input(*CHAIN, snapshots=[snap_row(9)], cursors=[cursor(9, "rsync")],
                                    targets={("backup:pool/bak", "pool/bak/data"): TargetListing(
                                        "backup:pool/bak", "pool/bak/data", frozenset())}))
    assert found == []


def test_streams_of_other_stores_and_datasets_are_separate_chains():
    specs = [stream(1, 0), stream(2, 4, frm=0, parent=1),
             stream(11, 0, store="warm"), stream(12, 4, frm=0, parent=11, store="warm", state="bad")]
    error, = problems(audit_graph(graph_input(*specs)), Severity.ERROR)
    # @s1..@s4 are restorable from store cold, not from warm
    assert error.stream == 12 and "store warm: @s1, @s2, @s3, @s4" in error.problem


def test_the_carried_table_gives_back_each_streams_snapshots():
    table = CarriedTable.from_mapping({s[0].id: s[1] for s in CHAIN})
    assert table.of(2) == CHAIN[1][1] and table.of(99) == []


def test_a_long_chain_is_resolved_without_recursion():
    specs = [stream(1, 0)] + [stream(i + 1, i, frm=i - 1, parent=i) for i in range(1, 5000)]
    assert audit_graph(graph_input(*specs)) == []


# -- which streams a deep audit reads (pure parts of audit.deep) --------------------------

def test_deep_reads_never_verified_streams_first_then_the_longest_ago_verified():
    from zrepl_py.audit.deep import choose

    rows = [dataclasses.replace(CHAIN[0][0], verified_at=T0 + dt.timedelta(days=2)),
            dataclasses.replace(CHAIN[1][0], verified_at=None),
            dataclasses.replace(CHAIN[2][0], verified_at=T0 + dt.timedelta(days=1)),
            dataclasses.replace(stream(4, 5)[0], state="bad")]
    assert [s.id for s in choose(rows, None)] == [2, 3, 1]
    assert [s.id for s in choose(rows, 34)] == [2, 3]
    assert [s.id for s in choose(rows, 1)] == [2]
    with pytest.raises(ValueError):
        choose(rows, 0)


def test_a_test_receive_covers_each_chain_once_from_its_full_to_its_newest_stream():
    from zrepl_py.audit.deep import chains_to_receive

    rows = [s[0] for s in CHAIN] + [stream(11, 20)[0], stream(12, 21, frm=20, parent=11)[0]]
    paths = chains_to_receive([rows[1], rows[2], rows[3]], rows)
    assert [[s.id for s in p] for p in paths] == [[1, 2, 3], [11, 12]]
