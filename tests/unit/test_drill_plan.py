"""The drill planner (pure): the newest snapshot each source can restore, what is skipped by
design and why, what is a problem, and ``--from`` (docs/drills.md,
docs/decisions.md#a-drill-is-a-restore-into-scratch).

Facts are built by hand as in ``test_restore_plan``: a dataset ``tank/data`` with snapshots
@0..@9, stores with chains, replica listings, and the source's listing now.
"""

from __future__ import annotations

import dataclasses

import pytest
from support.restore_facts import CHAIN, DATA, NEAR, S, listing, snap, store

from zrepl_py.config.restore import RestoreConfig
from zrepl_py.drill.gather import NOT_DRILLED
from zrepl_py.drill.plan import (
    REPLICA,
    STORE,
    DrillFacts,
    SourceFacts,
    plan_drill,
    select_sources,
)
from zrepl_py.errors import UsageError
from zrepl_py.restore.facts import IntoFacts, Listing, RestoreFacts

SCRATCH = "tank/scratch/zbak-drill-0a1b2c3d"


def restore(*, stores=(), replicas=(), into_host: str = "local") -> RestoreFacts:
    return RestoreFacts("local", DATA, Listing("local", DATA, problem=NOT_DRILLED),
                        tuple(replicas), tuple(stores), tuple(snap(n) for n in range(10)),
                        IntoFacts(into_host, f"{SCRATCH}/d0"), RestoreConfig())


def source(label: str, kind: str = STORE, host: str = "local", **facts) -> SourceFacts:
    return SourceFacts(label, kind, host, SCRATCH, (restore(into_host=host, **facts),))


EVERY = listing(*range(10))


def drill(*sources: SourceFacts, now: Listing = EVERY, thaw: bool = False,
          unreadable: str | None = None, from_: str | None = None):
    facts = DrillFacts("data", select_sources("data", sources, from_), {DATA: now},
                       unreadable, thaw)
    return plan_drill(facts).sources


def test_a_store_drills_the_newest_snapshot_it_can_restore_with_the_restore_planners_path():
    (planned,) = drill(source("cold", stores=[store("cold", *CHAIN, *NEAR)]))
    (item,) = planned.items
    assert (planned.skip, planned.problem) == (None, None)
    assert item.plan.target == snap(9) and item.original == snap(9)
    assert [s.id for s in item.plan.chosen.path.streams] == [4, 5]  # the nearest full
    assert item.plan.into == f"{SCRATCH}/d0"


def test_a_damaged_newest_stream_leaves_the_newest_snapshot_still_restorable():
    cold = store("cold", *CHAIN, S(4, 8, mb=12), S(5, 9, base=8, parent=4, state="bad"))
    (planned,) = drill(source("cold", stores=[cold]))
    assert planned.items[0].plan.target == snap(9)  # through the older chain
    assert [s.id for s in planned.items[0].plan.chosen.path.streams] == [1, 2, 3]
    cold = store("cold", S(1, 0), S(2, 4, base=0, parent=1), S(3, 9, base=4, parent=2),
                 damaged={3: "vol-0 missing"})
    (planned,) = drill(source("cold", stores=[cold]))
    assert planned.items[0].plan.target == snap(4)


def test_a_store_that_can_restore_nothing_is_a_problem_naming_the_dataset():
    (planned,) = drill(source("cold", stores=[store("cold", S(1, 0, state="bad", why="x"))]))
    assert planned.problem is not None and planned.problem.startswith(f"{DATA}: ")
    assert planned.items == ()


def test_a_cold_store_is_skipped_with_what_thawing_costs_unless_thaw_is_set():
    cold = store("glacier", S(1, 0, cls="GLACIER", mb=100), S(2, 9, base=0, parent=1, mb=1))
    (skipped,) = drill(source("glacier", stores=[cold]))
    assert skipped.skip is not None and skipped.skip.startswith("cold: would thaw 1 object(s)")
    assert "100.0 MB, tier Standard: about 5 h and $" in skipped.skip
    assert "set [jobs.data.drill] thaw = true" in skipped.skip
    assert skipped.thaw is not None and skipped.thaw.objects == 1
    (planned,) = drill(source("glacier", stores=[cold]), thaw=True)
    assert planned.skip is None and planned.thaw == skipped.thaw
    assert planned.items[0].plan.target == snap(9)


def test_a_sealed_store_without_an_identity_is_skipped_not_failed():
    sealed = dataclasses.replace(source("cold", stores=[store("cold", *CHAIN)]),
                                 needs_identity=True)
    (planned,) = drill(sealed)
    assert planned.skip is not None and planned.skip.startswith("no identity")
    (planned,) = drill(dataclasses.replace(sealed, identity=True))
    assert planned.skip is None and planned.items


def test_a_replica_drills_its_newest_snapshot_on_its_own_host():
    replica = source("bak:b/data", REPLICA, "bak",
                     replicas=[listing(*range(8), host="bak", dataset="b/data")])
    (planned,) = drill(replica)
    plan = planned.items[0].plan
    assert (plan.target, plan.chosen.source, plan.chosen.host) == (snap(7), "replica", "bak")
    assert plan.into_host == "bak" and planned.host == "bak"


def test_where_the_source_snapshot_is_gone_or_unreadable_only_the_guid_is_checked():
    cold = source("cold", stores=[store("cold", *CHAIN)])
    (planned,) = drill(cold, now=listing(1, 2))
    assert planned.items[0].original is None
    assert "@9 is gone from local:tank/data" in planned.items[0].gone
    (planned,) = drill(cold, unreadable="cannot list local:tank/data: host down")
    assert "the source cannot be read (cannot list" in planned.items[0].gone


def test_a_source_gather_could_not_use_is_a_problem():
    broken = SourceFacts("cold", STORE, "local", None, (), problem="store cold is not in x")
    (planned,) = drill(broken)
    assert planned.problem == "store cold is not in x"


def test_from_picks_a_source_by_its_label_or_a_replicas_host_and_refuses_others():
    cold = source("cold", stores=[store("cold", *CHAIN)])
    replica = source("bak:b/data", REPLICA, "bak",
                     replicas=[listing(*range(8), host="bak", dataset="b/data")])
    assert [s.label for s in drill(cold, replica)] == ["cold", "bak:b/data"]
    assert [s.label for s in drill(cold, replica, from_="cold")] == ["cold"]
    assert [s.label for s in drill(cold, replica, from_="bak")] == ["bak:b/data"]
    assert [s.label for s in drill(cold, replica, from_="bak:b/data")] == ["bak:b/data"]
    with pytest.raises(UsageError, match=r"--from local: not a source of job data \(sources:"
                                         r" cold, bak:b/data\)"):
        drill(cold, replica, from_="local")
