"""``zbak snapshot``: for one job, lock, snapshot, re-list into the catalog, record the run."""

from __future__ import annotations

import dataclasses

from zrepl_py.checks.source import source_errors
from zrepl_py.config.schema import JobConfig
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

    Raises:
        Locked: another run holds the job's dataset lock (exit 3).
        SourceMissing: the source dataset or its pool does not exist (recorded as failed).
        ZfsError, HostUnreachable, CatalogError: the run failed; it is recorded as failed.
    """
    source = job.source
    catalog = ctx.catalog()
    with dataset_lock(ctx.state_dir, lock_key(job), "snapshot"):
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
    return SnapshotResult(job=name, source=str(source), taken=taken, datasets=datasets)
