"""``zbak prune`` for source snapshots of one job: lock, list, plan, (dry-run or) destroy."""

from __future__ import annotations

import dataclasses

from zrepl_py.config.schema import JobConfig
from zrepl_py.context import Context, lock_key
from zrepl_py.locking import dataset_lock
from zrepl_py.pruning.planner import PrunePlan
from zrepl_py.pruning.source import (
    PruneOutcome,
    execute_source_prune,
    plan_source_prune,
    replication_protections,
)
from zrepl_py.runs import recorded_run
from zrepl_py.snapshots.inventory import take_inventory


@dataclasses.dataclass(frozen=True)
class PruneResult:
    """The plan per dataset and, unless it was a dry run, what executing it did."""

    job: str
    plans: dict[str, PrunePlan]
    outcome: PruneOutcome | None


def prune_job(ctx: Context, name: str, job: JobConfig, *, dry_run: bool) -> PruneResult:
    """Apply the job's snapshot retention to its source datasets.

    The plan is computed from one fresh listing plus the catalog's replication cursors;
    with ``dry_run`` nothing is destroyed and no run is recorded.

    Raises:
        Locked: another run holds the job's dataset lock (exit 3).
        ZfsError, HostUnreachable, CatalogError: listing failed (destroy failures are
            collected in the outcome instead).
    """
    source = job.source
    catalog = ctx.catalog()
    with dataset_lock(ctx.state_dir, lock_key(job), "prune"):
        zfs = ctx.zfs(source.host, source.dataset.pool)
        now = ctx.clock.now()
        inventory = take_inventory(zfs, catalog, job, now, with_clones=True)
        protections = replication_protections(inventory, name, job, catalog.cursors())
        plans = plan_source_prune(inventory, job, protections, now)
        if dry_run:
            return PruneResult(name, plans, None)
        with recorded_run(catalog, ctx.clock, name, "prune") as record:
            outcome = execute_source_prune(zfs, plans)
            take_inventory(zfs, catalog, job, ctx.clock.now())
            if outcome.failed:
                record.result = "partial"
                record.error = "; ".join(f"{n}: {e}" for n, e in outcome.failed)
    return PruneResult(name, plans, outcome)
