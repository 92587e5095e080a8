"""``zbak find DATASET PATH``: PATH's versions across the snapshots of the dataset and of its
ZFS replicas (docs/files.md#zbak-find).

The places are the dataset on its own host and every ZFS replica the catalog has a cursor
for (``restore.gather``: listed once each; one that cannot be listed is reported, not
fatal). Each snapshot, by guid, is read once: on the dataset's own host when it is still
there, else on the first replica that has it (``files.access.states_at``: directly, or by
``zbak serve``'s file verb), so only metadata and hashes cross the network, never the
file. The rows are ordered and folded by ``files.versions``.
"""

from __future__ import annotations

import dataclasses

from zrepl_py.errors import RestoreError, ZbakError
from zrepl_py.files.access import states_at
from zrepl_py.files.versions import FileState, Version, merge_orders, number_versions
from zrepl_py.invocation.context import Context
from zrepl_py.restore.gather import listing, replica_listings, resolve_dataset
from zrepl_py.zfs.names import DatasetName


@dataclasses.dataclass(frozen=True)
class Found:
    """What ``find_versions`` found.

    Attributes:
        host / dataset: the dataset (as catalogued).
        path: the path looked for.
        rows: one per snapshot read, oldest first; ``where`` names places as
            ``HOST:DATASET`` (``local:`` for this machine).
        problems: one line per place that could not be read (with why).
    """

    host: str
    dataset: str
    path: str
    rows: tuple[Version, ...]
    problems: tuple[str, ...]


def find_versions(ctx: Context, dataset_arg: str, path: str) -> Found:
    """Read ``path`` in every snapshot of the dataset and its replicas (the module doc).

    Raises:
        UsageError: see ``restore.gather.resolve_dataset``.
        RestoreError: no place could be read, or ``path`` is in none of the snapshots.
        CatalogError: the catalog cannot be read.
    """
    host, dataset = resolve_dataset(ctx, dataset_arg)
    places = [listing(ctx, host, dataset), *replica_listings(ctx, host, dataset)]
    labels = [f"{place.host}:{place.dataset}" for place in places]
    problems = [f"{label}: {place.problem}" for label, place in zip(labels, places, strict=True)
                if place.problem]
    where: dict[int, list[str]] = {}
    for label, place in zip(labels, places, strict=True):
        for snap in place.snapshots:
            where.setdefault(snap.guid, []).append(label)
    states: dict[int, FileState] = {}
    for label, place in zip(labels, places, strict=True):
        wanted = [s.guid for s in place.snapshots if s.guid not in states]
        if place.problem or not wanted:
            continue
        try:
            for state in states_at(ctx, place.host, DatasetName(place.dataset), path, wanted):
                states.setdefault(state.guid, state)
        except ZbakError as exc:
            problems.append(f"{label}: {exc}")
    order = merge_orders([[s.guid for s in p.snapshots] for p in places if not p.problem])
    rows = number_versions([states[g] for g in order if g in states], where)
    if not states:
        raise RestoreError(f"no snapshot of {host}:{dataset} could be read: "
                           + ("; ".join(problems) or "it has no snapshots"))
    if not any(r.number for r in rows):
        raise RestoreError(f"{path!r} is in none of the {len(rows)} snapshot(s) of"
                           f" {host}:{dataset} read" + (f" ({'; '.join(problems)})"
                                                         if problems else ""))
    return Found(host, dataset, path, tuple(rows), tuple(problems))
