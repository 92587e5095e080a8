"""The restore planner (pure): which source it picks, why, and what it refuses
(docs/decisions.md#the-cheapest-restore-source-is-chosen-and-the-plan-says-why,
docs/decisions.md#restore-needs-nothing-of-the-original-pool).

Facts are built by hand here: a dataset ``tank/data`` with snapshots @0..@9, its listing
on its host (or the pool gone), replicas, stores with chains in several storage classes,
damaged and bad streams, and the ``--into`` side.
"""

from __future__ import annotations

import dataclasses

import pytest
from support.restore_facts import CHAIN, DATA, MB, NEAR, S, listing, snap, store

from zrepl_py.config.restore import RestoreConfig
from zrepl_py.errors import RestoreError, UsageError
from zrepl_py.restore.facts import IntoFacts, Listing, RestoreFacts
from zrepl_py.restore.plan import plan_restore

GONE = Listing("local", DATA, problem="cannot list local:tank/data: cannot open 'tank': no such pool")


def facts(local: Listing = GONE, *, replicas=(), stores=(), into: str = "other/data",
          into_host: str = "local", exists: bool = False,
          into_problem: str | None = None) -> RestoreFacts:
    return RestoreFacts("local", DATA, local, tuple(replicas), tuple(stores),
                        tuple(snap(n) for n in range(10)),
                        IntoFacts(into_host, into, exists, into_problem), RestoreConfig())


BIG = store("big", S(1, 0, mb=40), S(2, 9, base=0, parent=1, mb=27))      # 67 MB
SMALL = store("small", S(11, 0, mb=20), S(12, 9, base=0, parent=11, mb=5))  # 25 MB

CHOICES = [
    # (id, facts, --to, --from, (source, label, chosen path's stream ids), reason words)
    ("a snapshot on the dataset itself is copied locally before any replica or store",
     facts(listing(*range(10)), replicas=[listing(9, host="bak")], stores=[SMALL]), "@9", None,
     ("local", "local", ()), ["is on tank/data itself"]),
    ("the source pool gone: a replica that has the snapshot comes before the archive",
     facts(replicas=[listing(*range(10), host="bak", dataset="b/data")], stores=[SMALL]), "@9",
     None, ("replica", "bak", ()), ["replica bak:b/data has @9", "the local dataset cannot be used"]),
    ("a replica on this host is labelled with its dataset",
     facts(replicas=[listing(*range(10), dataset="b/data")]), "@5", None,
     ("replica", "local:b/data", ()), ["replica local:b/data"]),
    ("a replica without the snapshot leaves the archive",
     facts(replicas=[listing(1, 2, host="bak")], stores=[store("cold", *CHAIN)]), "@9", None,
     ("archive", "cold", (1, 2, 3)), ["cheapest store: cold", "no local or replica snapshot can be used"]),
    ("the path from the nearest full is taken when it reads fewer bytes",
     facts(stores=[store("cold", *CHAIN, *NEAR)]), "@9", None,
     ("archive", "cold", (4, 5)), ["13.0 MB in 2 stream(s)"]),
    ("a snapshot inside an incremental is reached through its chain",
     facts(stores=[store("cold", *CHAIN, *NEAR)]), "@6", None,
     ("archive", "cold", (1, 2, 3)), ["20.0 MB in 3 stream(s)"]),
    ("of two stores holding the snapshot, the one with fewer bytes to read wins",
     facts(stores=[BIG, SMALL]), "@9", None,
     ("archive", "small", (11, 12)), ["cheapest store: small (no thaw, 25.0 MB", "over big (no thaw, 67.0 MB"]),
    ("a cold store costs more than a STANDARD one with more bytes",
     facts(stores=[store("deep", S(1, 9, mb=5, cls="DEEP_ARCHIVE")), store("warm", S(2, 9, mb=60))]),
     "@9", None, ("archive", "warm", (2,)), ["cheapest store: warm (no thaw", "deep (thaw 1 object(s)"]),
    ("between cold classes the cheaper thaw wins",
     facts(stores=[store("deep", S(1, 9, mb=5, cls="DEEP_ARCHIVE")),
                   store("glacier", S(2, 9, mb=5, cls="GLACIER"))]),
     "@9", None, ("archive", "glacier", (2,)), ["cheapest store: glacier (thaw 1 object(s), about 5 h",
                                                 "over deep (thaw 1 object(s), about 12 h"]),
    ("a store with a missing object is passed over for another",
     facts(stores=[store("cheap", *CHAIN, damaged={2: "cheap/2/vol-0.zst missing"}), BIG]), "@9",
     None, ("archive", "big", (1, 2)), ["cheapest store: big"]),
    ("a bad stream breaks only the chains through it",
     facts(stores=[store("cold", *CHAIN, dataclasses.replace(NEAR[0], state="bad"), NEAR[1])]), "@9",
     None, ("archive", "cold", (1, 2, 3)), []),
    ("--from forces a dearer store and says so",
     facts(listing(*range(10)), stores=[BIG, SMALL]), "@9", "big",
     ("archive", "big", (1, 2)), ["forced with --from big (no thaw, 67.0 MB"]),
    ("--from local refuses nothing when the snapshot is there",
     facts(listing(*range(10)), stores=[SMALL]), "@3", "local", ("local", "local", ()), ["forced"]),
]


@pytest.mark.parametrize("case", CHOICES, ids=[c[0] for c in CHOICES])
def test_the_planner_picks_the_cheapest_usable_source_and_says_why(case):
    _, given, to, from_, (source, label, stream_ids), words = case
    plan = plan_restore(given, to, from_)
    assert (plan.chosen.source, plan.chosen.label) == (source, label)
    assert plan.target == snap(int(to.lstrip("@")))
    if stream_ids:
        assert tuple(s.id for s in plan.chosen.path.streams) == stream_ids
        assert set(plan.volumes) == set(stream_ids)
    for word in words:
        assert word in plan.reason, plan.reason


def test_the_plan_lists_every_option_with_its_problem_usable_first():
    plan = plan_restore(facts(stores=[BIG, SMALL, store("cold", *CHAIN, damaged={3: "x missing"})]),
                        "@9", None)
    assert [(o.label, o.problem is None) for o in plan.options] == [
        ("small", True), ("big", True), ("local", False), ("cold", False)]
    assert "no such pool" in plan.options[2].problem
    assert plan.options[3].problem == ("the chain carrying @9 in store cold is damaged: stream 3"
                                       " (incremental @9): x missing")


def test_the_same_name_on_another_host_is_a_copy_of_the_local_snapshots():
    plan = plan_restore(facts(listing(*range(10)), stores=[SMALL], into=DATA, into_host="new"),
                        "@9", None)
    assert (plan.chosen.source, plan.into_host, plan.into) == ("local", "new", DATA)


def test_a_pull_jobs_own_snapshots_are_labelled_with_the_masters_host_not_local():
    """On the backup host of a pull job the dataset lives on the master; a replica on this
    machine is on host ``local``. The master's option is named by its host, and ``--from
    local`` still forces the dataset's own snapshots (the source kind), as documented."""
    pulled = dataclasses.replace(facts(listing(*range(10), host="master")), host="master",
                                 replicas=(listing(*range(10), dataset="b/data"),))
    plan = plan_restore(pulled, "@9", None)
    assert [(o.source, o.label) for o in plan.options] == [
        ("local", "master"), ("replica", "local"), ("archive", "archive")]
    assert plan_restore(pulled, "@9", "master").chosen.source == "local"
    assert plan_restore(pulled, "@9", "local").chosen.source == "local"


def test_a_cold_chain_carries_its_thaw_estimate_into_the_plan():
    plan = plan_restore(facts(stores=[store("deep", S(1, 0, mb=5, cls="DEEP_ARCHIVE"),
                                            S(2, 9, base=0, parent=1, mb=1, cls="GLACIER"))]),
                        "@9", None)
    assert plan.thaw is not None and plan.thaw.objects == 2 and plan.thaw.bytes == 6 * MB


def test_a_restore_onto_the_dataset_itself_skips_its_own_snapshots_then_refuses_the_existing_dataset():
    given = facts(listing(*range(10)), stores=[SMALL], into=DATA, exists=True)
    with pytest.raises(RestoreError, match="tank/data exists; zbak restore never overwrites"):
        plan_restore(given, "@9", None)
    with pytest.raises(RestoreError, match="is on tank/data already"):
        plan_restore(given, "@9", "local")
    plan = plan_restore(dataclasses.replace(given, into=dataclasses.replace(given.into, exists=False)),
                        "@9", None)
    assert [o.label for o in plan.options] == ["small", "local"] and plan.chosen.label == "small"


REFUSALS = [
    # (id, facts, --to, --from, error, message words)
    ("--from a store whose only chain is bad says which stream",
     facts(stores=[store("cold", S(1, 0), S(2, 4, base=0, parent=1, state="bad"))]), "@4", "cold",
     RestoreError, ["--from cold: the chain carrying @4 in store cold is bad: stream 2"
                    " (incremental @4) is marked bad", "newest snapshot that can be restored is @0"]),
    ("a refusal for a bad stream states the reason it was marked bad for, with the key",
     facts(stores=[store("cold", S(1, 0), S(2, 4, base=0, parent=1, state="bad",
                                            why="volume 0 (cold/2/vol-0.zst) is missing (found"
                                                " by zbak audit at 2026-01-02 03:04Z)"))]),
     "@4", "cold", RestoreError,
     ["stream 2 (incremental @4) is marked bad: volume 0 (cold/2/vol-0.zst) is missing (found by"
      " zbak audit at 2026-01-02 03:04Z)"]),
    ("a stream marked bad before reasons were kept says its reason was not recorded",
     facts(stores=[store("cold", S(1, 0), S(2, 4, base=0, parent=1, state="bad"))]), "@4", "cold",
     RestoreError, ["stream 2 (incremental @4) is marked bad: the reason was not recorded"]),
    ("--from naming no source lists the sources",
     facts(stores=[store("cold", S(1, 0), S(2, 4, base=0, parent=1))]),
     "@4", "nowhere", UsageError, ["--from nowhere: not a source of tank/data (sources: cold, local)"]),
    ("a snapshot no source can restore names the newest one that can be",
     facts(stores=[store("cold", *CHAIN[:2], dataclasses.replace(CHAIN[2], state="condemned"))]),
     "@7", None, RestoreError, ["nothing can restore tank/data@7", "local: not available",
                                "stream 3 (incremental @9) is condemned",
                                "the newest snapshot that can be restored is @4 (from cold)"]),
    ("a snapshot nobody knows names the newest restorable one",
     facts(replicas=[listing(1, 2, host="bak")]), "@nope", None, RestoreError,
     ["no snapshot @nope of tank/data", "newest snapshot that can be restored is @2 (from bak)"]),
    ("with no source at all the refusal says none can be restored",
     facts(), "@3", None, RestoreError,
     ["no store holds a stream of tank/data", "no snapshot of it can be restored from any source"]),
    ("the source pool gone and no --into: the destination's pool is the problem",
     facts(stores=[SMALL], into=DATA, into_problem="the pool tank of local:tank/data cannot be used"),
     "@9", None, RestoreError, ["cannot restore tank/data@9 into local:tank/data: the pool tank"]),
    ("a missing --into parent is refused after a source was found",
     facts(stores=[SMALL], into_problem="the parent local:other of other/data does not exist"),
     "@9", None, RestoreError, ["the parent local:other of other/data does not exist"]),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_the_planner_refuses_with_what_went_wrong_and_what_can_be_restored(case):
    _, given, to, from_, error, words = case
    with pytest.raises(error) as caught:
        plan_restore(given, to, from_)
    for word in words:
        assert word in str(caught.value), str(caught.value)


def test_an_unknown_snapshot_names_the_dataset_with_its_host_when_it_is_not_local():
    """``zbak restore oldhost:tank/data --to @x``: the catalog may know a host the config no
    longer has (its archive), so the host is no error, but the message must say which."""
    remote = dataclasses.replace(facts(), host="oldhost")
    with pytest.raises(RestoreError, match="no snapshot @x of oldhost:tank/data is known"):
        plan_restore(remote, "@x", None)
    with pytest.raises(RestoreError, match="no snapshot @x of tank/data is known"):
        plan_restore(facts(), "@x", None)


def resuming(*held: int, mark: str = "local:tank/data") -> RestoreFacts:
    """The chain @0 (full), -I @0 -> @4, -I @4 -> @9 in store cold; ``other/data`` exists
    holding ``held`` with zbak's mark of an interrupted restore (``mark``)."""
    return dataclasses.replace(facts(stores=[store("cold", *CHAIN)]), into=IntoFacts(
        "local", "other/data", exists=True, snapshots=tuple(snap(n) for n in held),
        restoring=mark))


def test_an_interrupted_restore_is_continued_with_the_streams_it_lacks():
    plan = plan_restore(resuming(0, 1, 2, 3, 4), "@9", None)
    assert plan.resumed == 2 and [s.id for s in plan.chosen.path.streams] == [3]
    assert set(plan.volumes) == {3}
    assert "holds the first 2 stream(s) from an interrupted restore" in plan.reason
    assert "5.0 MB in 1 stream(s)" in plan.reason, "the cost of what is left"
    chosen = [o for o in plan.options if o is plan.chosen]
    assert chosen, "the plan shows the streams left as the chosen option"
    assert plan_restore(resuming(0), "@9", None).resumed == 1


@pytest.mark.parametrize("facts_, words", [
    (dataclasses.replace(resuming(0, 1), into=dataclasses.replace(
        resuming(0, 1).into, restoring=None)), "exists; zbak restore never overwrites"),
    (resuming(0, 1, 2, 3, 4, mark="local:tank/other"), "interrupted restore of local:tank/other"),
    (resuming(0, 1, 2), "not the first streams of the chain"),
    (resuming(0, 2, 3, 4, 5), "not the first streams of the chain"),
    (resuming(*range(10)), "after its last stream was received"),
])
def test_a_dataset_that_is_not_an_interrupted_restore_of_the_chain_is_refused(facts_, words):
    """Never overwritten: a dataset without zbak's mark (an admin's, a finished restore),
    one a restore of another dataset left, one whose snapshots stop inside a stream or were
    not all received from this chain, and one that holds the whole chain already."""
    with pytest.raises(RestoreError, match=words):
        plan_restore(facts_, "@9", None)


def test_an_interrupted_restore_continues_from_a_local_or_replica_source_with_one_incremental():
    """A local or replica source sends a full and one -I: what the full brought (and any
    first snapshots) stays, the -I goes from the newest snapshot held."""
    local = dataclasses.replace(resuming(0), local=listing(*range(10)))
    plan = plan_restore(local, "@9", None)
    assert plan.chosen.source == "local" and plan.resumed == 1
    assert [s.name for s in plan.chosen.snapshots] == [str(n) for n in range(10)]
    assert "holds @0 from an interrupted restore: continuing with -I @0 @9" in plan.reason
    assert plan_restore(local, "@9", "cold").resumed == 1, "or from the store: one stream done"
    with pytest.raises(RestoreError, match="not the first of the ones local sends now"):
        plan_restore(dataclasses.replace(resuming(0, 5), local=listing(*range(10))), "@9", None)
    with pytest.raises(RestoreError, match="after its last snapshot was received"):
        plan_restore(dataclasses.replace(resuming(0), local=listing(0)), "@0", None)
