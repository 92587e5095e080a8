"""``zbak snapshot``: for one job, lock, snapshot, re-list into the catalog, record the run."""

from __future__ import annotations

import dataclasses

from zrepl_py.config.schema import JobConfig
from zrepl_py.context import Context, lock_key
from zrepl_py.locking import dataset_lock
from zrepl_py.runs import recorded_run
from zrepl_py.snapshots.inventory import take_inventory
from zrepl_py.snapshots.take import Taken, take_snapshot


@dataclasses.dataclass(frozen=True)
class SnapshotResult:
    """What ``snapshot_job`` did for one job."""

    job: str
    source: str
    taken: Taken


def snapshot_job(ctx: Context, name: str, job: JobConfig) -> SnapshotResult:
    """Take the job's snapshot now and record it (see ``take_snapshot`` for atomicity).

    Raises:
        Locked: another run holds the job's dataset lock (exit 3).
        ZfsError, HostUnreachable, CatalogError: the run failed; it is recorded as failed.
    """
    source = job.source
    catalog = ctx.catalog()
    with dataset_lock(ctx.state_dir, lock_key(job), "snapshot"):
        with recorded_run(catalog, ctx.clock, name, "snapshot"):
            zfs = ctx.zfs(source.host, source.dataset.pool)
            now = ctx.clock.now()
            before = take_inventory(zfs, catalog, job, now)
            taken = take_snapshot(zfs, job, [d.name for d in before.datasets], now)
            take_inventory(zfs, catalog, job, now)
    return SnapshotResult(job=name, source=str(source), taken=taken)
