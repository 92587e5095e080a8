"""Decide the next stream(s) of a dataset's archive chain (pure: plain data in, steps out).

Policy (docs/design.md#archive, ``[jobs.NAME.archive]``):

* No chain yet: a full of the OLDEST snapshot, then one ``-I`` incremental to the newest, so
  every snapshot that exists when archiving starts is archived (the seed's "full of @0, then
  incrementals").
* A chain exists, is whole and its tip (the last stream's to-snapshot, found by guid) still
  exists on the source: a ``-I`` incremental from the tip to the newest snapshot, unless the
  policy wants a new full: the chain's full older than ``full_every``, the chain at
  ``max_chain_length`` streams or ``max_chain_bytes`` stored bytes. A policy full waits for a
  snapshot newer than the tip, so a quiet dataset is not archived again and again.
* A new full of the NEWEST snapshot starts a new chain at once, even when the tip is the
  newest snapshot, when the chain cannot or must not be extended: a stream of it is ``bad``
  or found damaged in the store by the caller (docs/decisions.md#a-damaged-chain-is-never-extended:
  extending it would only add unrestorable streams), its tip is gone from the source, the caller has
  another reason (``new_chain``), a holder of one of the store's identities now could not
  restore the chain (a recipient added since a stream of it was sealed, or the store no longer
  sealed: docs/sealed.md#changing-the-recipients), or ``--full``. The old chain stays until
  retention removes it.
* Such a full is skipped, saying so, when a full of the newest snapshot is catalogued
  already: the current whole chain starts with it (nothing to do), or it is the damaged one
  (its object prefix is taken; the next snapshot starts the new chain).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence

from zrepl_py.catalog.chains import current_chain
from zrepl_py.catalog.rows import StreamRow, shown_keys
from zrepl_py.objects.manifest import CarriedSnapshot


@dataclasses.dataclass(frozen=True)
class ChainPolicy:
    """When to start a new chain: ``full_every`` (age of the chain's full), ``max_chain_length``
    (streams, the full included), ``max_chain_bytes`` (stored bytes; None: no limit)."""

    full_every: dt.timedelta
    max_chain_length: int
    max_chain_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class PlannedStream:
    """One stream to write.

    Attributes:
        kind: ``"full"`` or ``"incremental"``.
        from_snap: the incremental's base (the chain tip, or the full planned just before);
            None for a full.
        to_snap: the snapshot the stream ends at.
        carried: the snapshots the stream carries (``-I`` sends every one after the base).
        parent_id: the catalogued stream an incremental applies on; None for a full, and for
            an incremental on the full planned in the same run (the driver fills it in).
        reason: why this stream, for the plan shown to the user.
    """

    kind: str
    from_snap: CarriedSnapshot | None
    to_snap: CarriedSnapshot
    carried: tuple[CarriedSnapshot, ...]
    parent_id: int | None
    reason: str


@dataclasses.dataclass(frozen=True)
class ArchivePlan:
    """The streams to write for one dataset (maybe none) and a note saying why."""

    streams: tuple[PlannedStream, ...]
    note: str


def _full_due(chain: list[StreamRow], policy: ChainPolicy, now: dt.datetime) -> str | None:
    """Why the policy wants a new full now, or None."""
    age = now - chain[0].created_at
    if age >= policy.full_every:
        return f"the chain's full is {age.days} days old (full_every {policy.full_every})"
    if len(chain) >= policy.max_chain_length:
        return f"the chain has {len(chain)} streams (max_chain_length {policy.max_chain_length})"
    stored = sum(s.stored_bytes for s in chain)
    if policy.max_chain_bytes is not None and stored >= policy.max_chain_bytes:
        return f"the chain holds {stored} bytes (max_chain_bytes {policy.max_chain_bytes})"
    return None


def _damaged(chain: Sequence[StreamRow], damaged: Mapping[int, str]) -> str | None:
    """Why the chain must not be extended because of a stream of it, or None."""
    for s in chain:
        if s.id in damaged:
            return f"the current chain cannot be extended: {damaged[s.id]}"
        if s.state == "bad":
            return f"stream {s.id} (@{s.to_name}) of the current chain is bad: {s.why_bad}"
    return None


def _unopenable(chain: Sequence[StreamRow], sealed_to: tuple[str, ...] | None) -> str | None:
    """Why an identity of the store's recipients now could not restore ``chain``, if so:
    a stream of it was sealed (to the keys it records) without a recipient the store has now,
    or the store writes plain streams on a sealed chain. Streams whose keys are not known
    (plain, or catalogued without them) pass."""
    for stream in chain:
        if stream.sealed_to is None:
            continue
        if sealed_to is None:
            return (f"the store is no longer sealed, but stream {stream.id} (@{stream.to_name})"
                    " of the chain opens only with an identity: a new chain restores without"
                    " one")
        added = sorted(set(sealed_to) - set(stream.sealed_to))
        if added:
            return (f"recipient(s) {shown_keys(added)} added to the store since stream {stream.id}"
                    f" (@{stream.to_name}) of the chain was sealed cannot open it: a new chain"
                    " restores with any one identity")
    return None


def plan_archive(
    snapshots: Sequence[CarriedSnapshot],
    streams: Sequence[StreamRow],
    policy: ChainPolicy,
    now: dt.datetime,
    *,
    force_full: bool = False,
    new_chain: str | None = None,
    damaged: Mapping[int, str] | None = None,
    sealed_to: tuple[str, ...] | None = None,
) -> ArchivePlan:
    """Plan the next streams of one dataset's chain in one store (see the module docstring).

    Args:
        snapshots: the dataset's snapshots on the source now, any order (sorted by createtxg).
        streams: the catalogued streams of this dataset in this store (any state).
        policy: the job's chain policy.
        now: aware UTC.
        force_full: ``zbak archive --full``.
        new_chain: a reason the caller found to start a new chain, treated like
            ``force_full`` (e.g. the chain was archived decrypted but the dataset is
            encrypted: a raw incremental cannot apply on it, zfs-receive(8)).
        damaged: streams the caller found missing objects of in the store (stream id ->
            what is missing, ``archive.damage``); a chain holding one is treated like a
            chain with a ``bad`` stream, with that reason.
        sealed_to: the recipients the store seals new streams to
            (``streams.codec.Codec.sealed_to``); None: a plain store.
    """
    snaps = sorted(snapshots, key=lambda s: s.createtxg)
    if not snaps:
        return ArchivePlan((), "no snapshots to archive: run `zbak snapshot` first")
    newest = snaps[-1]
    chain = current_chain(streams)
    if not chain:
        oldest = snaps[0]
        planned = [PlannedStream("full", None, oldest, (oldest,), None, "no chain yet")]
        if newest is not oldest:
            planned.append(PlannedStream("incremental", oldest, newest, tuple(snaps[1:]), None,
                                         "continues the new chain to the newest snapshot"))
        return ArchivePlan(tuple(planned), "starting the first chain")
    tip = chain[-1]
    tip_snap = next((s for s in snaps if s.guid == tip.to_guid), None)
    broken = _damaged(chain, damaged or {})
    reason = broken
    if reason is None and tip_snap is None:
        reason = f"the chain ends at @{tip.to_name} (guid {tip.to_guid}), gone from the source"
    if reason is None:
        reason = new_chain
    if reason is None:
        reason = _unopenable(chain, sealed_to)
    if reason is None and force_full:
        reason = "--full"
    if reason is None and tip_snap is not None:  # (no reason yet means the tip is listed)
        if tip_snap is newest:
            return ArchivePlan((), f"up to date: the chain ends at @{tip.to_name}")
        reason = _full_due(chain, policy, now)
        if reason is None:
            carried = tuple(s for s in snaps if s.createtxg > tip_snap.createtxg)
            return ArchivePlan(
                (PlannedStream("incremental", tip_snap, newest, carried, tip.id,
                               f"continues the chain from @{tip_snap.name}"),),
                f"chain of {len(chain)} stream(s)")
    assert reason is not None  # every way here set one
    taken = next((s for s in streams if s.kind == "full" and s.to_guid == newest.guid), None)
    if taken is not None:
        if taken is chain[0] and broken is None:
            return ArchivePlan((), f"{reason}, but the current chain already starts with a"
                                   f" full of @{newest.name}, the newest snapshot")
        return ArchivePlan((), f"{reason}; a new full of @{newest.name} cannot be written:"
                               f" stream {taken.id}, a full of it, is catalogued ({taken.state})"
                               " at its place in the store. The next snapshot starts the new"
                               " chain (`zbak snapshot`, then `zbak archive`)")
    return ArchivePlan((PlannedStream("full", None, newest, (newest,), None, reason),),
                       "starting a new chain")
