"""Archive retention: which whole chains of one dataset in one store may go, and why the rest
stay (PURE, docs/style.md#planners-are-pure-and-drivers-are-thin: catalog rows in, a plan out;
``pruning.chain_delete`` executes it).

A chain is one full and every stream that applies on it (parent links, whatever their state).
Rules (docs/design.md#catalog-and-chain-validity), every reason recorded:

* Only whole chains are deleted, every stream of the chain in the same plan, leaf first.
* Retention: the newest chain is kept; so are the ``keep_chains`` newest chains, except that
  with ``max_age`` a chain whose newest stream is older than ``max_age`` is no longer kept
  by ``keep_chains`` (the newest chain and the newest verified chain stay anyway: see next).
* Safety gates for every chain retention would delete:
  - a NEWER full must exist whose state is ``verified`` (every volume re-read and
    checksummed) no longer than ``reverify_after`` ago, and whose chain has no damaged or
    ``bad`` stream; so the newest verified, undamaged chain is never deleted, and every
    deleted chain leaves a newer one to restore (docs/decisions.md#a-verified-mark-ages: a
    verification is a fact about the bytes on the day it was made, and bytes rot; an old mark
    releases nothing until ``zbak audit --deep`` renews it);
  - the chain that releases a deleted one (``ChainDecision.released_by``: the oldest newer
    chain that qualifies and is kept) is what the driver re-checks against the catalog
    right before the first delete (``pruning.recheck``,
    docs/decisions.md#the-releasing-chain-is-rechecked-before-any-delete);
  - a chain with a damaged stream (objects missing, per the caller's ``damaged`` map, e.g.
    from an audit or a listing of the store) or a ``bad`` one is never touched: the audit
    reports it and the user decides;
  - when ANY stream of the dataset is damaged the store is inconsistent and nothing of the
    dataset is deleted at all, unfinished prunes included: the plan is ``refused`` and the
    driver raises ``StoreInconsistent`` (restic ``ErrPacksMissing``,
    docs/reliability.md#r19-prune-refuses-on-an-inconsistent-store);
  - a chain with a stream younger than its storage class's minimum storage duration is kept
    unless ``accept_early_delete_fee`` (S3 bills the rest of the minimum on early delete);
  - on a store with Object Lock, a chain with a volume or manifest still locked (the
    caller's ``locked`` map, from the catalog's ``volumes.retain_until`` and
    ``streams.manifest_retain_until``) is kept, "expired, locked until DATE":
    S3 refuses to delete a locked version, and the catalog keeps its rows until the lock
    lapses and prune deletes every version by id (docs/security.md#prune-on-a-lock-store).
* ``condemned`` streams are tombstones of a prune that did not finish (crash, store error):
  they are listed as ``unfinished`` for the driver to finish first, never re-planned.

Order: chains by their full's ``to_createtxg`` (then id), never by time
(docs/style.md#utc-everywhere-and-order-by-createtxg).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence

from zrepl_py.catalog.chains import build_chains
from zrepl_py.catalog.rows import ManifestLock, StreamRow, VolumeRow
from zrepl_py.runtime.gcpause import gc_paused

NEWEST_CHAIN = "newest chain"
EARLY_FEE_FLAG = "--accept-early-delete-fee"
DEFAULT_REVERIFY_AFTER = dt.timedelta(days=30)
"""How long a ``verified`` mark releases older chains (``ArchiveConfig.reverify_after``)."""


@dataclasses.dataclass(frozen=True)
class ChainRetention:
    """The retention of one job's archive.

    Attributes:
        keep_chains: the newest N chains are kept (N >= 1).
        max_age: with a value, a chain whose newest stream was created longer ago than this
            is not kept by ``keep_chains``; None: age deletes nothing.
        min_storage: minimum storage duration per storage class (``ArchiveConfig.
            min_storage_durations()``); a class not listed has none.
        accept_early_delete_fee: delete chains with streams younger than their class's
            minimum anyway (``zbak prune --accept-early-delete-fee``).
        reverify_after: a full verified longer ago than this (or at an unknown time)
            releases no older chain until re-verified (``[jobs.NAME.archive]
            reverify_after``; > 0).
    """

    keep_chains: int
    max_age: dt.timedelta | None = None
    min_storage: Mapping[str, dt.timedelta] = dataclasses.field(default_factory=dict)
    accept_early_delete_fee: bool = False
    reverify_after: dt.timedelta = DEFAULT_REVERIFY_AFTER

    def __post_init__(self) -> None:
        if self.keep_chains < 1:
            raise ValueError(f"keep_chains must be at least 1, not {self.keep_chains}")
        if self.reverify_after <= dt.timedelta(0):
            raise ValueError(f"reverify_after must be positive, not {self.reverify_after}")


@dataclasses.dataclass(frozen=True)
class StreamDecision:
    """One stream of a chain: deleted with its chain or kept, with every reason."""

    stream: StreamRow
    delete: bool
    reasons: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ChainDecision:
    """One chain: its streams in chain order (the full first, each parent before its
    children), whether it is deleted, and a decision per stream with the reasons.

    ``released_by``: for a deleted chain, the streams (full first) of the newer, kept,
    verified and sound chain whose existence makes the deletion safe; the driver re-checks
    its objects before deleting anything. Empty for a kept chain.

    ``copies``: for a deleted chain of a job with several stores, one group per stream of it
    that some store's retention keeps: the sound copies of that stream in the other stores
    the delete relies on (``pruning.last_copy``); the driver re-checks that one copy of each
    group is still sound right before deleting, and keeps the chain otherwise
    (``pruning.recheck.copy_problem``,
    docs/decisions.md#a-copy-relied-on-is-rechecked-at-delete-time).
    """

    streams: tuple[StreamDecision, ...]
    delete: bool
    released_by: tuple[StreamRow, ...] = ()
    copies: tuple[tuple[StreamRow, ...], ...] = ()

    @property
    def full(self) -> StreamRow:
        """The chain's full stream."""
        return self.streams[0].stream

    @property
    def leaf_first(self) -> tuple[StreamRow, ...]:
        """The chain's streams children before parents (the order objects and rows go)."""
        return tuple(sorted((d.stream for d in self.streams),
                            key=lambda s: (s.to_createtxg, s.id), reverse=True))


@dataclasses.dataclass(frozen=True)
class ChainPlan:
    """Retention's decisions for one dataset in one store.

    Attributes:
        chains: one decision per chain, oldest chain first.
        unfinished: condemned streams left by an earlier prune, leaf first; the driver
            deletes their objects and rows before anything else.
        orphans: streams not reachable from any full (the catalog's constraints should make
            this impossible); always kept, with the reason.
        refused: why nothing of this dataset may be deleted (a damaged stream: the store is
            inconsistent), else None; every chain is then kept and nothing is unfinished.
    """

    chains: tuple[ChainDecision, ...]
    unfinished: tuple[StreamRow, ...] = ()
    orphans: tuple[StreamDecision, ...] = ()
    refused: str | None = None

    @property
    def to_delete(self) -> tuple[ChainDecision, ...]:
        """The chains to delete, oldest first."""
        return tuple(c for c in self.chains if c.delete)

    @property
    def decisions(self) -> tuple[StreamDecision, ...]:
        """Every stream decision, chain by chain (oldest first), then the orphans."""
        return tuple(d for c in self.chains for d in c.streams) + self.orphans

    @property
    def releasers(self) -> tuple[tuple[StreamRow, ...], ...]:
        """The distinct chains that release the deleted ones (``released_by``), oldest
        first: what the driver re-checks before the first delete."""
        found: dict[int, tuple[StreamRow, ...]] = {}
        for c in self.to_delete:
            found.setdefault(c.released_by[0].id, c.released_by)
        return tuple(found[k] for k in sorted(found, key=lambda i: (found[i][0].to_createtxg,
                                                                     i)))


def _days(span: dt.timedelta) -> str:
    return f"{span.days}-day" if span == dt.timedelta(days=span.days) else str(span)


def _span(span: dt.timedelta) -> str:
    return f"{span.days}d" if span == dt.timedelta(days=span.days) else str(span)


def stream_label(s: StreamRow) -> str:
    """``@NAME`` for a full, ``@FROM->@TO`` for an incremental."""
    return f"@{s.to_name}" if s.kind == "full" else f"@{s.from_name}->@{s.to_name}"


def _trouble(chain: Sequence[StreamRow], damaged: Mapping[int, str]) -> str | None:
    """Why the chain must not be touched (a damaged or bad stream), else None."""
    for s in chain:
        if s.id in damaged:
            what = f" ({damaged[s.id]})" if damaged[s.id] else ""
            return (f"chain has a damaged stream {stream_label(s)} (stream {s.id}){what}: prune"
                    " refuses to touch it; run zbak audit")
        if s.state == "bad":
            return (f"chain has a bad stream {stream_label(s)} (stream {s.id}, {s.why_bad}):"
                    " prune refuses to touch it; run zbak audit")
    return None


def _freshly_verified(full: StreamRow, policy: ChainRetention, now: dt.datetime) -> bool:
    """True when ``full`` is ``verified`` and the mark is younger than ``reverify_after``."""
    return (full.state == "verified" and full.verified_at is not None
            and now - full.verified_at <= policy.reverify_after)


def _no_newer_verified(index: int, chains: Sequence[Sequence[StreamRow]],
                       usable_after: Sequence[bool], policy: ChainRetention,
                       now: dt.datetime) -> str | None:
    """None when a newer chain has a freshly verified full and no damaged/bad stream, else
    why not, told about the newest full (``usable_after[i]``: some chain newer than chain
    ``i`` qualifies)."""
    if usable_after[index]:
        return None
    if index == len(chains) - 1:
        return "no newer full exists"
    full = chains[-1][0]
    name = f"the newer full @{full.to_name} (stream {full.id})"
    if full.state == "bad":
        return (f"bad: {name} is marked bad ({full.why_bad}) and releases nothing: zbak"
                " audit tells what is wrong")
    if full.state != "verified":
        return f"{name} is not verified yet: zbak audit --deep verifies it"
    if not _freshly_verified(full, policy, now):
        when = ("at an unknown time" if full.verified_at is None
                else f"{_span_rounded(now - full.verified_at)} ago")
        return (f"{name} was verified {when}, longer than reverify_after"
                f" {_span(policy.reverify_after)}: zbak audit --deep re-verifies it")
    return f"{name} has a damaged or bad stream in its chain"


def _span_rounded(span: dt.timedelta) -> str:
    """``span`` in whole days when a day or more, else in whole seconds (for messages)."""
    return f"{span.days}d" if span.days else f"{int(span.total_seconds())}s"


def _young(chain: Sequence[StreamRow], policy: ChainRetention,
           now: dt.datetime) -> dict[int, str]:
    """Streams younger than their class's minimum storage duration: ``{id: description}``."""
    found = {}
    for s in chain:
        minimum = policy.min_storage.get(s.storage_class, dt.timedelta(0))
        if minimum > dt.timedelta(0) and now - s.created_at < minimum:
            found[s.id] = f"younger than {s.storage_class}'s {_days(minimum)} minimum"
    return found


def locked_until(volumes: Mapping[int, Sequence[VolumeRow]], streams: Iterable[StreamRow],
                 manifests: Iterable[ManifestLock] = ()) -> dict[int, dt.datetime]:
    """``{stream id: the latest retain-until date (aware UTC) of its volumes and manifest}``
    for the ``streams`` whose volumes or manifest record one (``volumes``: the catalog's rows
    by stream id; ``manifests``: ``Catalog.manifest_locks``; pure)."""
    manifest_dates = {m.stream_id: m.retain_until for m in manifests}
    found = {}
    for s in streams:
        dates = [v.retain_until for v in volumes.get(s.id, ()) if v.retain_until is not None]
        if s.id in manifest_dates:
            dates.append(manifest_dates[s.id])
        if dates:
            found[s.id] = max(dates)
    return found


def _lock_reason(chain: Sequence[StreamRow], locked: Mapping[int, dt.datetime],
                 now: dt.datetime) -> str | None:
    """Why an expired chain waits (a volume locked after ``now``), else None."""
    until = max((locked[s.id] for s in chain if s.id in locked), default=None)
    if until is None or until <= now:
        return None
    return (f"expired, locked until {until.strftime('%Y-%m-%d %H:%M:%S')} UTC (Object Lock):"
            " its versions are deleted by id once the lock lapses")


@gc_paused
def plan_chain_retention(
    streams: Sequence[StreamRow],
    policy: ChainRetention,
    now: dt.datetime,
    *,
    damaged: Mapping[int, str] | Iterable[int] = (),
    locked: Mapping[int, dt.datetime] | None = None,
) -> ChainPlan:
    """Decide which whole chains of one dataset in one store to delete (module doc rules).

    Args:
        streams: every catalogued stream of ONE dataset in ONE store, any state, any order.
        policy: keep_chains, max_age, minimum storage durations, the early-delete flag.
        now: aware UTC.
        damaged: stream ids whose objects are missing or wrong (``{id: what}``, or just ids):
            their chains are never touched, and they never justify deleting an older chain.
        locked: ``{stream id: retain-until date}`` on a store with Object Lock
            (:func:`locked_until`): a chain retention releases waits until every date of
            its streams has passed.

    Returns:
        A ChainPlan; every kept stream carries at least one reason.

    Raises:
        ValueError: streams of several datasets or stores, or a naive ``now``.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now is naive; pass an aware UTC datetime")
    where = {(s.host, s.dataset, s.store) for s in streams}
    if len(where) > 1:
        raise ValueError(f"a chain plan covers one dataset in one store; got {sorted(where)}")
    damaged = dict(damaged) if isinstance(damaged, Mapping) else dict.fromkeys(damaged, "")
    refused = None
    if damaged:
        refused = (f"the store is inconsistent: {len(damaged)} stream(s) of this dataset have"
                   f" missing or resized objects (streams {sorted(damaged)[:5]}); prune"
                   " deletes nothing of this dataset; run zbak audit")
    chains, orphans = build_chains(streams)
    trouble = [_trouble(c, damaged) for c in chains]
    usable = [_freshly_verified(c[0], policy, now) and t is None
              for c, t in zip(chains, trouble, strict=True)]
    usable_after = [False] * len(chains)  # one pass from the newest: linear in the chains
    for i in range(len(chains) - 2, -1, -1):
        usable_after[i] = usable_after[i + 1] or usable[i + 1]
    decisions = []
    for index, chain in enumerate(chains):
        rank = len(chains) - index  # 1 = newest
        newest_created = max(s.created_at for s in chain)
        expired = policy.max_age is not None and now - newest_created > policy.max_age
        reasons: list[str] = []
        problem = trouble[index]
        if problem:
            reasons.append(problem)
        elif refused:
            reasons.append(refused)
        if rank == 1:
            reasons.append(NEWEST_CHAIN)
        elif rank <= policy.keep_chains and not expired:
            reasons.append(f"within keep_chains ({rank} of {policy.keep_chains})")
        retained = rank == 1 or (rank <= policy.keep_chains and not expired)
        young: dict[int, str] = {}
        if not retained:
            gate = _no_newer_verified(index, chains, usable_after, policy, now)
            if gate:
                reasons.append(gate)
            elif lock := _lock_reason(chain, locked or {}, now):
                reasons.append(lock)
            young = _young(chain, policy, now)
        fee = {} if policy.accept_early_delete_fee else young
        if reasons or fee:
            decisions.append(ChainDecision(tuple(
                StreamDecision(s, False, tuple(reasons) + _fee_reasons(s, fee, chain))
                for s in chain), False))
            continue
        why = (f"beyond keep_chains = {policy.keep_chains} (chain {rank} from the newest)"
               if rank > policy.keep_chains or policy.max_age is None else
               f"its newest stream is older than max_age {_span(policy.max_age)}")
        deleting = []
        for s in chain:
            extra = (f"early-delete fee accepted: {young[s.id]}",) if s.id in young else ()
            deleting.append(StreamDecision(s, True, (why,) + extra))
        decisions.append(ChainDecision(tuple(deleting), True))
    decisions = _with_releasers(decisions, usable)
    orphan_decisions = tuple(
        StreamDecision(s, False, ("not reachable from a full stream: run zbak audit",))
        for s in sorted(orphans, key=lambda s: (s.to_createtxg, s.id)))
    unfinished = () if refused else tuple(sorted(
        (s for s in streams if s.state == "condemned"),
        key=lambda s: (s.to_createtxg, s.id), reverse=True))
    return ChainPlan(tuple(decisions), unfinished, orphan_decisions, refused)


def _fee_reasons(stream: StreamRow, young: Mapping[int, str],
                 chain: Sequence[StreamRow]) -> tuple[str, ...]:
    """The early-delete reasons for one stream of a chain kept for its young streams."""
    if not young:
        return ()
    if stream.id in young:
        return (f"{young[stream.id]} (early-delete fee): pass {EARLY_FEE_FLAG}",)
    first = next(s for s in chain if s.id in young)
    return (f"kept with its chain: {stream_label(first)} is {young[first.id]} (early-delete fee):"
            f" pass {EARLY_FEE_FLAG}",)


def _with_releasers(decisions: Sequence[ChainDecision],
                    usable: Sequence[bool]) -> list[ChainDecision]:
    """Name, for each deleted chain, the oldest newer chain that is usable (freshly verified
    full, sound) and kept, with a reason saying so. One exists: the newest usable chain is
    never deleted, since deleting it would need a newer usable chain. One pass from the
    newest chain, linear like ``usable_after``."""
    result = list(decisions)
    releaser: ChainDecision | None = None
    for index in range(len(decisions) - 1, -1, -1):
        decision = decisions[index]
        if not decision.delete:
            if usable[index]:
                releaser = decision
            continue
        assert releaser is not None, "a deleted chain always has a usable kept newer chain"
        full = releaser.full
        line = (f"released by the verified chain @{full.to_name} (stream {full.id}), re-checked"
                " against the catalog before the first delete")
        streams = tuple(dataclasses.replace(d, reasons=d.reasons + (line,))
                        for d in decision.streams)
        result[index] = ChainDecision(streams, True,
                                      tuple(d.stream for d in releaser.streams))
    return result
