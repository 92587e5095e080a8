"""Chains of archived streams as plain data (PURE: catalog rows in, chains out).

A chain is one full stream and every incremental that applies on it through parent links
(docs/design.md#archive); the archive planner extends the newest one, chain retention deletes
whole old ones, ``zbak status`` counts them. Condemned streams (the prune tombstone) belong to
no chain.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from zrepl_py.catalog.rows import StreamRow


def current_chain(streams: Sequence[StreamRow]) -> list[StreamRow]:
    """The newest chain among ``streams`` (one dataset, one store): its full, then each
    incremental on the one before, following parent links; condemned streams are ignored."""
    alive = [s for s in streams if s.state != "condemned"]
    fulls = [s for s in alive if s.kind == "full"]
    if not fulls:
        return []
    head = max(fulls, key=lambda s: (s.to_createtxg, s.id))
    children: dict[int, list[StreamRow]] = {}
    for s in alive:
        if s.parent_id is not None:
            children.setdefault(s.parent_id, []).append(s)
    chain = [head]
    while children.get(chain[-1].id):
        chain.append(max(children[chain[-1].id], key=lambda s: (s.to_createtxg, s.id)))
    return chain


def build_chains(streams: Iterable[StreamRow]) -> tuple[list[list[StreamRow]], list[StreamRow]]:
    """Group the not-condemned ``streams`` into chains.

    Returns:
        ``(chains, orphans)``: each chain is its full then every stream reachable from it
        through parent links (parents before children, by to_createtxg), chains ordered by
        their full's to_createtxg then id; orphans are streams no full reaches.
    """
    alive = [s for s in streams if s.state != "condemned"]
    children: dict[int, list[StreamRow]] = {}
    for s in alive:
        if s.parent_id is not None:
            children.setdefault(s.parent_id, []).append(s)
    fulls = sorted((s for s in alive if s.kind == "full"), key=lambda s: (s.to_createtxg, s.id))
    chains, reached = [], set()
    for full in fulls:
        members, todo = [], [full]
        while todo:
            s = todo.pop()
            if s.id in reached:
                continue  # a cycle cannot happen (to_createtxg grows), but never loop
            reached.add(s.id)
            members.append(s)
            todo.extend(children.get(s.id, ()))
        chains.append(sorted(members, key=lambda s: (s.kind != "full", s.to_createtxg, s.id)))
    orphans = [s for s in alive if s.id not in reached]
    return chains, orphans
