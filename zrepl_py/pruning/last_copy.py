"""Retention across the stores of one job: which chains each store's retention wants, and the
rule that no prune deletes the last sound copy of a stream some store's retention wants (PURE,
docs/style.md#planners-are-pure-and-drivers-are-thin; docs/copies.md#retention-per-store).

A stream lives at the same object prefix in every store (``objects.layout``), so the prefix
names "the same stream" across stores, and a chain across stores is named by its full's prefix.

* What a store's retention WANTS: its ``keep_chains`` and ``max_age`` applied to every chain of
  the dataset in any store of the job (not only the chains it holds), so that a chain a store
  lacks because its copy lags is still wanted there. The newest chain is always wanted; a store
  without retention (a copy table without ``retention``) wants every chain. ``zbak copy`` copies
  only wanted chains (a copy store with a short retention would otherwise get the chains it
  pruned copied again), and the rule below keeps what is wanted somewhere.
* The rule: stores are taken in the job's order (the archive store, then the copies); a chain
  a store's own plan (``pruning.chain_plan``) deletes is kept instead when one of its streams
  is wanted by some store and no OTHER store still holds a sound copy of it (state uploaded or
  verified, not found damaged, not deleted by this prune). Each accepted delete removes that
  store from the stream's holders before the next store is decided, so two stores never both
  delete the last copies of a wanted stream. A delete the rule lets through because another
  store holds a sound copy names those copies (``ChainDecision.copies``): the driver re-checks
  them right before deleting, since the listing this plan was made from may be stale by then
  (docs/decisions.md#a-copy-relied-on-is-rechecked-at-delete-time).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Mapping, Sequence

from zrepl_py.catalog.chains import build_chains
from zrepl_py.catalog.rows import LIVING_STATES, StreamRow
from zrepl_py.pruning.chain_plan import (
    ChainDecision,
    ChainPlan,
    ChainRetention,
    StreamDecision,
    stream_label,
)


def _union_chains(streams: Sequence[StreamRow]) -> list[tuple[set[str], dt.datetime]]:
    """The dataset's chains across stores, oldest first: per chain the prefixes of its
    streams in any store and when its newest stream was first stored (the earliest
    ``created_at`` of each prefix: a copy's row is newer than the archive's)."""
    first: dict[str, dt.datetime] = {}
    for s in streams:
        if s.state != "condemned":
            first[s.object_prefix] = min(first.get(s.object_prefix, s.created_at), s.created_at)
    chains, _ = build_chains(streams)
    merged: dict[str, tuple[int, set[str]]] = {}
    for chain in chains:
        full = chain[0]
        _, members = merged.setdefault(full.object_prefix, (full.to_createtxg, set()))
        members.update(s.object_prefix for s in chain)
    ordered = sorted(merged.values(), key=lambda item: item[0])
    return [(members, max(first[p] for p in members)) for _, members in ordered]


def wanted_prefixes(policy: ChainRetention | None, streams: Sequence[StreamRow],
                    now: dt.datetime) -> frozenset[str]:
    """The object prefixes of the streams whose chain ``policy`` keeps when it ranks every
    chain of one dataset in any store (module doc).

    Args:
        policy: the store's retention; None: the store keeps every chain.
        streams: every catalogued stream of ONE dataset, in every store of the job.
        now: aware UTC.
    """
    chains = _union_chains(streams)
    wanted: set[str] = set()
    for index, (members, newest) in enumerate(chains):
        rank = len(chains) - index  # 1 = newest
        expired = (policy is not None and policy.max_age is not None
                   and now - newest > policy.max_age)
        if policy is None or rank == 1 or (rank <= policy.keep_chains and not expired):
            wanted.update(members)
    return frozenset(wanted)


@dataclasses.dataclass(frozen=True)
class StorePlan:
    """One store's chain plan for one dataset, for :func:`keep_last_copies`.

    Attributes:
        store: the store's name.
        plan: its own retention's plan (None: the store is not pruned, only holds copies).
        damaged: ids of its streams found with missing or resized objects (no sound copy).
    """

    store: str
    plan: ChainPlan | None
    damaged: Collection[int] = ()


def keep_last_copies(stores: Sequence[StorePlan], streams: Sequence[StreamRow],
                     wanted: Mapping[str, frozenset[str]]) -> dict[str, ChainPlan]:
    """Apply the rule of the module doc to the plans of one dataset.

    Args:
        stores: every store of the job holding the dataset's streams, in the job's order
            (the archive store first); a store with a plan is pruned.
        streams: every catalogued stream of the dataset in those stores.
        wanted: per store with a retention, :func:`wanted_prefixes`.

    Returns:
        The plan of each pruned store, a deleted chain turned into a kept one (with the
        reason) where it holds the last sound copy of a wanted stream, and a deleted chain
        naming the copies in other stores it relies on (``ChainDecision.copies``).
    """
    damaged = {(p.store, i) for p in stores for i in p.damaged}
    holders: dict[str, set[str]] = {}
    present: dict[str, set[str]] = {}
    sound: dict[str, list[StreamRow]] = {}
    for s in streams:
        if s.state != "condemned":
            present.setdefault(s.object_prefix, set()).add(s.store)
        if s.state in LIVING_STATES and (s.store, s.id) not in damaged:
            holders.setdefault(s.object_prefix, set()).add(s.store)
            sound.setdefault(s.object_prefix, []).append(s)
    result: dict[str, ChainPlan] = {}
    for item in stores:
        if item.plan is None:
            continue
        chains = []
        for chain in item.plan.chains:
            reason = (_last_copy(chain, item.store, holders, present, wanted) if chain.delete
                      else None)
            if reason is not None:
                chains.append(ChainDecision(tuple(
                    StreamDecision(d.stream, False, (reason,)) for d in chain.streams), False))
                continue
            if chain.delete:
                chain = dataclasses.replace(chain, copies=_relied_on(
                    chain, item.store, holders, sound, wanted))
                for d in chain.streams:
                    holders.get(d.stream.object_prefix, set()).discard(item.store)
            chains.append(chain)
        result[item.store] = dataclasses.replace(item.plan, chains=tuple(chains))
    return result


def _last_copy(chain: ChainDecision, store: str, holders: Mapping[str, set[str]],
               present: Mapping[str, set[str]],
               wanted: Mapping[str, frozenset[str]]) -> str | None:
    """Why ``chain`` (which ``store``'s own plan deletes) stays: the first of its streams
    that some store wants and no other store holds soundly (``holders``; ``present``: the
    stores with a row of it in any state but condemned); None: it may go."""
    for d in chain.streams:
        s = d.stream
        wanters = sorted(w for w, found in wanted.items() if s.object_prefix in found)
        if wanters and not holders.get(s.object_prefix, set()) - {store}:
            lacking = [w for w in wanters if w not in present.get(s.object_prefix, ())]
            then = (f"zbak copy --to {lacking[0]} first" if lacking
                    else "the other copies are not sound: zbak audit")
            return (f"the last sound copy of {stream_label(s)} (stream {s.id}): the retention of"
                    f" store {', '.join(wanters)} keeps its chain and no other store holds it"
                    f" sound ({then})")
    return None


def _relied_on(chain: ChainDecision, store: str, holders: Mapping[str, set[str]],
               sound: Mapping[str, Sequence[StreamRow]],
               wanted: Mapping[str, frozenset[str]]) -> tuple[tuple[StreamRow, ...], ...]:
    """Per stream of ``chain`` (deleted from ``store``) that some store wants: its sound
    copies in the other stores that still hold it (``holders``), which the delete relies on."""
    groups = []
    for d in chain.streams:
        prefix = d.stream.object_prefix
        if any(prefix in found for found in wanted.values()):
            others = holders.get(prefix, set()) - {store}
            group = tuple(s for s in sound.get(prefix, ()) if s.store in others)
            if group:  # (empty: the rule kept the chain, or no store wants the stream)
                groups.append(group)
    return tuple(groups)
