"""The prune planner: each safety rule keeps its snapshot, with all reasons
(docs/reliability.md#r21-replication-safety-in-pruning)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from zrepl_py.clock import UTC
from zrepl_py.config.retention import Retention
from zrepl_py.pruning.snapshot_plan import Candidate, Decision, PrunePlan, plan_prune
from zrepl_py.snapshots.naming import format_short_name, is_own

NOW = dt.datetime(2026, 3, 5, 12, 0, tzinfo=UTC)
NOTHING = Retention()
LAST1 = Retention(keep_last=1)
DESTROYED = (True, ("not selected by retention",))


def snap(
    txg: int, short: str | None = None, *, hours_ago: float | None = None, **extra
) -> Candidate:
    """A snapshot of tank/data with createtxg ``txg``.

    Without ``short`` it is zbak's own, named from its time; ``own`` follows the name.
    ``hours_ago`` defaults to ``100 - txg`` so higher txgs are newer unless a case says otherwise.
    """
    created = NOW - dt.timedelta(hours=100 - txg if hours_ago is None else hours_ago)
    short = short or format_short_name("zbak", created)
    return Candidate(f"tank/data@{short}", txg, guid=txg * 1_000_003, created=created,
                     own=is_own("zbak", short), **extra)


def kept(*reasons: str) -> tuple[bool, tuple[str, ...]]:
    return (False, reasons)


CASES = [
    # (id, candidates, policy, expected [(destroy, reasons)] in createtxg order)
    ("own snapshots not retained are destroyed and the newest is kept",
     [snap(1), snap(2), snap(3)], NOTHING,
     [DESTROYED, DESTROYED, kept("newest snapshot")]),
    ("retention reasons are added to the newest snapshot's",
     [snap(1), snap(2), snap(3)], Retention(keep_last=2),
     [DESTROYED, kept("keep_last (2 of 2)"), kept("newest snapshot", "keep_last (1 of 2)")]),
    ("a foreign snapshot is never pruned",
     [snap(1, "manual-before-upgrade"), snap(2)], NOTHING,
     [kept("not a zbak snapshot (never pruned)"), kept("newest snapshot")]),
    ("a snapshot with another job's prefix is foreign",
     [snap(1, "other_20260301T000000Z"), snap(2)], NOTHING,
     [kept("not a zbak snapshot (never pruned)"), kept("newest snapshot")]),
    ("a held snapshot is kept",
     [snap(1, userrefs=1), snap(2, userrefs=3), snap(3)], NOTHING,
     [kept("held (1 user ref)"), kept("held (3 user refs)"), kept("newest snapshot")]),
    ("a snapshot with dependent clones is kept",
     [snap(1, clones=("tank/clone", "tank/vm/clone")), snap(2)], NOTHING,
     [kept("has dependent clones: tank/clone, tank/vm/clone"), kept("newest snapshot")]),
    ("a replication base, an unreplicated snapshot and an archive base are kept",
     [snap(1, protections=("replication base of nightly -> backup:pool/x",)),
      snap(2, protections=("not yet replicated to backup:pool/x",)),
      snap(3, protections=("base of open archive chain",)), snap(4), snap(5)], LAST1,
     [kept("replication base of nightly -> backup:pool/x"),
      kept("not yet replicated to backup:pool/x"), kept("base of open archive chain"),
      DESTROYED, kept("newest snapshot", "keep_last (1 of 1)")]),
    ("every reason is collected, not just the first",
     [snap(1, "manual", userrefs=2, clones=("tank/c",), protections=("cursor of job a", "b")),
      snap(2, userrefs=1, protections=("replication base of a",)),
      snap(3, userrefs=1)], Retention(keep_last=3),
     [kept("not a zbak snapshot (never pruned)", "held (2 user refs)",
           "has dependent clones: tank/c", "cursor of job a", "b"),
      kept("held (1 user ref)", "replication base of a", "keep_last (2 of 3)"),
      kept("held (1 user ref)", "newest snapshot", "keep_last (1 of 3)")]),
    ("a foreign newest snapshot is kept for both reasons",
     [snap(1), snap(2), snap(3, "manual")], NOTHING,
     [DESTROYED, DESTROYED,
      kept("not a zbak snapshot (never pruned)", "newest snapshot")]),
    ("retention counts own snapshots only",
     [snap(1), snap(2, "manual-a"), snap(3), snap(4, "manual-b")], Retention(keep_last=2),
     [kept("keep_last (2 of 2)"), kept("not a zbak snapshot (never pruned)"),
      kept("keep_last (1 of 2)"),
      kept("not a zbak snapshot (never pruned)", "newest snapshot")]),
    ("the newest snapshot is the highest createtxg even when the clock went back",
     [snap(1, hours_ago=1), snap(2, hours_ago=30), snap(3, hours_ago=2)], NOTHING,
     [DESTROYED, DESTROYED, kept("newest snapshot")]),
    ("keep_last follows createtxg even when the clock went back",
     [snap(1, hours_ago=1), snap(2, hours_ago=30), snap(3, hours_ago=2)], Retention(keep_last=2),
     [DESTROYED, kept("keep_last (2 of 2)"), kept("newest snapshot", "keep_last (1 of 2)")]),
    ("keep_within keeps recent own snapshots",
     [snap(1, hours_ago=30), snap(2, hours_ago=20), snap(3, hours_ago=1)],
     Retention(keep_within=dt.timedelta(days=1)),
     [DESTROYED, kept("keep_within 1 day, 0:00:00"),
      kept("newest snapshot", "keep_within 1 day, 0:00:00")]),
    ("a single snapshot is always kept",
     [snap(7)], NOTHING, [kept("newest snapshot")]),
    ("no snapshots give an empty plan", [], LAST1, []),
]


@pytest.mark.parametrize("candidates, policy, expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_plan_decides_every_snapshot_with_all_its_reasons(candidates, policy, expected):
    """docs/reliability.md#r21-replication-safety-in-pruning: table-driven over the rules; every
    kept snapshot carries all its reasons."""
    plan = plan_prune(candidates, policy, NOW)
    assert [d.candidate for d in plan.decisions] == sorted(candidates, key=lambda c: c.createtxg)
    assert [(d.destroy, d.reasons) for d in plan.decisions] == expected


@pytest.mark.parametrize("candidates, policy", [c[1:3] for c in CASES], ids=[c[0] for c in CASES])
def test_no_plan_destroys_a_foreign_held_cloned_protected_or_newest_snapshot(candidates, policy):
    """docs/reliability.md#r21-replication-safety-in-pruning: never a protected (not yet replicated
    or uploaded, replication or archive base), held, cloned, foreign or newest snapshot."""
    plan = plan_prune(candidates, policy, NOW)
    newest = max((c.createtxg for c in candidates), default=None)
    for d in plan.to_destroy:
        c = d.candidate
        assert c.own and c.userrefs == 0 and not c.clones and not c.protections
        assert c.createtxg != newest


def test_decisions_are_in_createtxg_order_whatever_the_input_order_or_names():
    """docs/reliability.md#r32-clock-goes-backwards: ordering uses createtxg, never the name or the
    clock."""
    candidates = [snap(30, "b"), snap(10, "c"), snap(20, "a"), snap(5), snap(25)]
    plan = plan_prune(candidates, LAST1, NOW)
    assert [d.candidate.createtxg for d in plan.decisions] == [5, 10, 20, 25, 30]


def test_to_destroy_and_kept_split_the_decisions():
    plan = plan_prune([snap(1), snap(2, userrefs=1), snap(3), snap(4)], NOTHING, NOW)
    assert isinstance(plan, PrunePlan)
    assert all(isinstance(d, Decision) for d in plan.decisions)
    assert [d.candidate.createtxg for d in plan.to_destroy] == [1, 3]
    assert [d.candidate.createtxg for d in plan.kept] == [2, 4]
    assert set(plan.to_destroy) | set(plan.kept) == set(plan.decisions)


def test_plan_is_frozen_data():
    plan = plan_prune([snap(1)], NOTHING, NOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.decisions[0].destroy = True  # type: ignore[misc]


@pytest.mark.parametrize("make, message", [
    (lambda: plan_prune([snap(1), Candidate("tank/other@zbak_20260305T000000Z", 2, 2, NOW, True)],
                        LAST1, NOW), "one dataset"),
    (lambda: plan_prune([snap(1, "x"), snap(2, "x")], LAST1, NOW), "listed twice"),
    (lambda: plan_prune([snap(1, "x"), snap(1, "y")], LAST1, NOW), "createtxg"),
    (lambda: plan_prune([snap(1)], LAST1, dt.datetime(2026, 3, 5)), "naive"),
    (lambda: Candidate("tank/data", 1, 1, NOW, True), "DATASET@SHORT"),
    (lambda: Candidate("tank/data@a@b", 1, 1, NOW, True), "DATASET@SHORT"),
    (lambda: Candidate("@a", 1, 1, NOW, True), "DATASET@SHORT"),
    (lambda: Candidate("tank/data@a", 1, 1, dt.datetime(2026, 3, 5), True), "naive"),
    (lambda: Candidate("tank/data@a", 1, 1, NOW, True, userrefs=-1), "negative"),
], ids=["mixed datasets", "duplicate name", "duplicate createtxg", "naive now", "no @",
        "two @", "empty dataset", "naive created", "negative userrefs"])
def test_bad_input_raises_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()
