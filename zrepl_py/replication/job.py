"""``zbak replicate`` for one job: lock the source, list it once, bring every target up to date.

Targets are independent: one that fails (unreachable, a broken transfer) is recorded as a
failed run and the others still run. Within a target, ``[replicate] concurrency`` datasets
(default ``order.default_concurrency``: 4 per CPU, 2 to 8) are replicated at once
(``zfs_target``), over one shared ssh connection per host opened while the run starts, and
under one ``bandwidth_limit`` shared by them (``proc.ratelimit``). Within a target, a diverged dataset is skipped and the
others are replicated; the run then ends ``partial`` (``failed`` when every dataset
diverged), which raises the usual failure alert, and ``zbak replicate`` exits 1. Each
target's bytes, duration and result go to the catalog's ``runs`` table; each dataset's
cursor to ``replica_cursors``.

Method ``auto`` falls back to rsync (docs/design.md#replication) when the target host has no
``zfs`` (a non-recursive job, into ``/POOL/PATH``) or when its ZFS rejects a dataset's stream
as unsupported (``StreamUnsupported``; that dataset only, into the directory where its target
dataset would be mounted, ``rsync_target.fallback_directory``); each fallback adds a warning
naming the reason to the target's result. Method ``zfs`` reports both as errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import threading
from collections.abc import Callable, Hashable

from zrepl_py.catalog.rows import FailoverRow
from zrepl_py.checks.health import needs_size, source_warnings, target_warnings
from zrepl_py.checks.source import source_errors
from zrepl_py.config.hosts import DatasetEndpoint, Endpoint
from zrepl_py.config.jobs import JobConfig, no_zfs_fallback
from zrepl_py.config.replicate import ProtectionBudget
from zrepl_py.config.schema import replica_datasets
from zrepl_py.errors import (
    CommandFailed,
    FailedOver,
    InvalidName,
    StreamUnsupported,
    UsageError,
    ZbakError,
)
from zrepl_py.hooks.around import ActionHooks
from zrepl_py.hooks.environment import Facts, Outcome
from zrepl_py.invocation.context import Context, lock_key
from zrepl_py.observe.runlog import RunSet
from zrepl_py.observe.transfers import Queue, Slot, reporting
from zrepl_py.proc.executor import COMMAND_NOT_FOUND
from zrepl_py.proc.mbuffer import has_mbuffer
from zrepl_py.proc.ratelimit import SharedRate
from zrepl_py.replication.bandwidth import follow
from zrepl_py.replication.order import default_concurrency
from zrepl_py.replication.rsync_target import fallback_directory, replicate_to_directory
from zrepl_py.replication.zfs_target import (
    DatasetOutcome,
    Fallback,
    FallbackResult,
    Transfer,
    replicate_to_zfs_target,
)
from zrepl_py.runtime.cpus import usable_cpus
from zrepl_py.runtime.prefetch import Task, TaskOf
from zrepl_py.snapshots.inventory import Inventory, take_inventory
from zrepl_py.transport.stages import Side
from zrepl_py.values.failover import FailoverMark
from zrepl_py.values.timetable import InForce
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName, SnapshotName
from zrepl_py.zfs.pool_status import PoolReport, pool_report

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TargetResult:
    """One target's outcome: per-dataset plans and bytes, or the error that stopped it."""

    target: str
    method: str
    datasets: list[DatasetOutcome] = dataclasses.field(default_factory=list)
    snapshots_synced: list[str] = dataclasses.field(default_factory=list)
    bytes: int = 0
    error: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ReplicateResult:
    """All targets of one job, and the job's ``bandwidth_limit`` in force when it started
    (None: the job has none at any time)."""

    job: str
    dry_run: bool
    targets: list[TargetResult]
    limit: InForce | None = None

    @property
    def failed(self) -> bool:
        """True when any target failed."""
        return any(t.error for t in self.targets)


def budget_warnings(budget: ProtectionBudget, held: list[tuple[str, dt.datetime, int]],
                    now: dt.datetime) -> list[str]:
    """Warnings when held replication bases exceed the protection budget (pure).

    Args:
        budget: the job's ``protection_budget``.
        held: ``(snapshot name, creation UTC, used bytes)`` of every base held for a target.
        now: aware UTC.
    """
    warnings = []
    if budget.max_age is not None:
        for name, created, _ in held:
            if now - created > budget.max_age:
                warnings.append(f"replication base {name} is held since {created:%Y-%m-%d %H:%MZ}, "
                                f"older than max_age {budget.max_age}: is the target offline?")
    total = sum(used for _, _, used in held)
    if budget.max_bytes is not None and total > budget.max_bytes:
        warnings.append(f"held replication bases pin {total} bytes, over max_bytes "
                        f"{budget.max_bytes}: the source pool cannot free them until the "
                        f"target catches up")
    return warnings


def _held_bases(ctx: Context, job_name: str, target: Endpoint, inventory: Inventory, src: Zfs,
                budget: ProtectionBudget) -> list[tuple[str, dt.datetime, int]]:
    # `used` costs one zfs command per base (0.6 s for a 101-dataset tree on zfs-fuse,
    # benchmarks/replication.py), so it is read only when the budget has a byte limit.
    if budget.max_age is None and budget.max_bytes is None:
        return []
    covered = {str(d.name): d.name for d in inventory.datasets}
    held = []
    for cursor in ctx.catalog().cursors(job_name):
        dataset = covered.get(cursor.source_dataset)
        if cursor.target != str(target) or dataset is None:
            continue
        snaps = {s.short: s for s in inventory.tree.snapshots(dataset)}
        snap = snaps.get(cursor.snapshot_name)
        if snap is not None:
            used = 0
            if budget.max_bytes is not None:
                used = int(src.get_properties(str(snap.name), ["used"])["used"])
            held.append((str(SnapshotName.of(cursor.source_dataset, snap.short)), snap.creation, used))
    return held


def replicate_job(ctx: Context, name: str, job: JobConfig, *, dry_run: bool) -> ReplicateResult:
    """Replicate one job to all its targets (see module doc).

    Raises:
        UsageError: the job has no ``[replicate]`` section.
        Locked: another run holds the job's dataset lock (exit 3).
        SourceMissing: the source dataset or its pool does not exist.
        ZfsError, HostUnreachable, CatalogError: the source could not be listed (every
            target's run is recorded failed; target failures are reported per target in the
            result instead).
        HookFailed: a pre or post replicate hook failed (``zrepl_py.hooks``; they run around
            the run, inside the lock, never in a dry run).
    """
    if job.replicate is None:
        raise UsageError(f"job {name} has no [jobs.{name}.replicate] section in {ctx.config_path}")
    cfg = job.replicate
    source = job.source
    results: list[TargetResult] = []
    with ctx.lock(lock_key(job), "replicate"), contextlib.ExitStack() as stack:
        ctx.start_prefetch(_prefetch_tasks(ctx, job, dry_run=dry_run))  # background: no raise
        catalog = ctx.catalog()  # imports SQLAlchemy: CPU while the prefetch waits on hosts
        hooks = stack.enter_context(ActionHooks(
            job.hooks.get("replicate"), catalog, ctx.clock,
            Facts("replicate", name, source.host, str(source.dataset), tuple(cfg.targets)),
            dry_run=dry_run))
        # Every target's run row is open before the source is listed: a source that cannot
        # be listed fails (and alerts) every target's run instead of leaving no trace.
        runs = None if dry_run else stack.enter_context(
            RunSet(catalog, ctx.clock, name, "replicate", [str(t) for t in cfg.endpoints()]))
        stack.enter_context(source_errors(ctx, name, job))
        src = ctx.zfs(source.host, source.dataset.pool)
        inventory = take_inventory(src, catalog, job, ctx.clock.now(),
                                   replicas=replica_datasets(ctx.config, source.host))
        for target in cfg.endpoints():
            method = "rsync" if target.directory is not None or cfg.method == "rsync" else "zfs"
            result = TargetResult(str(target), method)
            results.append(result)
            try:
                if runs is None:
                    _one_target(ctx, name, job, target, inventory, src, result, dry_run=True)
                    continue
                record = runs.records[str(target)]
                try:
                    _one_target(ctx, name, job, target, inventory, src, result, dry_run=False)
                    record.bytes = result.bytes
                    if result.error:  # diverged datasets; the others were replicated
                        replicated = any(not d.diverged for d in result.datasets)
                        record.result = "partial" if replicated else "failed"
                    held = _held_bases(ctx, name, target, inventory, src, cfg.protection_budget)
                    record.budget = budget_warnings(cfg.protection_budget, held, ctx.clock.now())
                    result.warnings += record.budget
                    problems = ([result.error] if result.error else []) + result.warnings
                    if problems:
                        record.error = "; ".join(problems)
                except BaseException as exc:
                    runs.end(str(target), exc)
                    raise
                runs.end(str(target))
            except ZbakError as exc:
                log.error("job %s: target %s failed: %s", name, target, exc)
                result.error = str(exc)
                if isinstance(exc, FailedOver) and not dry_run:
                    _note_failover(ctx, name, target, exc)
        _tell_hooks(hooks.outcome, inventory, source.dataset, results)
    limit = cfg.bandwidth_limit
    return ReplicateResult(name, dry_run, results,
                           limit.at(ctx.clock.now()) if limit.limited else None)


def _note_failover(ctx: Context, name: str, target: Endpoint, exc: FailedOver) -> None:
    """Record in the catalog the failover whose mark replication met on ``target`` (it may
    have been run from another host), for ``zbak status``; a mark zbak cannot read is left
    to the error that names it."""
    assert target.dataset is not None
    root = exc.marks.get(str(target.dataset)) or sorted(exc.marks.items())[0][1]
    try:
        mark = FailoverMark.parse(root)
    except InvalidName:
        return
    ctx.catalog().record_failover(FailoverRow(name, str(target), str(target.dataset), mark.at,
                                              mark.planned, ctx.clock.now()))


def _tell_hooks(outcome: Outcome, inventory: Inventory, root: DatasetName,
                results: list[TargetResult]) -> None:
    """Fill in the post hook's ``outcome`` (``hooks.environment``) from the targets' results:
    ``partial`` when some target failed, ``failed`` when all did."""
    outcome.datasets = tuple(str(d.name) for d in inventory.datasets)
    newest = inventory.tree.snapshots(root)
    outcome.snapshot = newest[-1].short if newest else None
    outcome.bytes = sum(r.bytes for r in results)
    failed = [r for r in results if r.error]
    outcome.result = ("ok" if not failed else "failed" if len(failed) == len(results)
                      else "partial")
    problems = [f"{r.target}: {r.error}" for r in failed] + [w for r in results for w in r.warnings]
    outcome.error = "; ".join(problems) or None


def _prefetch_tasks(ctx: Context, job: JobConfig, *, dry_run: bool) -> list[Task]:
    """What the run will wait on, to start in the background (``zrepl_py.runtime.prefetch``): the
    shared ssh connections of the data path, each ZFS target's connection and capabilities,
    the source's capabilities, then the pool reads of the health checks."""
    cfg = job.replicate
    assert cfg is not None
    tasks: dict[Hashable, Callable[[], object]] = {}
    zfs_targets = [t for t in cfg.endpoints()
                   if isinstance(t, DatasetEndpoint) and cfg.method != "rsync"]
    for host in [] if dry_run else [job.source.host, *(t.host for t in zfs_targets)]:
        if host in ctx.config.hosts:
            tasks.setdefault(*_master_task(Side.of(ctx.config, host)))
    for target in zfs_targets:
        pool = target.dataset.pool
        tasks[("zfs", target.host, pool)] = functools.partial(ctx.zfs, target.host, pool)
    source = job.source  # its capabilities (a `zpool get all`) while the catalog opens
    tasks.setdefault(("zfs", source.host, source.dataset.pool),
                     lambda: ctx.zfs(source.host, source.dataset.pool))
    for target in [] if dry_run else zfs_targets:
        for task in (_pool_task(ctx, job.source.host, job.source.dataset.pool),
                     _pool_task(ctx, target.host, target.dataset.pool,
                                with_size=needs_size(cfg.min_free))):
            tasks.setdefault(*task)
        if _crosses_ssh(ctx, job, target) and cfg.receive_buffer:
            tasks.setdefault(*_mbuffer_task(ctx, target.host))
    return list(tasks.items())


def _master_task(side: Side) -> TaskOf[Callable[[], None] | None]:
    """The prefetch task starting ``side``'s shared ssh connection (``Side.connect``): it only
    starts the process, so the handshake runs beside the rest of the start-up."""
    return ("ssh master", side.host), side.connect


def _wait_for_master(ctx: Context, side: Side) -> None:
    """Wait until ``side``'s shared ssh connection is up (or failed: the first transfer then
    says why), so the transfers that start at once ride on one connection instead of each
    racing to open its own."""
    if side.control_dir is None:
        return
    waiting = ctx.prefetched(*_master_task(side))
    if waiting is not None:
        waiting()


def _pool_task(ctx: Context, host: str, pool: str, *,
               with_size: bool = False) -> TaskOf[PoolReport]:
    """The prefetch task (``zrepl_py.runtime.prefetch``) of a pool's health report."""
    return (("pool_report", host, pool, with_size),
            lambda: pool_report(ctx.zfs(host), pool, with_size=with_size))


def _pool_report(ctx: Context, host: str, pool: str, *, with_size: bool = False) -> PoolReport:
    """The pool's health report, prefetched if the run started it (``_prefetch_tasks``)."""
    return ctx.prefetched(*_pool_task(ctx, host, pool, with_size=with_size))


def _pool_health(ctx: Context, name: str, job: JobConfig, target: Endpoint) -> list[str]:
    """Health before sending to ``target`` (``zrepl_py.checks.health``): the source pool's
    warnings, then the target pool's and its ``min_free`` floor. A directory target, or a host
    without zpool (method auto falls back to rsync there), has no pool to check.

    Raises:
        InsufficientSpace: the target pool is under the floor (nothing must be sent).
        HostUnreachable, HostKeyMismatch, ZfsError: a pool could not be read.
    """
    now = ctx.clock.now()
    source = job.source
    warnings = source_warnings(_pool_report(ctx, source.host, source.dataset.pool), now)
    if target.dataset is None:
        return warnings
    floor = job.replicate.min_free if job.replicate is not None else None
    try:
        report = _pool_report(ctx, target.host, target.dataset.pool, with_size=needs_size(floor))
    except CommandFailed as exc:
        if exc.returncode == COMMAND_NOT_FOUND:
            return warnings
        raise
    return warnings + target_warnings(report, floor, job=name, target=str(target), now=now)


def _crosses_ssh(ctx: Context, job: JobConfig, target: Endpoint) -> bool:
    return any(host in ctx.config.hosts for host in (job.source.host, target.host))


def _mbuffer_task(ctx: Context, host: str) -> TaskOf[bool]:
    return ("mbuffer", host), lambda: has_mbuffer(ctx.executors().get(host))


def _receive_buffer(ctx: Context, job: JobConfig, target: Endpoint) -> int | None:
    """Bytes of the receive buffer for ``target`` (``transport.stages``), or None: the
    stream stays on this machine, ``receive_buffer`` is 0, or the host has no mbuffer."""
    size = job.replicate.receive_buffer if job.replicate else 0
    if not size or not _crosses_ssh(ctx, job, target):
        return None
    if ctx.prefetched(*_mbuffer_task(ctx, target.host)):
        return size
    log.info("%s has no mbuffer: receiving without a buffer (installing it speeds up "
             "transfers over ssh; receive_buffer = 0 silences this)", target.host)
    return None


def _one_target(ctx: Context, name: str, job: JobConfig, target: Endpoint, inventory: Inventory,
                src: Zfs, result: TargetResult, *, dry_run: bool) -> None:
    cfg = job.replicate
    assert cfg is not None
    if not dry_run:
        result.warnings += _pool_health(ctx, name, job, target)
    source_side, target_side = Side.of(ctx.config, job.source.host), Side.of(ctx.config, target.host)
    directory = target if result.method == "rsync" else None
    if directory is None:
        assert target.dataset is not None
        with ctx.lock(f"target {target}", "replicate"):
            try:
                dst = ctx.zfs(target.host, target.dataset.pool)
            except CommandFailed as exc:
                directory = no_zfs_fallback(job, target, exc)
                if directory is None:
                    raise
                log.warning("%s has no zfs (%s): method auto falls back to rsync into %s",
                            target.host, exc.stderr, directory.directory)
                result.method = "rsync"
                result.warnings.append(
                    f"no zfs on {target.host}: rsync fallback into {directory.directory}")
            else:
                _to_zfs_target(ctx, name, job, target, inventory, src, dst, result,
                               source_side, target_side, dry_run=dry_run)
                return
    synced = replicate_to_directory(
        ctx=ctx, job_name=name, job=job, target=directory, inventory=inventory, src=src,
        target_side=target_side, dry_run=dry_run, cursor_key=str(target),
    )
    result.snapshots_synced, result.bytes = synced.snapshots, synced.bytes
    result.warnings.extend(synced.warnings)


def _to_zfs_target(ctx: Context, name: str, job: JobConfig, target: Endpoint,
                   inventory: Inventory, src: Zfs, dst: Zfs, result: TargetResult,
                   source_side: Side, target_side: Side, *, dry_run: bool) -> None:
    """Replicate to a ZFS target (``zfs_target``) under the job's ``bandwidth_limit``
    (followed as its timetable changes, ``replication.bandwidth.follow``), publishing the run's
    queue and transfers for ``zbak status``."""
    cfg = job.replicate
    assert cfg is not None
    concurrency = cfg.concurrency or default_concurrency(usable_cpus())
    limit = cfg.bandwidth_limit
    rate = SharedRate(limit.at(ctx.clock.now()).limit, concurrency) if limit.limited else None

    def in_force() -> int | None:
        return rate.total if rate is not None else None

    with contextlib.ExitStack() as stack:
        queue = None
        if not dry_run:
            queue = stack.enter_context(Queue(
                Slot(ctx.state_dir, "replicate", name, str(target)),
                [str(info.name) for info in inventory.datasets], limit=in_force))
            if rate is not None:
                stack.enter_context(follow(rate, limit, ctx.clock))
            for side in (source_side, target_side):
                _wait_for_master(ctx, side)
        transfer = Transfer(source_side, target_side, cfg.compression == "zstd", rate,
                            None if dry_run else _receive_buffer(ctx, job, target),
                            cfg.on_divergence,
                            reporting(ctx.state_dir, "replicate", name, str(target),
                                      limit=in_force),
                            threading.Event(), queue)
        fallback = None
        if cfg.method == "auto":
            fallback = _stream_fallback(ctx, name, job, target, inventory, src, dst,
                                        target_side, result)  # fmt: skip
        result.datasets = replicate_to_zfs_target(
            job_name=name, job=job, target=target, inventory=inventory, src=src, dst=dst,
            transfer=transfer, catalog=ctx.catalog(), clock=ctx.clock, dry_run=dry_run,
            fallback=fallback, concurrency=concurrency,
        )
    result.bytes = sum(d.bytes for d in result.datasets)
    diverged = [d.diverged for d in result.datasets if d.diverged]
    if diverged:
        result.error = "; ".join(diverged)
        log.error("job %s: %d dataset(s) diverged on %s: %s", name, len(diverged),
                  target, result.error)


def _stream_fallback(ctx: Context, name: str, job: JobConfig, target: Endpoint,
                     inventory: Inventory, src: Zfs, dst: Zfs, target_side: Side,
                     result: TargetResult) -> Fallback:
    """The method-``auto`` fallback for a dataset whose stream ``target`` rejected: rsync its
    snapshots into ``rsync_target.fallback_directory`` (cursor keyed by the configured
    target) and add a warning naming the receiver's reason to ``result``."""

    def fallback(dataset: DatasetName, target_ds: DatasetName,
                 error: StreamUnsupported) -> FallbackResult:
        """Copy ``dataset`` with rsync where ``target_ds`` would be mounted."""
        directory = fallback_directory(dst, target_ds, (), error)
        reason = error.stderr.strip().splitlines()[-1] if error.stderr.strip() else str(error)
        result.warnings.append(f"{target.host} cannot receive the ZFS stream of {dataset} "
                               f"({reason}): rsync fallback into {directory}")
        synced = replicate_to_directory(
            ctx=ctx, job_name=name, job=job, target=Endpoint(target.host, None, directory),
            inventory=inventory, src=src, target_side=target_side, dry_run=False,
            cursor_key=str(target), dataset=dataset,
        )  # fmt: skip
        result.warnings.extend(synced.warnings)
        result.snapshots_synced.extend(f"{dataset}@{short}" for short in synced.snapshots)
        reached = synced.snapshots[-1] if synced.snapshots else _last_cursor(ctx, name, target,
                                                                             dataset)
        return FallbackResult(synced.bytes or 0, reached, directory)

    return fallback


def _last_cursor(ctx: Context, name: str, target: Endpoint, dataset: DatasetName) -> str | None:
    for cursor in ctx.catalog().cursors(name):
        if cursor.target == str(target) and cursor.source_dataset == str(dataset):
            return cursor.snapshot_name
    return None
