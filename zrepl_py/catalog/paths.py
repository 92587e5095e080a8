"""Which archived streams bring a dataset back to a snapshot (pure).

A snapshot is restorable from the archive when some living stream carries it (a full carries
its snapshot, a ``-I`` incremental every snapshot after its base) and every stream from that
one back to its chain's full is living (``uploaded`` or ``verified``) and none of them has
lost objects from its store. Among such paths the one with the fewest stored bytes wins (then
the fewest streams). ``why_no_path`` says what breaks the chains of a store that has none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from zrepl_py.catalog.rows import LIVING_STATES, StreamRow
from zrepl_py.objects.manifest import CarriedSnapshot

# Why a stream in each non-living state cannot be received (catalog/models.py STREAM_STATES);
# a bad stream's own reason follows (StreamRow.bad_reason).
_STATE_WHY = {
    "bad": ("bad", "is marked bad"),
    "condemned": ("being pruned", "is condemned by a prune"),
    "uploading": ("incomplete", "is still uploading"),
}

@dataclasses.dataclass(frozen=True)
class ChainPath:
    """Streams to receive in order (full first) to reach a snapshot.

    Attributes:
        streams: the streams, full first.
        target: the snapshot wanted.
        later: snapshots the last stream carries after ``target`` (received, then destroyed
            from the restored dataset so it ends at ``target``), in createtxg order.
    """

    streams: tuple[StreamRow, ...]
    target: CarriedSnapshot
    later: tuple[CarriedSnapshot, ...]

    @property
    def stored_bytes(self) -> int:
        """Bytes to read from the store."""
        return sum(s.stored_bytes for s in self.streams)

    @property
    def store(self) -> str:
        """The store the path's streams are in."""
        return self.streams[0].store


def _carried(stream: StreamRow, carried: Mapping[int, Sequence[CarriedSnapshot]]) -> list[CarriedSnapshot]:
    found = list(carried.get(stream.id, ()))
    return found or [CarriedSnapshot(stream.to_name, stream.to_guid, stream.to_createtxg)]


def restorable_streams(streams: Sequence[StreamRow]) -> set[int]:
    """Ids of the streams a restore can use (the rule in the module doc): living, and every
    stream from it back through ``parent_id`` to a ``full`` is living and in ``streams``.

    Linear in ``len(streams)`` (each stream's verdict is computed once); ``archive_paths``
    and the audit's restorable sets (``audit.restorable``) both use it, so what the audit
    calls restorable is what ``zbak restore`` can restore.
    """
    by_id = {s.id: s for s in streams}
    verdict: dict[int, bool] = {}
    for start in streams:
        path, seen, cur, ok = [], set(), start, None
        while ok is None:
            if cur.id in verdict:
                ok = verdict[cur.id]
            elif cur.state not in LIVING_STATES or cur.id in seen:  # dead, or a cycle
                ok = False
            elif cur.parent_id is None:
                ok = cur.kind == "full"
                path.append(cur)
            else:
                path.append(cur)
                seen.add(cur.id)
                parent = by_id.get(cur.parent_id) if cur.parent_id is not None else None
                if parent is None:
                    ok = False
                else:
                    cur = parent
        for s in path:
            verdict[s.id] = ok
    return {sid for sid, ok in verdict.items() if ok}


def archive_paths(
    streams: Sequence[StreamRow],
    carried: Mapping[int, Sequence[CarriedSnapshot]],
    target_guid: int,
    damaged: Mapping[int, str] | None = None,
) -> list[ChainPath]:
    """Every restorable path to the snapshot with ``target_guid``, cheapest first.

    Args:
        streams: the dataset's catalogued streams (any store, any state).
        carried: ``Catalog.carried`` for those streams.
        target_guid: the snapshot wanted.
        damaged: ids of streams whose objects are missing or resized in their store (with
            what is wrong); no path goes through them.
    """
    damaged = damaged or {}
    usable = [s for s in streams if s.id not in damaged]
    by_id = {s.id: s for s in usable}
    whole = restorable_streams(usable)
    paths = []
    for stream in usable:
        if stream.id not in whole:
            continue
        snaps = _carried(stream, carried)
        hit = next((c for c in snaps if c.guid == target_guid), None)
        if hit is None:
            continue
        chain = [stream]
        while chain[-1].parent_id is not None:
            chain.append(by_id[chain[-1].parent_id])
        later = tuple(c for c in snaps if c.createtxg > hit.createtxg)
        paths.append(ChainPath(tuple(reversed(chain)), hit, later))
    return sorted(paths, key=lambda p: (p.stored_bytes, len(p.streams), p.streams[-1].id))


def why_no_path(
    store: str,
    streams: Sequence[StreamRow],
    carried: Mapping[int, Sequence[CarriedSnapshot]],
    target: CarriedSnapshot,
    damaged: Mapping[int, str] | None = None,
) -> str:
    """Why no chain of ``store`` restores ``target`` (when ``archive_paths`` found none):
    ``"the chain carrying @X in store S is bad: stream N (@Y) is marked bad: REASON"``,
    naming the first broken stream from the full down (a bad one with the reason it was
    marked for), or that no stream carries ``target``."""
    damaged = damaged or {}
    by_id = {s.id: s for s in streams}
    carriers = [s for s in streams if any(c.guid == target.guid for c in _carried(s, carried))]
    if not carriers:
        return f"store {store} has no stream carrying @{target.name}"
    reasons = []
    for carrier in carriers[:2]:
        chain, parent_id = [carrier], carrier.parent_id
        while parent_id is not None and parent_id in by_id and len(chain) <= len(by_id):
            chain.append(by_id[parent_id])
            parent_id = chain[-1].parent_id
        what = None
        if parent_id is not None:
            what = ("broken", f"stream {chain[-1].id}'s parent stream {parent_id} is not in the catalog")
        for s in reversed(chain):
            if what is not None:
                break
            label = f"stream {s.id} ({s.kind} @{s.to_name})"
            if s.state in _STATE_WHY:
                word, why = _STATE_WHY[s.state]
                what = (word, f"{label} {why}" + (f": {s.why_bad}" if s.state == "bad" else ""))
            elif s.id in damaged:
                what = ("damaged", f"{label}: {damaged[s.id]}")
        if what is None:  # the catalog's constraints make a chain without a full impossible
            what = ("broken", f"stream {chain[-1].id} has no full stream before it")
        reasons.append(f"the chain carrying @{target.name} in store {store} is {what[0]}: {what[1]}")
    return "; ".join(reasons)
