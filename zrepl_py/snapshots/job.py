"""``zbak snapshot``: for one job, lock, run the pre hook, snapshot, re-list into the catalog,
record the run, run the post hook."""

from __future__ import annotations

import dataclasses

from zrepl_py.checks.source import source_errors
from zrepl_py.config.schema import JobConfig
from zrepl_py.hooks.around import ActionHooks
from zrepl_py.hooks.environment import Facts
from zrepl_py.invocation.context import Context, lock_key
from zrepl_py.locking import dataset_lock
from zrepl_py.observe.runlog import recorded_run
from zrepl_py.snapshots.inventory import take_inventory
from zrepl_py.snapshots.take import Taken, take_snapshot


@dataclasses.dataclass(frozen=True)
class SnapshotResult:
    """What ``snapshot_job`` did for one job."""

    job: str
    source: str
    taken: Taken
    datasets: tuple[str, ...]
    """The datasets that now carry the snapshot, from the listing after it was taken."""


def snapshot_job(ctx: Context, name: str, job: JobConfig) -> SnapshotResult:
    """Take the job's snapshot now and record it (see ``take_snapshot`` for atomicity).

    The job's snapshot hooks run around it (``zrepl_py.hooks``), inside the lock.

    Raises:
        Locked: another run holds the job's dataset lock (exit 3).
        SourceMissing: the source dataset or its pool does not exist (recorded as failed).
        ZfsError, HostUnreachable, CatalogError: the run failed; it is recorded as failed.
        HookFailed: a pre or post hook failed (see ``hooks.around``).
    """
    source = job.source
    catalog = ctx.catalog()
    facts = Facts("snapshot", name, source.host, str(source.dataset))
    with dataset_lock(ctx.state_dir, lock_key(job), "snapshot"), \
            ActionHooks(job.hooks.get("snapshot"), catalog, ctx.clock, facts) as hooks:
        with recorded_run(catalog, ctx.clock, name, "snapshot"), source_errors(ctx, name, job):
            zfs = ctx.zfs(source.host, source.dataset.pool)
            now = ctx.clock.now()
            # Only excludes need the covered datasets before the snapshot; otherwise one
            # listing afterwards both records the new snapshot and says where it landed.
            covered = [source.dataset]
            if job.recursive and job.exclude:
                covered = [d.name for d in take_inventory(zfs, catalog, job, now).datasets]
            taken = take_snapshot(zfs, job, covered, now)
            after = take_inventory(zfs, catalog, job, now)
        datasets = tuple(str(d.name) for d in after.datasets
                         if any(s.short == taken.short for s in after.tree.snapshots(d.name)))
        hooks.outcome.snapshot, hooks.outcome.datasets = taken.short, datasets
    return SnapshotResult(job=name, source=str(source), taken=taken, datasets=datasets)
