"""The failover and failback planners over plain facts (docs/design.md#replica-failover-and-failback,
docs/decisions.md#failback-keeps-the-source-aside-by-rename-and-clone): what is common is decided
by guid, the source's later writes are kept (renamed, cloned back), never destroyed, a rerun
picks up from what the datasets say, the version check stops a stream the source cannot take."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from zrepl_py.failover.plan import (
    FailbackFacts,
    FailoverFacts,
    ReceiverLimits,
    ReplicaState,
    SourceState,
    caught_up,
    plan_failback,
    plan_failover,
)
from zrepl_py.values.failover import FailoverMark, SourceMark
from zrepl_py.zfs.names import DatasetName, SnapshotName
from zrepl_py.zfs.steps import SnapRef

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
AT = dt.datetime(2026, 3, 1, 9, 30, 0, tzinfo=dt.UTC)
SRC, REP = DatasetName("tank/data"), DatasetName("backup/rep/data")
KEPT = DatasetName("tank/data-before-failback-20260301T093000Z")
MARK = FailoverMark(AT, "j", False, "b")


def snap(name: str, txg: int, guid: int | None = None) -> SnapRef:
    """A snapshot; its guid defaults to 1000 + a per-name number so both sides share it."""
    return SnapRef(name, guid if guid is not None else 1000 + ord(name[0]), txg)


A, B, C = snap("a", 10), snap("b", 20), snap("c", 30)
F = snap("f", 40)  # the replica's last snapshot (taken on it after the failover)
X = snap("x", 25)  # a source-only snapshot after the common one


def replica(rel: str = "", *snaps: SnapRef, marked: bool = True, **kw: object) -> ReplicaState:
    defaults: dict[str, object] = {"readonly": False, "mounted": True, "mountpoint": "/srv/data",
                                   "canmount": "on", "zpl_version": 4}
    defaults.update(kw)
    return ReplicaState(REP.child(rel), "filesystem", tuple(snaps or (A, B)),
                        MARK if marked else None, **defaults)  # type: ignore[arg-type]


def source(rel: str = "", *snaps: SnapRef, root: DatasetName = SRC, **kw: object) -> SourceState:
    defaults: dict[str, object] = {"readonly": False, "mounted": True, "written": 0}
    defaults.update(kw)
    return SourceState(root.child(rel), "filesystem", tuple(snaps or (A, B)),
                       **defaults)  # type: ignore[arg-type]


def facts(replicas: list[ReplicaState], sources: dict[str, SourceState], **kw: object
          ) -> FailbackFacts:
    return FailbackFacts("j", "backup:backup/rep/data", REP, SRC, tuple(replicas), sources,
                         **kw)  # type: ignore[arg-type]


def back(f: FailbackFacts):
    return plan_failback(f, now=NOW)


# -- failback: the keep decision and the action per dataset ----------------------------

KEEP_CASES = [
    # id, source state, keep?, reason words
    ("clean, written 0", source("", A, B), False, None),
    ("later snapshot on the source", source("", A, B, X), True, "1 snapshot(s) after @b"),
    ("written since the common snapshot", source("", A, B, written=4096), True,
     "was written since @b (4096 bytes)"),
    ("written unknown and mounted", source("", A, B, written=None), True,
     "is mounted and may have been written"),
    ("written unknown, not mounted: zfs receive decides", source("", A, B, written=None,
                                                                 mounted=False), False, None),
    ("frozen by zbak (mark, read-only)", source("", A, B, written=None, readonly=True,
                                               mark=SourceMark(AT, "j")), False, None),
    ("frozen, zfs-fuse cannot tell readonly", source("", A, B, written=None, readonly=None,
                                                    mark=SourceMark(AT, "j")), False, None),
    ("marked but writable again", source("", A, B, written=None, readonly=False,
                                         mark=SourceMark(AT, "j")), True, "may have been"),
    ("no common snapshot", source("", snap("q", 5, 77)), True, "no snapshot in common"),
]


@pytest.mark.parametrize("state,keep,words", [c[1:] for c in KEEP_CASES],
                         ids=[c[0] for c in KEEP_CASES])
def test_what_the_source_wrote_after_the_common_snapshot_is_kept_aside_never_destroyed(
        state, keep, words):
    plan = back(facts([replica("", A, B, F)], {"": state}, full=True))
    assert (plan.kept_root is not None) is keep
    if keep:
        assert plan.kept_root == KEPT and plan.rename
        assert words in "; ".join(plan.kept_because)
        assert plan.datasets[0].kept_as == KEPT
    else:
        assert plan.datasets[0].action == "receive" and plan.kept_root is None
        assert plan.datasets[0].common == B


def test_zfs_receive_finding_a_direct_source_written_makes_the_plan_keep_it():
    quiet = source("", A, B, written=None, mounted=False)
    assert back(facts([replica("", A, B, F)], {"": quiet})).kept_root is None
    plan = back(facts([replica("", A, B, F)], {"": quiet}, modified=frozenset({""})))
    assert plan.kept_root == KEPT and "zfs receive found" in plan.kept_because[0]
    assert plan.datasets[0].action == "clone"


def test_common_is_decided_by_guid_not_by_name():
    # The source's "b" is another snapshot (destroyed and made again): "a" is the common one.
    plan = back(facts([replica("", A, B, F)], {"": source("", A, snap("b", 21, 4242))}))
    assert plan.datasets[0].common == A
    assert plan.kept_root == KEPT, "its own @b comes after @a: kept"


def test_a_kept_tree_makes_each_replica_dataset_again_as_a_clone_of_its_common_snapshot():
    plan = back(facts([replica("", A, B, F), replica("kid", A, B, F)],
                      {"": source("", A, B, X), "kid": source("kid", A, B),
                       "own": source("own", A)}))
    assert plan.rename and plan.kept_root == KEPT
    actions = {b.rel: (b.action, b.kept_as, b.clone_from) for b in plan.datasets}
    assert actions == {
        "": ("clone", KEPT, SnapshotName(f"{KEPT}@b")),
        "kid": ("clone", KEPT.child("kid"), SnapshotName(f"{KEPT}/kid@b")),
    }, "a clean child is made again too: the rename moved the whole tree"
    assert plan.back == ("own",), "the source's own dataset the replica lacks goes back"
    assert all(b.mark is not None and b.mark.job == "j" for b in plan.datasets)


def test_the_clone_puts_back_the_readonly_the_source_had_before_zbak_froze_it():
    frozen = source("", A, B, X, readonly=True, readonly_local="on",
                    mark=SourceMark(AT, "j", readonly=None))
    plan = back(facts([replica("", A, B, F)], {"": frozen}))
    assert plan.datasets[0].mark == SourceMark(AT, "j", None)
    own = source("", A, B, X, readonly_local="off")
    assert back(facts([replica("", A, B, F)], {"": own})).datasets[0].mark.readonly == "off"


RERUN_CASES = [
    # after the rename: the source's name is free, the tree is in the kept name
    ("renamed", {}, {"": source("", A, B, X, root=KEPT)}, "clone"),
    # after the clone: the source is a clone of the kept @b, not promoted yet
    ("cloned", {"": source("", root=SRC, origin=SnapshotName(f"{KEPT}@b"), written=None,
                           readonly=True, mark=SourceMark(AT, "j"))},
     {"": source("", A, B, X, root=KEPT)}, "promote"),
    # after the promote: it owns @a and @b, the kept one is its clone
    ("promoted", {"": source("", A, B, readonly=True, mark=SourceMark(AT, "j"))},
     {"": source("", X, root=KEPT, origin=SnapshotName(f"{SRC}@b"))}, "receive"),
]


@pytest.mark.parametrize("sources,kept,action", [c[1:] for c in RERUN_CASES],
                         ids=[c[0] for c in RERUN_CASES])
def test_a_rerun_plans_from_what_the_datasets_say_after_each_step_of_the_keep(
        sources, kept, action):
    plan = back(facts([replica("", A, B, F)], sources, kept=kept))
    assert not plan.rename and plan.kept_root == KEPT
    assert [b.action for b in plan.datasets] == [action]
    assert not plan.blockers


def test_no_common_snapshot_offers_the_full_resend_and_needs_full():
    for sources in ({}, {"": source("", snap("q", 5, 77))}):
        without = back(facts([replica("", A, B, F)], sources))
        assert without.needs_full and any("--full" in b for b in without.blockers)
        with_full = back(facts([replica("", A, B, F)], sources, full=True))
        assert [b.action for b in with_full.datasets] == ["full"]
        assert not with_full.blockers


def test_a_dataset_made_on_the_replica_after_the_failover_is_sent_whole_without_asking():
    """It carries no mark (the failover marked the datasets there were): it is in the
    failback all the same, and so in its version check."""
    for marked in (True, False):
        plan = back(facts([replica("", A, B, F), replica("new", F, marked=marked)],
                          {"": source("", A, B)}))
        assert [(b.rel, b.action) for b in plan.datasets] == [("", "receive"), ("new", "full")]
        assert not plan.blockers and not plan.needs_full
    released = back(facts([replica("", A, B, F), replica("kid", A, B, marked=False)],
                          {"": source("", A, B), "kid": source("kid", A, B)}))
    assert [b.rel for b in released.datasets] == [""], "a replica of the source's own kid"


def test_a_rerun_after_a_full_stream_killed_before_its_mark_receives_no_second_full():
    """A failback killed between the full stream of a dataset made on the replica (every
    snapshot newer than the failover's base, @b) and its mark left it on the source unmarked:
    the rerun has it in scope (held, its cursor moved, made live) and sends it incrementally
    from what the stream brought, never whole again. A killed --full resend of the root
    likewise."""
    frozen = source("", A, B, F, mark=SourceMark(AT, "j"), readonly=True)
    made = source("new", F, mounted=False, written=None)
    plan = back(facts([replica("", A, B, F), replica("new", F, marked=False)],
                      {"": frozen, "new": made}))
    assert [(b.rel, b.action, b.common) for b in plan.datasets] == [
        ("", "receive", F), ("new", "receive", F)]
    assert not plan.blockers and not plan.needs_full and plan.kept_root is None
    resent = back(facts([replica("", F)], {"": source("", F, mounted=False, written=None)},
                        full=True))
    assert [(b.action, b.common) for b in resent.datasets] == [("receive", F)]


def test_the_sources_own_dataset_named_as_one_made_on_the_replica_is_kept_aside():
    """No snapshot in common: the source's is kept (renamed with the tree), the replica's
    goes whole only with --full."""
    plan = back(facts([replica("", A, B, F), replica("new", F, marked=False)],
                      {"": source("", A, B), "new": source("new", X)}))
    assert plan.rename and plan.kept_root == KEPT
    assert [(b.rel, b.action) for b in plan.datasets] == [("", "clone"), ("new", "full")]
    assert plan.needs_full and any("--full" in b for b in plan.blockers)


def test_the_version_check_names_what_the_source_pool_cannot_receive():
    limits = ReceiverLimits(zpl_version=4, encryption=False, large_dnode=False)
    plan = back(facts([replica("", A, B, F, zpl_version=5, encrypted=True, large_dnodes=True)],
                      {"": source("", A, B)}, receiver=limits))
    text = "; ".join(plan.blockers)
    assert "ZPL version 5" in text and "at most version 4" in text
    assert "encrypted" in text and "large dnodes" in text
    assert "ZPL version 5; the source's pool" in plan.versions
    assert plan.versions.endswith("cannot receive the newer ones (blockers)")
    fits = back(facts([replica("", A, B, F)], {"": source("", A, B)}, receiver=limits))
    assert not fits.blockers
    assert fits.versions == ("version check: the replica's datasets are ZPL version 4; the "
                             "source's pool tank writes up to version 4: it can receive them")
    assert back(facts([replica("", A, B, F)], {"": source("", A, B)})).versions == ""


def test_a_missing_pool_another_jobs_mark_and_a_pool_root_source_are_blockers():
    assert "does not exist" in back(facts([replica("", A, B, F)], {},
                                          source_pool=False)).blockers[0]
    other = dataclasses.replace(replica("", A, B, F), mark=FailoverMark(AT, "other"))
    assert "by job other" in back(facts([other], {"": source("", A, B)})).blockers[0]
    pool_root = FailbackFacts("j", "t", REP, DatasetName("tank"), (replica("", A, B, F),),
                              {"": SourceState(DatasetName("tank"), snapshots=(A, B, X))})
    assert "root dataset" in plan_failback(pool_root, now=NOW).blockers[0]


def test_once_the_replica_is_released_only_the_source_goes_live():
    plan = back(facts([replica("", A, B, F, marked=False)],
                      {"": source("", A, B, F, mark=SourceMark(AT, "j")),
                       "kid": source("kid", A, mark=SourceMark(AT, "j")),
                       "other": source("other", A)}))
    assert plan.finishing and plan.mark is None
    assert [(b.rel, b.action) for b in plan.datasets] == [("", "done"), ("kid", "done")]


def test_nothing_failed_over_plans_nothing():
    plan = back(facts([replica("", A, B, marked=False)], {"": source("", A, B)}))
    assert plan.datasets == ()


def test_a_released_child_of_a_marked_root_is_in_scope_only_through_its_source_mark():
    plan = back(facts([replica("", A, B, F), replica("kid", A, B, F, marked=False)],
                      {"": source("", A, B), "kid": source("kid", A, B)}))
    assert [b.rel for b in plan.datasets] == [""]


# -- failover ---------------------------------------------------------------------------


def failover(*replicas: ReplicaState, mountpoint: str | None = None, planned: bool = False):
    return plan_failover(FailoverFacts("j", "backup:backup/rep/data", REP, tuple(replicas),
                                       NOW, planned, mountpoint))


def test_failover_marks_holds_makes_writable_and_mounts_each_replica():
    plan = failover(ReplicaState(REP, "filesystem", (A, B), readonly=True,
                                 mountpoint="/backup/rep/data", canmount="noauto",
                                 source_mountpoint="/srv/data"))
    step = plan.promotions[0]
    assert (step.set_mark, step.hold, step.readonly_off, step.mountpoint, step.canmount_on,
            step.mount) == (True, True, True, "/srv/data", True, True)
    assert step.mark == FailoverMark(NOW, "j", False, "b")
    assert "the source's" in step.where and not plan.problems and not plan.done


MOUNT_CASES = [
    # id, config, recorded on root, recorded on child, root gets, child gets
    ("config wins", "/live", "/srv/data", None, "/live", None),
    ("recorded", None, "/srv/data", None, "/srv/data", None),
    ("child with its own", None, "/srv/data", "/home", "/srv/data", "/home"),
    ("nothing recorded: inherited", None, None, None, None, None),
]


@pytest.mark.parametrize("config,root_mp,kid_mp,root_gets,kid_gets",
                         [c[1:] for c in MOUNT_CASES], ids=[c[0] for c in MOUNT_CASES])
def test_the_failover_mountpoint_is_the_config_then_the_recorded_one_children_inherit(
        config, root_mp, kid_mp, root_gets, kid_gets):
    root = ReplicaState(REP, "filesystem", (A,), mountpoint="/backup/rep/data",
                        source_mountpoint=root_mp)
    kid = ReplicaState(REP.child("kid"), "filesystem", (A,), mountpoint="/backup/rep/data/kid",
                       source_mountpoint=kid_mp)
    plan = failover(root, kid, mountpoint=config)
    assert [p.mountpoint for p in plan.promotions] == [root_gets, kid_gets]
    assert bool(plan.notes) is (root_gets is None)


def test_an_inheriting_child_is_shown_where_it_lands_below_its_parents_new_mountpoint():
    root = ReplicaState(REP, "filesystem", (A,), mountpoint="/backup/rep/data")
    kid = ReplicaState(REP.child("kid"), "filesystem", (A,), mountpoint="/backup/rep/data/kid")
    own = ReplicaState(REP.child("own"), "filesystem", (A,), mountpoint="/elsewhere",
                       mountpoint_local=True)
    plan = failover(root, kid, own, mountpoint="/live")
    assert [p.where.split(" (")[0] for p in plan.promotions] == [
        "mounted at /live", "mounted at /live/kid", "mounted at /elsewhere"]


def test_a_failover_already_done_needs_nothing_and_keeps_its_mark():
    done = ReplicaState(REP, "filesystem", (A, B), mark=MARK, readonly=False,
                        mountpoint="/srv/data", mountpoint_local=True, canmount="on",
                        mounted=True, source_mountpoint="/srv/data")
    plan = failover(done)
    assert plan.done and plan.mark == MARK and plan.promotions[0].mark == MARK


def test_a_half_done_tree_gets_the_roots_time_for_its_unmarked_children():
    root = ReplicaState(REP, "filesystem", (A, B), mark=MARK, readonly=False, canmount="on",
                        mounted=True, mountpoint="/srv/data", mountpoint_local=True,
                        source_mountpoint="/srv/data")
    kid = ReplicaState(REP.child("kid"), "filesystem", (A,), readonly=True)
    plan = failover(root, kid)
    assert plan.promotions[1].mark == FailoverMark(AT, "j", False, "a")
    assert plan.promotions[1].set_mark and not plan.promotions[0].set_mark


def test_failover_refuses_a_missing_replica_or_another_jobs_mark():
    assert "does not exist" in failover().problems[0]
    other = ReplicaState(REP, "filesystem", (A,), mark=FailoverMark(AT, "other"))
    assert "by job other" in failover(other).problems[0]


def test_a_volume_is_made_writable_but_not_mounted():
    vol = ReplicaState(REP, "volume", (A,), readonly=True, mountpoint="-", canmount="-")
    step = failover(vol).promotions[0]
    assert step.readonly_off and not step.mount and not step.canmount_on
    assert step.mountpoint is None


def test_a_planned_failover_loses_nothing_only_when_every_newest_snapshot_is_on_the_replica():
    source = [(SRC, (A, B)), (SRC.child("kid"), (A,))]
    replicas = [ReplicaState(REP, "filesystem", (A, B)),
                ReplicaState(REP.child("kid"), "filesystem", (A,))]
    assert caught_up(source, replicas, SRC, REP) == []
    behind = [ReplicaState(REP, "filesystem", (A,))]
    assert caught_up(source, behind, SRC, REP) == [
        "tank/data@b is not on backup/rep/data", "tank/data/kid has no replica on the target"]
