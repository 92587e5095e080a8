"""Snapshot filters in the replication planner 
(docs/decisions.md#snapshot-filters-keep-the-replication-base): a filter chooses what is
sent, never the base; ``-I`` spans only runs of admitted snapshots, ``-i`` jumps over
excluded ones (syncoid ``--exclude-snaps``). Pure; the CLI runs the same on real pools in
``tests/e2e/test_replicate_filters_cli.py``."""

from __future__ import annotations

from zrepl_py.config.replicate import ReplicateConfig, SnapshotFilter
from zrepl_py.replication.planner import (
    NOTHING_ADMITTED,
    ResumeToken,
    SourceState,
    TargetState,
    plan_replication,
)
from zrepl_py.zfs.steps import BookmarkRef, Full, Incremental, Resume, SnapRef

SRC, DST = "tank/data", "backup/data"


def s(name: str, txg: int) -> SnapRef:
    return SnapRef(name, 1000 + txg, txg)


A, T1, B, T2, T3, C = s("a", 10), s("tmp1", 20), s("b", 30), s("tmp2", 40), s("tmp3", 50), s("c", 60)
ALL = (A, T1, B, T2, T3, C)
NO_TMP = SnapshotFilter(exclude=["tmp*"])


def on_target(*snaps: SnapRef) -> TargetState:
    return TargetState(DST, True, tuple(SnapRef(x.name, x.guid, x.createtxg - 5) for x in snaps))


def plan(source_snaps, target_state, flt=NO_TMP, **kw):
    sendable = frozenset(x.guid for x in source_snaps if flt.admits(x.name))
    return plan_replication(SourceState(SRC, tuple(source_snaps), kw.pop("bookmarks", ())),
                            target_state, sendable=sendable, **kw)


def test_a_first_replication_sends_the_oldest_admitted_snapshot_then_jumps_over_excluded_ones():
    got = plan((T1, A, B, T2, T3, C), TargetState(DST, False))

    assert got.steps == (Full(A), Incremental(A, B, intermediates=False),
                         Incremental(B, C, intermediates=False))


def test_runs_of_admitted_snapshots_go_in_one_dash_capital_i_and_excluded_ones_never_arrive():
    d, e = s("d", 70), s("e", 80)

    got = plan(ALL + (d, e), on_target(A))

    assert got.steps == (Incremental(A, B, intermediates=False),
                         Incremental(B, C, intermediates=False),
                         Incremental(C, e, intermediates=True))


def test_without_a_filter_the_plan_is_one_dash_capital_i_as_before():
    got = plan_replication(SourceState(SRC, ALL), on_target(A))

    assert got.steps == (Incremental(A, C, intermediates=True),)


def test_an_excluded_common_snapshot_is_still_the_base():
    # @tmp1 reached the target before the filter was set; it is the newest common one.
    got = plan(ALL, on_target(A, T1))

    assert got.common.name == "tmp1" and not got.diverged
    assert got.steps == (Incremental(T1, B, intermediates=True),
                         Incremental(B, C, intermediates=False))


def test_an_excluded_newest_snapshot_leaves_the_target_up_to_date_at_the_newest_admitted():
    got = plan((A, B, T2), on_target(A, B))

    assert got.up_to_date and got.steps == ()


def test_a_bookmark_base_is_used_whatever_the_filter_says():
    mark = BookmarkRef("zbak_tmp_mark", T1.guid, T1.createtxg)

    got = plan((A, B, C), on_target(A, T1), bookmarks=(mark,))

    assert got.steps == (Incremental(mark, B, intermediates=False),
                         Incremental(B, C, intermediates=True))


def test_a_resumed_transfer_finishes_and_the_filter_applies_after_it():
    tok = ResumeToken(token="1-x", toguid=T2.guid, toname=f"{SRC}@{T2.name}", fromguid=B.guid,
                      raw=False, compressed=False, bytes=1)
    target = TargetState(DST, True, on_target(A, B).snapshots, tok)

    got = plan(ALL, target)

    assert isinstance(got.steps[0], Resume) and got.steps[0].to == T2
    assert got.steps[1:] == (Incremental(T2, C, intermediates=False),)


def test_a_filter_admitting_nothing_sends_nothing_and_says_so():
    got = plan((T1, T2), TargetState(DST, False))

    assert got.steps == () and got.note == NOTHING_ADMITTED and not got.diverged


def test_include_and_exclude_combine_and_exclude_wins():
    flt = SnapshotFilter(include=["zbak_*"], exclude=["*T00*"])

    assert flt.admits("zbak_20260101T120000Z")
    assert not flt.admits("zbak_20260101T000000Z")
    assert not flt.admits("manual")
    assert SnapshotFilter().admits("anything") and not SnapshotFilter().active


def test_a_target_without_a_filter_gets_everything_and_filters_are_found_by_endpoint():
    cfg = ReplicateConfig(targets=["pool/r", "backup:bk/r"],
                          snapshot_filter={"pool/r": {"exclude": ["tmp*"]}})

    assert not cfg.filter_for("local:pool/r").admits("tmp1")
    assert cfg.filter_for(cfg.endpoints()[0]) == cfg.filter_for("local:pool/r")
    assert cfg.filter_for("backup:bk/r").admits("tmp1")
