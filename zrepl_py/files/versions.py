"""A file's states across snapshots, put in order and folded into versions (PURE).

``zbak find DATASET PATH`` reads PATH in every snapshot of the dataset on its own host and on
each ZFS replica (``files.find``); each snapshot, by guid, is read once, where it is
cheapest. This module orders what was read and numbers the versions
(docs/decisions.md#zbak-find-folds-equal-neighbours-into-one-version):

- order: createtxg orders one pool's snapshots, but a replica's txgs are its own pool's, so
  the listings are merged by guid: a snapshot comes after everything before it in any
  listing (a replica receives in the source's order), the source's listing first where
  nothing else decides (``merge_orders``);
- versions: a snapshot whose PATH has the same kind, size, mtime, SHA-256 and symlink
  target as in the snapshot just before it is the same version; any difference, or PATH
  missing in between, starts a new one. sanoid's findoid folds by size and mtime over all
  snapshots; folding only neighbours keeps a change that was undone (A, B, A) as three
  versions, and the hash tells contents apart that size and mtime do not.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping, Sequence
from typing import Any

ABSENT = "absent"
"""The kind of a snapshot in which PATH does not exist."""


@dataclasses.dataclass(frozen=True)
class FileState:
    """PATH in one snapshot.

    Attributes:
        snapshot: the snapshot's short name.
        guid: the snapshot's guid.
        kind: ``file``, ``directory``, ``symlink``, ... (``snapshot_files.KINDS``), or
            ``ABSENT``.
        size: bytes (0 when absent).
        mtime_ns: modification time in ns since the epoch (UTC); 0 when absent.
        sha256: hex digest of a file's content; "" for anything else.
        target: a symlink's target; "" for anything else.
    """

    snapshot: str
    guid: int
    kind: str
    size: int = 0
    mtime_ns: int = 0
    sha256: str = ""
    target: str = ""

    def same_content(self, other: FileState) -> bool:
        """True when both show PATH alike (kind, size, mtime, hash, target)."""
        return ((self.kind, self.size, self.mtime_ns, self.sha256, self.target)
                == (other.kind, other.size, other.mtime_ns, other.sha256, other.target))

    def to_json(self) -> dict[str, Any]:
        """The state as a JSON object (the file verb's line, ``serve.files``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileState:
        """The inverse of ``to_json``.

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        try:
            state = cls(str(data["snapshot"]), int(data["guid"]), str(data["kind"]),
                        int(data["size"]), int(data["mtime_ns"]), str(data["sha256"]),
                        str(data["target"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a file state: {data!r}") from exc
        return state


@dataclasses.dataclass(frozen=True)
class Version:
    """One snapshot's row in ``zbak find``.

    Attributes:
        state: PATH in that snapshot.
        number: the version (1 for the oldest; equal for neighbours with the same content;
            0 while PATH is absent).
        where: the places that hold the snapshot (``local``, ``HOST:DATASET``), cheapest
            first.
    """

    state: FileState
    number: int
    where: tuple[str, ...]


def merge_orders(listings: Sequence[Sequence[int]]) -> list[int]:
    """One order of the guids of ``listings`` (each oldest first) that keeps every
    listing's own order; where none decides, earlier listings' guids and then earlier
    positions come first (a topological sort, Kahn's algorithm with a priority).

    A guid two listings order differently (impossible for snapshots received in order) ends
    up after its predecessors in the first listing that names it.
    """
    rank: dict[int, tuple[int, int]] = {}
    after: dict[int, set[int]] = {}
    before_count: dict[int, int] = {}
    for index, listing in enumerate(listings):
        for position, guid in enumerate(listing):
            rank.setdefault(guid, (index, position))
            after.setdefault(guid, set())
            before_count.setdefault(guid, 0)
        for earlier, later in zip(listing, listing[1:], strict=False):
            if later not in after[earlier] and earlier not in after[later]:
                after[earlier].add(later)
                before_count[later] += 1
    ready = [(rank[g], g) for g, n in before_count.items() if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, guid = heapq.heappop(ready)
        order.append(guid)
        for later in after[guid]:
            before_count[later] -= 1
            if before_count[later] == 0:
                heapq.heappush(ready, (rank[later], later))
    placed = set(order)
    order += sorted((g for g in rank if g not in placed), key=rank.__getitem__)  # a cycle
    return order


def number_versions(states: Sequence[FileState],
                    where: Mapping[int, Sequence[str]]) -> list[Version]:
    """Rows for ``states`` (in snapshot order): a new number whenever PATH differs from the
    snapshot before (module doc); 0 where it is absent."""
    rows: list[Version] = []
    number = 0
    previous: FileState | None = None
    for state in states:
        if state.kind != ABSENT and (previous is None or not state.same_content(previous)):
            number += 1
        rows.append(Version(state, number if state.kind != ABSENT else 0,
                            tuple(where.get(state.guid, ()))))
        previous = state
    return rows
