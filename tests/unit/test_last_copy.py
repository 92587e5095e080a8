"""Retention across the stores of one job (zrepl_py/pruning/last_copy.py, pure): what each
store's retention wants among every store's chains, and never deleting the last sound copy of a
wanted stream (docs/copies.md#retention-per-store); and which chains the rolling Object Lock
lets go of (``pruning.archive.released_streams``)."""

from __future__ import annotations

import datetime as dt

from zrepl_py.catalog.rows import StreamRow
from zrepl_py.config.jobs import JobConfig
from zrepl_py.copying.plan import plan_copy
from zrepl_py.pruning.archive import released_streams
from zrepl_py.pruning.chain_plan import ChainRetention, plan_chain_retention
from zrepl_py.pruning.last_copy import StorePlan, keep_last_copies, wanted_prefixes

NOW = dt.datetime(2026, 11, 21, 12, tzinfo=dt.UTC)


def row(store: str, txg: int, parent: StreamRow | None = None, *, state="verified",
        age=10.0) -> StreamRow:
    """The stream ending at @TXG in ``store`` (id TXG then the store's digit: a 1, b 2, c 3); its object
    prefix ``p{TXG}/`` is the same in every store, as ``objects.layout`` makes it."""
    return StreamRow(
        id=txg * 10 + "abc".index(store) + 1, host="local", dataset="tank/d", store=store,
        kind="full" if parent is None else "incremental",
        parent_id=parent.id if parent else None, from_guid=parent.to_guid if parent else None,
        to_guid=txg * 7, from_name=parent.to_name if parent else None, to_name=str(txg),
        to_createtxg=txg, raw_bytes=100, stored_bytes=50, object_prefix=f"p{txg}/",
        storage_class="STANDARD", compression="zstd", state=state,
        created_at=NOW - dt.timedelta(days=age), uploaded_at=None,
        verified_at=NOW - dt.timedelta(days=1) if state == "verified" else None)


def fulls(store: str, *txgs: int, **kw) -> list[StreamRow]:
    return [row(store, t, **kw) for t in txgs]


def kept_reasons(plan, txg: int) -> tuple[str, ...] | None:
    """The reasons the chain of full @TXG is kept, None when it is deleted."""
    (chain,) = [c for c in plan.chains if c.full.to_createtxg == txg]
    return None if chain.delete else chain.streams[0].reasons


def test_a_store_wants_the_chains_it_lacks_when_they_are_within_its_retention():
    """Store b holds chain @1 only; ranked among every store's chains, keep_chains = 2 wants
    @2 and @3 (which b lacks, its copy lags), not @1."""
    streams = fulls("a", 1, 2, 3) + fulls("b", 1)
    assert wanted_prefixes(ChainRetention(2), streams, NOW) == {"p2/", "p3/"}
    assert wanted_prefixes(None, streams, NOW) == {"p1/", "p2/", "p3/"}  # no retention: all
    inc = row("a", 4, streams[2])
    assert wanted_prefixes(ChainRetention(1), streams + [inc], NOW) == {"p3/", "p4/"}


def test_max_age_counts_from_the_first_copy_of_a_stream():
    """A copy's row is newer than the archive's; a chain's age is its streams' first
    storing: 40 days in a, 1 day in b, so max_age 30d expires it."""
    streams = [row("a", 1, age=40), row("b", 1, age=1)] + fulls("a", 2)
    policy = ChainRetention(2, max_age=dt.timedelta(days=30))
    assert wanted_prefixes(policy, streams, NOW) == {"p2/"}


def test_a_chain_is_kept_where_it_is_the_last_copy_of_what_another_store_wants():
    """a keeps 1 chain, b 3; b's copy lags (it holds @1 only). a's own plan deletes @1 and
    @2: @1 goes (b holds it), @2 stays in a, the only copy of a chain b's retention keeps."""
    a, b = fulls("a", 1, 2, 3), fulls("b", 1)
    plan_a = plan_chain_retention(a, ChainRetention(1), NOW)
    assert [c.delete for c in plan_a.chains] == [True, True, False]
    wanted = {"a": wanted_prefixes(ChainRetention(1), a + b, NOW),
              "b": wanted_prefixes(ChainRetention(3), a + b, NOW)}
    plans = keep_last_copies([StorePlan("a", plan_a),
                              StorePlan("b", plan_chain_retention(b, ChainRetention(3), NOW))],
                             a + b, wanted)
    assert kept_reasons(plans["a"], 1) is None
    assert kept_reasons(plans["a"], 2) == (
        "the last sound copy of @2 (stream 21): the retention of store b keeps its chain and no"
        " other store holds it sound (zbak copy --to b first)",)
    assert [c.full.to_createtxg for c in plans["a"].to_delete] == [1]
    assert plans["a"].releasers[0][0].to_createtxg == 3  # the deleted chain's releaser stays
    # the delete names the copy it relies on, for the re-check at delete time
    assert [[s.id for s in group] for group in plans["a"].to_delete[0].copies] == [[12]]


def test_a_copy_that_is_bad_damaged_or_condemned_is_no_other_copy():
    a = fulls("a", 1, 2)
    plan_a = plan_chain_retention(a, ChainRetention(1), NOW)
    wanted = {"b": frozenset({"p1/", "p2/"})}
    for b, damaged in (([row("b", 1, state="bad")], ()), ([row("b", 1)], (12,)),
                       ([row("b", 1, state="condemned")], ())):
        plans = keep_last_copies([StorePlan("a", plan_a), StorePlan("b", None, damaged)],
                                 a + b, wanted)
        why = kept_reasons(plans["a"], 1)
        assert why is not None, (b, damaged)
        then = ("zbak copy --to b first" if b[0].state == "condemned"
                else "the other copies are not sound: zbak audit")
        assert why[0].endswith(f"({then})"), why
    sound = keep_last_copies([StorePlan("a", plan_a), StorePlan("b", None)],
                             a + [row("b", 1)], wanted)
    assert kept_reasons(sound["a"], 1) is None  # control: a sound copy in b lets a delete


def test_two_stores_never_both_delete_the_last_copies_of_a_wanted_stream():
    """a and b both plan to delete @1, which c wants and lacks: a (first in the job's order)
    deletes, relying on b's copy; b then holds the last one and keeps it."""
    a, b = fulls("a", 1, 2), fulls("b", 1, 2)
    plan = plan_chain_retention(a, ChainRetention(1), NOW)
    plan_b = plan_chain_retention(b, ChainRetention(1), NOW)
    wanted = {"a": frozenset({"p2/"}), "b": frozenset({"p2/"}), "c": frozenset({"p1/", "p2/"})}
    plans = keep_last_copies([StorePlan("a", plan), StorePlan("b", plan_b),
                              StorePlan("c", None)], a + b, wanted)
    assert kept_reasons(plans["a"], 1) is None
    assert [[s.store for s in g] for g in plans["a"].to_delete[0].copies] == [["b"]]
    assert kept_reasons(plans["b"], 1) is not None
    nobody = {"a": frozenset({"p2/"}), "b": frozenset({"p2/"})}
    plans = keep_last_copies([StorePlan("a", plan), StorePlan("b", plan_b)], a + b, nobody)
    assert kept_reasons(plans["a"], 1) is None and kept_reasons(plans["b"], 1) is None
    assert plans["a"].to_delete[0].copies == ()  # no store wants @1: no copy is relied on


def test_an_incremental_only_one_store_holds_keeps_its_whole_chain():
    """b holds the full @1 of a wanted chain but not a's incremental @1->@2: a keeps the
    chain, naming the incremental."""
    a = [row("a", 1)]
    a.append(row("a", 2, a[0]))
    a.append(row("a", 3))
    plan_a = plan_chain_retention(a, ChainRetention(1), NOW)
    plans = keep_last_copies([StorePlan("a", plan_a), StorePlan("b", None)],
                             a + [row("b", 1)], {"b": frozenset({"p1/", "p2/", "p3/"})})
    why = kept_reasons(plans["a"], 1)
    assert why is not None and why[0].startswith("the last sound copy of @1->@2 (stream 21)")
    assert all(d.reasons == why for c in plans["a"].chains[:1] for d in c.streams)


def test_copy_copies_only_what_the_target_retention_wants():
    """A store keeping 1 chain gets the newest chain only; what it already holds stays out
    of the plan either way (a rerun after its prune copies nothing again)."""
    a = fulls("a", 1, 2, 3)
    plan = plan_copy(a, [row("b", 2)], frozenset({"p3/"}))
    assert [s.to_name for s in plan.copy] == ["3"] and plan.present == 1
    assert [(s.stream.to_name, s.reason) for s in plan.skipped] == [
        ("1", "its chain is beyond the retention of the store copied to")]
    assert [s.to_name for s in plan_copy(a, [], None).copy] == ["1", "2", "3"]


def _job(archive: dict, **copies: dict) -> JobConfig:
    """Job of dataset tank/d archived to store a with ``archive``'s retention keys, copied
    to each store of ``copies`` with its keys."""
    return JobConfig.model_validate({"dataset": "tank/d", "archive": {"store": "a", **archive},
                                     "copy": copies})


def test_the_rolling_lock_lets_go_of_exactly_the_chains_prune_would_delete():
    """keep_chains = 1 in store a: the older chain (@1 and @1->@2) is released, so the
    rolling lock stops extending it; the newest chain never is. A store without retention,
    or a retention that keeps both, releases nothing."""
    full = row("a", 1)
    streams = [full, row("a", 2, full), row("a", 3)]
    assert released_streams(_job({"keep_chains": 1}), streams, "a", NOW) == {11, 21}
    assert released_streams(_job({"keep_chains": 2}), streams, "a", NOW) == frozenset()
    assert released_streams(_job({"keep_chains": 1}, b={}), fulls("b", 1, 2), "b",
                            NOW) == frozenset()


def test_the_last_copy_of_a_chain_another_store_wants_stays_locked():
    """a keeps 1 chain, b keeps 3 but lacks @2: a's @2 is the last copy of a chain b wants,
    so it is not released (its lock goes on rolling); a's @1 is released (b holds it)."""
    streams = fulls("a", 1, 2, 3) + fulls("b", 1, 3)
    job = _job({"keep_chains": 1}, b={"retention": {"keep_chains": 3}})
    assert released_streams(job, streams, "a", NOW) == {11}
    assert released_streams(job, streams, "b", NOW) == frozenset()
