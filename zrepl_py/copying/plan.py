"""Which streams ``zbak copy`` copies (PURE: catalog rows in, a plan out).

A stream is copied when the target store has no stream at its object prefix (a pure function
of what the stream is, ``objects.layout``, the same in every store), in chain order, so an
incremental's parent is always in the target before it. A stream that is not complete
(``uploading``, ``condemned``) or is marked ``bad`` is never copied, and neither is anything
that applies on it: the copy would hold a chain no restore can use
(docs/copies.md#what-is-copied).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from zrepl_py.catalog.rows import LIVING_STATES, StreamRow


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A stream of the source store that is not copied, and why (one sentence)."""

    stream: StreamRow
    reason: str


@dataclasses.dataclass(frozen=True)
class CopyPlan:
    """What one copy run does for a job.

    Attributes:
        copy: the streams to copy, source rows, oldest first per dataset (chain order).
        present: how many source streams the target already holds.
        skipped: the streams that are not copied, with the reason.
    """

    copy: tuple[StreamRow, ...]
    present: int
    skipped: tuple[Skipped, ...]


def plan_copy(source: Sequence[StreamRow], target: Sequence[StreamRow],
              wanted: Collection[str] | None = None) -> CopyPlan:
    """Plan the copy of ``source`` (the job's streams in the source store, in chain order:
    ``Catalog.bulk_streams``) into the store holding ``target`` (the same datasets' streams
    there).

    ``wanted``: the object prefixes the target's retention keeps
    (``pruning.last_copy.wanted_prefixes``); a stream outside it is not copied (the next
    prune of the target would delete it again); None: every stream is wanted.

    A target stream at a source stream's prefix that is not complete (condemned by a prune,
    marked bad) is left alone and blocks that stream and its descendants: prune or audit
    resolves it first.
    """
    there = {s.object_prefix: s for s in target}
    blocked: dict[int, str] = {}  # source stream id -> why nothing applying on it is copied
    copy: list[StreamRow] = []
    skipped: list[Skipped] = []
    present = 0
    for stream in source:
        reason = _why_not(stream, there.get(stream.object_prefix), blocked)
        if wanted is not None and stream.object_prefix not in wanted and (
                stream.object_prefix not in there):
            reason = "its chain is beyond the retention of the store copied to"
        if reason is not None:
            blocked[stream.id] = reason
            skipped.append(Skipped(stream, reason))
        elif stream.object_prefix in there:
            present += 1
        else:
            copy.append(stream)
    return CopyPlan(tuple(copy), present, tuple(skipped))


def _why_not(stream: StreamRow, existing: StreamRow | None, blocked: dict[int, str]) -> str | None:
    """Why ``stream`` is not copied (None: it is copied, or the target holds it)."""
    if stream.state == "bad":
        return f"marked bad in store {stream.store}: {stream.why_bad}"
    if stream.state not in LIVING_STATES:
        return f"{stream.state} in store {stream.store}"
    if stream.parent_id is not None and stream.parent_id in blocked:
        return f"applies on stream {stream.parent_id}, which is not copied"
    if existing is not None and existing.state not in LIVING_STATES:
        return (f"store {existing.store} has it {existing.state} (stream {existing.id}):"
                " `zbak prune` or `zbak audit --repair` resolves it first")
    return None
