"""Replica-side retention: apply ``[jobs.NAME.replicate] retention`` on each ZFS target.

Per ZFS target (directory targets keep their trees): one listing of the target tree and one
of its pool's clones, then for every dataset the job covers, the same pure planner as the
source (``pruning.snapshot_plan.plan_prune``) over the target dataset's snapshots, with these
protections (docs/design.md#snapshots):

* only zbak's own snapshots (the job's prefix) are ever destroyed; held snapshots and
  snapshots with clones are kept (the planner's rules);
* the newest snapshot common with the source (same guid) is the next incremental's base;
* every replica cursor in the catalog naming this target dataset (any job) is kept;
* the target dataset's newest snapshot is kept (the planner's rule).

Destroys are one plain ``zfs destroy DATASET@SNAP`` each (``Zfs.destroy_snapshot``), never
``-r``/``-R``, so ZFS still refuses a snapshot that gained a hold or clone since the listing.
The target is locked like ``zbak replicate`` locks it, so no receive runs meanwhile.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from zrepl_py.catalog.rows import CursorRow
from zrepl_py.config.hosts import Endpoint, parse_endpoint
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.retention import Retention
from zrepl_py.pruning.snapshot_plan import Candidate, PrunePlan, plan_prune
from zrepl_py.pruning.source import PruneOutcome
from zrepl_py.snapshots.inventory import Inventory
from zrepl_py.snapshots.naming import is_own
from zrepl_py.zfs.model import Tree
from zrepl_py.zfs.names import DatasetName

NEWEST_COMMON = "newest snapshot common with the source (replication base)"


@dataclasses.dataclass
class ReplicaPruneResult:
    """One target: the plan per target dataset, what executing did (None on a dry run, or
    when the target could not be reached), or the error."""

    target: str
    plans: dict[str, PrunePlan] = dataclasses.field(default_factory=dict)
    outcome: PruneOutcome | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        """True when the target failed or a destroy failed."""
        return bool(self.error or (self.outcome and self.outcome.failed))


def _cursor_host(cursor: CursorRow) -> str | None:
    try:
        return parse_endpoint(cursor.target, allow_directory=True).host
    except ValueError:
        return None


def plan_replica_prune(
    job: JobConfig,
    target: Endpoint,
    retention: Retention,
    inventory: Inventory,
    target_tree: Tree | None,
    cursors: Sequence[CursorRow],
    clones: dict[str, tuple[str, ...]],
    now: dt.datetime,
) -> dict[str, PrunePlan]:
    """Plan retention on one ZFS target (pure over the listings; module doc rules).

    Args:
        job: the job (source dataset, snapshot prefix).
        target: a dataset target (``HOST:POOL/PATH``).
        retention: the target's retention.
        inventory: the source listing (for common guids).
        target_tree: the recursive listing of the target dataset; None when it does not
            exist (nothing to prune).
        cursors: every replica cursor in the catalog.
        clones: ``{target snapshot name: clone names}`` for the target's pool.
        now: aware UTC.

    Returns:
        ``{target dataset: PrunePlan}`` for each covered dataset present on the target.
    """
    if target_tree is None:
        return {}
    present = {d.name for d in target_tree.datasets}
    plans: dict[str, PrunePlan] = {}
    for info in inventory.datasets:
        target_ds = target_dataset_of(job, target, info.name)
        if target_ds not in present:
            continue
        snaps = target_tree.snapshots(target_ds)
        protections: dict[int, list[str]] = {}
        source_guids = {s.guid for s in inventory.tree.snapshots(info.name)}
        common = [s for s in snaps if s.guid in source_guids]
        if common:
            protections.setdefault(common[-1].guid, []).append(NEWEST_COMMON)
        for cursor in cursors:
            if cursor.target_location == str(target_ds) and _cursor_host(cursor) == target.host:
                protections.setdefault(cursor.guid, []).append(
                    f"replication cursor of {cursor.job} -> {cursor.target}")
        candidates = [
            Candidate(name=str(s.name), createtxg=s.createtxg, guid=s.guid, created=s.creation,
                      own=is_own(job.snapshot.prefix, s.short), userrefs=s.userrefs,
                      clones=clones.get(str(s.name), ()),
                      protections=tuple(protections.get(s.guid, ())))
            for s in snaps
        ]
        plans[str(target_ds)] = plan_prune(candidates, retention, now)
    return plans


def zfs_targets(job: JobConfig) -> list[Endpoint]:
    """The job's dataset targets that have a retention to apply (empty without one)."""
    if job.replicate is None or job.replicate.retention is None:
        return []
    if job.replicate.method == "rsync":
        return []
    return [t for t in job.replicate.endpoints() if t.dataset is not None]


def target_dataset_of(job: JobConfig, target: Endpoint, dataset: DatasetName) -> DatasetName:
    """Where source ``dataset`` of the job lands on ``target``."""
    assert target.dataset is not None
    return target.dataset.child(dataset.relative_to(job.source.dataset))
