"""``zbak prune`` for one job: source snapshots, replica snapshots, archive chains.

Under the job's dataset lock (the one ``snapshot``, ``replicate`` and ``archive`` take), from
one fresh listing of the source plus the catalog:

1. source snapshots: retention, never a held, cloned, foreign or newest snapshot, a
   replication base, one not yet replicated, or an archive base (``pruning.source``); the
   archive hold left on the tip of a chain a newer full has closed is released first;
2. each ZFS target with a ``retention``: the target's zbak snapshots (``pruning.replica``),
   under the target's lock too;
3. the job's chains in each store with a retention (the archive store, each copy store with a
   ``retention``): whole chains (``pruning.archive``, ``pruning.chain_plan``,
   ``pruning.chain_delete``), never the last sound copy of a stream another store's retention
   wants (``pruning.last_copy``).

Each part's failure is reported in the result and the other parts still run. With
``dry_run`` nothing is destroyed or deleted and no run is recorded; otherwise each part is
a recorded run (``prune`` with target None, the replica target, or ``archive:STORE`` per store).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Mapping

from zrepl_py.catalog.export import StoreGuard
from zrepl_py.catalog.rows import StreamRow
from zrepl_py.checks.source import source_errors
from zrepl_py.config.hosts import Endpoint
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.schema import replica_datasets
from zrepl_py.errors import CommandFailed, DatasetNotFound, HoldNotFound, ZbakError, ZfsError
from zrepl_py.hooks.around import ActionHooks
from zrepl_py.hooks.environment import Facts
from zrepl_py.invocation.context import Context, lock_key
from zrepl_py.objects.layout import dataset_prefix
from zrepl_py.observe.runlog import recorded_run
from zrepl_py.proc.executor import COMMAND_NOT_FOUND
from zrepl_py.pruning.archive import (
    ArchivePruneResult,
    StoreScope,
    execute_dataset_chains,
    job_stores,
    plan_stores,
    store_check,
    store_streams,
)
from zrepl_py.pruning.replica import ReplicaPruneResult, plan_replica_prune, zfs_targets
from zrepl_py.pruning.snapshot_plan import PrunePlan
from zrepl_py.pruning.source import (
    PruneOutcome,
    archive_protections,
    execute_source_prune,
    plan_source_prune,
    replication_protections,
    stale_archive_tips,
)
from zrepl_py.pruning.unknown_versions import UnknownVersions, prune_unknown_versions
from zrepl_py.snapshots.inventory import Inventory, take_inventory
from zrepl_py.stores.base import Backend
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import SnapshotName
from zrepl_py.zfs.protect import hold_tag

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PruneResult:
    """The source plan per dataset and, unless it was a dry run, what executing it did; the
    replica targets' results; each pruned store's result (the archive store first, then the
    copy stores with a ``retention``)."""

    job: str
    plans: dict[str, PrunePlan]
    outcome: PruneOutcome | None
    replicas: tuple[ReplicaPruneResult, ...] = ()
    stores: tuple[ArchivePruneResult, ...] = ()
    archive_store: str | None = None

    @property
    def archive(self) -> ArchivePruneResult | None:
        """The result of the job's archive store (None: no archive, or not pruned)."""
        return next((s for s in self.stores if s.store == self.archive_store), None)

    @property
    def failed(self) -> bool:
        """True when any part failed (source destroys, a target, a store)."""
        return bool((self.outcome and self.outcome.failed)
                    or any(r.failed for r in self.replicas)
                    or any(s.failed for s in self.stores))

    def problems(self) -> list[str]:
        """One line per failed part: each source snapshot not destroyed, each target and
        store that failed."""
        found = [f"{n}: {e}" for n, e in (self.outcome.failed if self.outcome else [])]
        found += [f"target {r.target}: {r.error}" for r in self.replicas if r.error]
        found += [f"target {r.target}: {n}: {e}" for r in self.replicas if r.outcome
                  for n, e in r.outcome.failed]
        for store in self.stores:
            if store.error:
                found.append(f"store {store.store}: {store.error}")
            found += [f"store {store.store}: {d.dataset}: {d.problem}"
                      for d in store.datasets if d.failed]
            if store.versions is not None and store.versions.error:
                found.append(f"store {store.store}: unknown versions: {store.versions.error}")
        return found


def prune_job(ctx: Context, name: str, job: JobConfig, *, dry_run: bool,
              accept_early_delete_fee: bool = False) -> PruneResult:
    """Apply the job's retention to its source, its ZFS targets and its archive chains.

    Args:
        ctx: the invocation's context.
        name / job: the job.
        dry_run: plan and show only.
        accept_early_delete_fee: let archive retention delete streams younger than their
            storage class's minimum duration.

    Raises:
        Locked: another run holds the job's dataset lock (exit 3).
        SourceMissing: the source dataset or its pool does not exist.
        ZfsError, HostUnreachable, CatalogError: listing the source failed (target, store and
            destroy failures are reported in the result instead).
        HookFailed: a pre or post prune hook failed (``zrepl_py.hooks``; they run around the
            run, inside the lock, never in a dry run).
    """
    source = job.source
    catalog = ctx.catalog()
    targets = tuple(str(t) for t in zfs_targets(job)) + tuple(
        store for store, policy in job_stores(job, accept_early_delete_fee=False)
        if policy is not None)
    with ctx.lock(lock_key(job), "prune"), \
            ActionHooks(job.hooks.get("prune"), catalog, ctx.clock,
                        Facts("prune", name, source.host, str(source.dataset), targets),
                        dry_run=dry_run) as hooks, \
            contextlib.ExitStack() as stack:
        # The source's run row is open before the source is listed, so a failure there is a
        # recorded failed run and an alert
        # (docs/decisions.md#every-failed-action-is-a-recorded-run).
        record = None if dry_run else stack.enter_context(
            recorded_run(catalog, ctx.clock, name, "prune"))
        stack.enter_context(source_errors(ctx, name, job))
        zfs = ctx.zfs(source.host, source.dataset.pool)
        now = ctx.clock.now()
        others = replica_datasets(ctx.config, source.host)
        inventory = take_inventory(zfs, catalog, job, now, replicas=others, with_clones=True)
        streams = catalog.bulk_streams(host=source.host, below=str(source.dataset))
        if not dry_run and _release_stale_archive_holds(zfs, name, inventory, streams):
            inventory = take_inventory(zfs, catalog, job, now, replicas=others,
                                       with_clones=True)
        protections = replication_protections(inventory, name, job, catalog.cursors())
        for snap, reasons in archive_protections(inventory, streams).items():
            protections.setdefault(snap, []).extend(reasons)
        plans = plan_source_prune(inventory, job, protections, now)
        outcome = None
        if record is not None:
            outcome = execute_source_prune(zfs, plans)
            take_inventory(zfs, catalog, job, ctx.clock.now(), replicas=others)
            if outcome.failed:
                record.result = "partial"
                record.error = "; ".join(f"{n}: {e}" for n, e in outcome.failed)
            stack.close()  # the source's run ends here; targets and the archive have their own
        replicas = tuple(_prune_target(ctx, name, job, target, inventory, dry_run=dry_run)
                         for target in zfs_targets(job))
        stores = _prune_stores(ctx, name, job, streams, dry_run=dry_run,
                               accept_early_delete_fee=accept_early_delete_fee,
                               left_out=inventory.left_out)
        result = PruneResult(name, plans, outcome, replicas, tuple(stores),
                             job.archive.store if job.archive else None)
        hooks.outcome.datasets = tuple(plans)
        hooks.outcome.result = "partial" if result.failed else "ok"
        hooks.outcome.error = "; ".join(result.problems()) or None
    return result


def _release_stale_archive_holds(zfs: Zfs, name: str, inventory: Inventory,
                                 streams: list[StreamRow]) -> int:
    """Release this job's archive hold on tips of chains a newer full has closed; return how
    many were released (``pruning.source.stale_archive_tips``)."""
    released = 0
    for snap, stores in stale_archive_tips(inventory, streams).items():
        for store in stores:
            try:
                zfs.release(SnapshotName(snap), hold_tag(name, f"archive:{store}"))
            except (HoldNotFound, DatasetNotFound):
                continue  # another job's hold, or gone: nothing of ours to release
            except ZfsError as exc:
                log.warning("could not release the archive hold on %s: %s", snap, exc)
                continue
            log.info("released the archive hold on %s: its chain in %s is closed", snap, store)
            released += 1
    return released


def _prune_target(ctx: Context, name: str, job: JobConfig, target: Endpoint,
                  inventory: Inventory, *, dry_run: bool) -> ReplicaPruneResult:
    """Plan and (unless ``dry_run``) apply the target's retention; errors go in the result."""
    assert job.replicate is not None and job.replicate.retention is not None
    assert target.dataset is not None
    result = ReplicaPruneResult(str(target))
    try:
        with ctx.lock(f"target {target}", "prune"):
            try:
                dst = ctx.zfs(target.host, target.dataset.pool)
            except CommandFailed as exc:
                if job.replicate.method == "auto" and exc.returncode == COMMAND_NOT_FOUND:
                    return result  # method auto fell back to rsync there: no snapshots
                raise
            try:
                tree = dst.tree(target.dataset, recursive=True)
            except DatasetNotFound:
                return result
            clones = {str(snap): tuple(map(str, found))
                      for snap, found in dst.clones(target.dataset.pool).items()}
            result.plans = plan_replica_prune(job, target, job.replicate.retention, inventory,
                                              tree, ctx.catalog().cursors(), clones,
                                              ctx.clock.now())
            if dry_run:
                return result
            with recorded_run(ctx.catalog(), ctx.clock, name, "prune", str(target)) as record:
                result.outcome = execute_source_prune(dst, result.plans)
                if result.outcome.failed:
                    record.result = "partial"
                    record.error = "; ".join(f"{n}: {e}" for n, e in result.outcome.failed)
    except ZbakError as exc:
        log.error("job %s: pruning target %s failed: %s", name, target, exc)
        result.error = str(exc)
    return result


def _prune_stores(ctx: Context, name: str, job: JobConfig, streams: list[StreamRow], *,
                  dry_run: bool, accept_early_delete_fee: bool,
                  left_out: tuple[str, ...]) -> list[ArchivePruneResult]:
    """Apply each store's retention to the job's chains there (``pruning.archive.job_stores``:
    the archive store, then each copy store with a ``retention``), planned together so that
    no store deletes the last sound copy of a stream another store's retention wants
    (``pruning.last_copy``), over ``streams`` (the catalog's streams of the job's tree, read
    once for the whole prune); errors go in the results, one per pruned store.
    Each pruned store's catalog export lists every stream of the job there afterwards."""
    scopes, guards, results = [], {}, {}
    order = job_stores(job, accept_early_delete_fee=accept_early_delete_fee)
    for store, policy in order:
        try:
            backend = ctx.store(store)
            if policy is not None:
                # docs/reliability.md#r25-catalog-rollback-detection: a rolled-back store is
                # refused before any chain is touched.
                guards[store] = StoreGuard(backend, store, ctx.state_dir, job=name)
                guards[store].check()
        except ZbakError as exc:
            log.error("job %s: pruning store %s failed: %s", name, store, exc)
            if policy is not None:
                results[store] = ArchivePruneResult(store, error=str(exc))
            scopes.append(StoreScope(store, None, None, None))  # its copies are not sound
            continue
        scopes.append(StoreScope(store, backend, policy,
                                 store_check(backend, ctx.catalog(), job, store)))
    # (planning reports a dataset's store and catalog errors in its result, raising none)
    planned = plan_stores(scopes, job, streams, ctx.clock.now(), left_out=left_out)
    results.update(planned)
    backends = {s.name: s.backend for s in scopes if s.backend is not None}
    for scope in scopes:
        if scope.backend is None or scope.name not in planned:
            continue
        if dry_run:
            try:
                planned[scope.name].versions = _unknown_versions(
                    ctx, job, scope.backend, scope.name, dry_run=True)
            except ZbakError as exc:
                log.error("job %s: pruning store %s failed: %s", name, scope.name, exc)
                planned[scope.name].error = str(exc)
        else:
            _execute_store(ctx, name, job, scope.backend, guards[scope.name],
                           planned[scope.name], backends)
    return [results[store] for store, _ in order if store in results]


def _unknown_versions(ctx: Context, job: JobConfig, backend: Backend, store: str, *,
                      dry_run: bool) -> UnknownVersions | None:
    """On a store that keeps versions, delete (or with ``dry_run`` only show) the versions
    of the job's catalogued keys there the catalog does not know once their locks lapse
    (``pruning.unknown_versions``), over the catalog as it is now; None elsewhere.

    Raises:
        CatalogError: reading the streams or volumes failed (store errors go in the result).
    """
    if not backend.keeps_versions:
        return None
    source = job.source
    root = str(source.dataset)
    catalog = ctx.catalog()
    streams = store_streams(catalog, job, store)
    volumes = catalog.bulk_volumes(host=source.host, below=root, store=store)
    return prune_unknown_versions(backend, dataset_prefix(source.host, root), streams, volumes,
                                  catalog.manifest_locks(s.id for s in streams),
                                  ctx.clock.now(), dry_run=dry_run)


def _execute_store(ctx: Context, name: str, job: JobConfig, backend: Backend,
                   guard: StoreGuard, result: ArchivePruneResult,
                   backends: Mapping[str, Backend]) -> None:
    """Execute a store's planned datasets as one recorded run (``prune``, target
    ``archive:STORE``), then publish the store's catalog export and delete its older
    generations whose locks lapsed (``StoreGuard.prune_generations``); errors go in
    ``result``. ``backends``: the job's open stores by name (a delete relying on a copy in
    one of them re-checks it, ``pruning.chain_delete``)."""
    store = result.store
    try:
        with recorded_run(ctx.catalog(), ctx.clock, name, "prune", f"archive:{store}") as record:
            for dataset in result.datasets:
                execute_dataset_chains(dataset, backend, ctx.catalog(), ctx.clock.now(),
                                       backends)
            result.versions = _unknown_versions(ctx, job, backend, store, dry_run=False)
            errors = [f"{d.dataset}: {d.problem}" for d in result.datasets if d.failed]
            if result.versions is not None and result.versions.error:
                errors.append(f"unknown versions: {result.versions.error}")
            if errors:
                record.result, record.error = "partial", "; ".join(errors)
            guard.publish(store_streams(ctx.catalog(), job, store), ctx.clock.now())
            # docs/decisions.md#write-once-catalog-exports: older generations once lapsed
            guard.prune_generations(ctx.clock.now())
    except ZbakError as exc:
        log.error("job %s: pruning store %s failed: %s", name, store, exc)
        result.error = str(exc)
