"""``zbak snapshot``: for one job, lock, run the pre hook, snapshot, re-list into the catalog,
record the run, run the post hook."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from zrepl_py.checks.source import source_errors
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.schema import replica_datasets
from zrepl_py.errors import ZfsError
from zrepl_py.hooks.around import ActionHooks
from zrepl_py.hooks.environment import Facts
from zrepl_py.invocation.context import Context, lock_key
from zrepl_py.observe.runlog import recorded_run
from zrepl_py.snapshots.inventory import take_inventory
from zrepl_py.snapshots.selection import replica_of
from zrepl_py.snapshots.take import SnapshotPlan, Taken, plan_snapshot, take_snapshot
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SnapshotResult:
    """What ``snapshot_job`` did for one job."""

    job: str
    source: str
    taken: Taken
    datasets: tuple[str, ...]
    """The datasets that now carry the snapshot, from the listing after it was taken."""
    unchanged: tuple[tuple[str, str], ...] = ()
    """Datasets ``min_change`` left without a new snapshot, with the reason."""
    notes: tuple[str, ...] = ()
    """What the run could not do as configured (``min_change`` not applicable, a
    ``select`` matching nothing)."""


def snapshot_job(ctx: Context, name: str, job: JobConfig) -> SnapshotResult:
    """Take the job's snapshot now and record it (see ``snapshots.take`` for atomicity and
    how ``min_change`` skips unchanged datasets).

    The job's snapshot hooks run around it (``zrepl_py.hooks``), inside the lock.

    Raises:
        Locked: another run holds the job's dataset lock (exit 3).
        SourceMissing: the source dataset or its pool does not exist (recorded as failed).
        ZfsError, HostUnreachable, CatalogError: the run failed; it is recorded as failed.
        HookFailed: a pre or post hook failed (see ``hooks.around``).
    """
    source = job.source
    catalog = ctx.catalog()
    replicas = replica_datasets(ctx.config, source.host)
    facts = Facts("snapshot", name, source.host, str(source.dataset))
    with ctx.lock(lock_key(job), "snapshot"), \
            ActionHooks(job.hooks.get("snapshot"), catalog, ctx.clock, facts) as hooks:
        with recorded_run(catalog, ctx.clock, name, "snapshot") as record, \
                source_errors(ctx, name, job):
            zfs = ctx.zfs(source.host, source.dataset.pool)
            now = ctx.clock.now()
            plan, notes = _plan(zfs, catalog, name, job, now, replicas)
            taken = take_snapshot(zfs, source.dataset, job.snapshot.prefix, plan, now)
            after = take_inventory(zfs, catalog, job, now, replicas=replicas)
            for note in notes:
                log.warning("job %s: %s", name, note)
            record.error = "; ".join(notes) or None
        datasets = tuple(str(d.name) for d in after.datasets
                         if any(s.short == taken.short for s in after.tree.snapshots(d.name)))
        hooks.outcome.snapshot = taken.short if datasets else None
        hooks.outcome.datasets = datasets
    for dataset, why in plan.unchanged:
        log.info("job %s: %s not snapshotted: %s", name, dataset, why)
    return SnapshotResult(job=name, source=str(source), taken=taken, datasets=datasets,
                          unchanged=tuple((str(d), why) for d, why in plan.unchanged),
                          notes=tuple(notes))


def _plan(zfs: Zfs, catalog: Catalog, name: str, job: JobConfig, now: dt.datetime,
          replicas: Mapping[DatasetName, str]) -> tuple[SnapshotPlan, list[str]]:
    """The snapshot plan (``take.plan_snapshot``) and the run's notes. The tree is listed
    first only when the plan depends on it; otherwise one listing after the snapshot both
    records it and says where it landed."""
    source = job.source
    # A replica target of another job below the root: `zfs snapshot -r` could reach it.
    whole_tree = not job.recursive or not any(replica_of(d, source.dataset, replicas)
                                              for d in replicas)
    min_change = job.snapshot.min_change
    notes = _written_problems(zfs, source.dataset.pool) if min_change else []
    if not (job.exclude or job.select or (min_change and not notes) or not whole_tree):
        return SnapshotPlan((source.dataset,), recursive=job.recursive), notes
    before = take_inventory(zfs, catalog, job, now, replicas=replicas,
                            written=bool(min_change and not notes))
    written = None if notes else before.written
    if job.select is not None and not before.datasets:
        # a mistyped value must not look like a quiet success
        notes.append(f"select {job.select} matches no dataset below {source.dataset}: nothing"
                     f" was snapshotted (zbak list datasets {name} shows why)")
    plan = plan_snapshot(before.tree, [d.name for d in before.datasets],
                         recursive=job.recursive, prefix=job.snapshot.prefix,
                         min_change=min_change, written=written,
                         whole_tree=whole_tree)
    return plan, notes


def _written_problems(zfs: Zfs, pool: str) -> list[str]:
    """Why ``written`` cannot be trusted now ([] when it can): this ZFS lacks the property
    (zfs-fuse), or ``zpool sync`` failed, so data written in the last few seconds would
    not show yet (``Zfs.sync_pool``). Either way every dataset is snapshotted."""
    if not zfs.capabilities.written:
        return [f"min_change is not applied: the ZFS on {zfs.host} has no 'written' property "
                "(zfs-fuse; OpenZFS has it), so every selected dataset is snapshotted"]
    try:
        zfs.sync_pool(pool)
    except ZfsError as exc:
        return [f"min_change is not applied: zpool sync {pool} failed ({exc}), so 'written' "
                "may miss the last seconds of writes; every selected dataset is snapshotted"]
    return []
