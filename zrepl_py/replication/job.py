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
from collections.abc import Callable, Hashable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from zrepl_py.catalog.rows import FailoverRow
from zrepl_py.checks.health import needs_size, source_warnings, target_warnings
from zrepl_py.checks.source import source_errors
from zrepl_py.config.hosts import DatasetEndpoint, Endpoint
from zrepl_py.config.jobs import JobConfig, no_zfs_fallback
from zrepl_py.config.replicate import ProtectionBudget, ReplicateConfig
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
from zrepl_py.proc.executor import COMMAND_NOT_FOUND, Executor
from zrepl_py.proc.mbuffer import has_mbuffer
from zrepl_py.proc.ratelimit import SharedRate
from zrepl_py.replication.bandwidth import follow
from zrepl_py.replication.order import default_concurrency
from zrepl_py.replication.rsync_target import (
    DirectoryOutcome,
    fallback_directory,
    replicate_to_directory,
)
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

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.clock import Clock

log = logging.getLogger(__name__)
T = TypeVar("T")


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


def _held_bases(run: _ReplicateRun, target: Endpoint, inventory: Inventory, src: Zfs,
                budget: ProtectionBudget) -> list[tuple[str, dt.datetime, int]]:
    # `used` costs one zfs command per base (0.6 s for a 101-dataset tree on zfs-fuse,
    # benchmarks/replication.py), so it is read only when the budget has a byte limit.
    if budget.max_age is None and budget.max_bytes is None:
        return []
    covered = {str(d.name): d.name for d in inventory.datasets}
    held = []
    for cursor in run.catalog.cursors(run.name):
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


class _Prefetched(Protocol):
    """``Context.prefetched``: the prefetched result for a key, else ``compute()``."""

    def __call__(self, key: Hashable, compute: Callable[[], T]) -> T: ...


@dataclasses.dataclass(frozen=True)
class _ReplicateRun:
    """What one replication run of a job shares across its targets, read once from the
    context and the config (as archive's run is)."""

    name: str
    job: JobConfig
    cfg: ReplicateConfig
    catalog: Catalog
    clock: Clock
    state_dir: Path
    sides: Mapping[str, Side]
    """The ``Side`` of the source host and of every target host, by host name."""
    zfs: Callable[[str, str | None], Zfs]
    """``Context.zfs``: a host's ZFS client, with the pool's capabilities (None: none probed)."""
    executor: Callable[[str], Executor]
    """A host's executor, from the context's one pool (its ssh connection opens on first use)."""
    lock: Callable[[str, str], AbstractContextManager[object]]
    """``Context.lock``: a lock key held for an action (the targets' own locks)."""
    prefetched: _Prefetched
    dry_run: bool


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
        sides = {host: Side.of(ctx.config, host)
                 for host in [source.host, *(t.host for t in cfg.endpoints())]}
        executor = ctx.executors().get
        ctx.start_prefetch(_prefetch_tasks(job, sides, ctx.zfs, executor,
                                           dry_run=dry_run))  # background: no raise
        run = _ReplicateRun(
            name=name, job=job, cfg=cfg,
            catalog=ctx.catalog(),  # imports SQLAlchemy: CPU while the prefetch waits on hosts
            clock=ctx.clock, state_dir=ctx.state_dir, sides=sides, zfs=ctx.zfs,
            executor=executor, lock=ctx.lock, prefetched=ctx.prefetched, dry_run=dry_run)
        hooks = stack.enter_context(ActionHooks(
            job.hooks.get("replicate"), run.catalog, run.clock,
            Facts("replicate", name, source.host, str(source.dataset), tuple(cfg.targets)),
            dry_run=dry_run))
        # Every target's run row is open before the source is listed: a source that cannot
        # be listed fails (and alerts) every target's run instead of leaving no trace.
        runs = None if dry_run else stack.enter_context(
            RunSet(run.catalog, run.clock, name, "replicate", [str(t) for t in cfg.endpoints()]))
        stack.enter_context(source_errors(ctx, name, job))
        src = run.zfs(source.host, source.dataset.pool)
        inventory = take_inventory(src, run.catalog, job, run.clock.now(),
                                   replicas=replica_datasets(ctx.config, source.host))
        for target in cfg.endpoints():
            method = "rsync" if target.directory is not None or cfg.method == "rsync" else "zfs"
            result = TargetResult(str(target), method)
            results.append(result)
            try:
                if runs is None:
                    _one_target(run, target, inventory, src, result)
                    continue
                record = runs.records[str(target)]
                try:
                    _one_target(run, target, inventory, src, result)
                    record.bytes = result.bytes
                    if result.error:  # diverged datasets; the others were replicated
                        replicated = any(not d.diverged for d in result.datasets)
                        record.result = "partial" if replicated else "failed"
                    held = _held_bases(run, target, inventory, src, cfg.protection_budget)
                    record.budget = budget_warnings(cfg.protection_budget, held, run.clock.now())
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
                    _note_failover(run, target, exc)
        _tell_hooks(hooks.outcome, inventory, source.dataset, results)
    limit = cfg.bandwidth_limit
    return ReplicateResult(name, dry_run, results,
                           limit.at(ctx.clock.now()) if limit.limited else None)


def _note_failover(run: _ReplicateRun, target: Endpoint, exc: FailedOver) -> None:
    """Record in the catalog the failover whose mark replication met on ``target`` (it may
    have been run from another host), for ``zbak status``; a mark zbak cannot read is left
    to the error that names it."""
    assert target.dataset is not None
    root = exc.marks.get(str(target.dataset)) or sorted(exc.marks.items())[0][1]
    try:
        mark = FailoverMark.parse(root)
    except InvalidName:
        return
    run.catalog.record_failover(FailoverRow(run.name, str(target), str(target.dataset), mark.at,
                                            mark.planned, run.clock.now()))


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


def _prefetch_tasks(job: JobConfig, sides: Mapping[str, Side], zfs: Callable[[str, str | None], Zfs],
                    executor: Callable[[str], Executor], *, dry_run: bool) -> list[Task]:
    """What the run will wait on, to start in the background (``zrepl_py.runtime.prefetch``): the
    shared ssh connections of the data path, each ZFS target's connection and capabilities,
    the source's capabilities, then the pool reads of the health checks."""
    cfg = job.replicate
    assert cfg is not None
    tasks: dict[Hashable, Callable[[], object]] = {}
    zfs_targets = [t for t in cfg.endpoints()
                   if isinstance(t, DatasetEndpoint) and cfg.method != "rsync"]
    for host in [] if dry_run else [job.source.host, *(t.host for t in zfs_targets)]:
        if sides[host].config is not None:
            tasks.setdefault(*_master_task(sides[host]))
    for target in zfs_targets:
        pool = target.dataset.pool
        tasks[("zfs", target.host, pool)] = functools.partial(zfs, target.host, pool)
    source = job.source  # its capabilities (a `zpool get all`) while the catalog opens
    tasks.setdefault(("zfs", source.host, source.dataset.pool),
                     lambda: zfs(source.host, source.dataset.pool))
    for target in [] if dry_run else zfs_targets:
        for task in (_pool_task(zfs, job.source.host, job.source.dataset.pool),
                     _pool_task(zfs, target.host, target.dataset.pool,
                                with_size=needs_size(cfg.min_free))):
            tasks.setdefault(*task)
        if _crosses_ssh(sides, job, target) and cfg.receive_buffer:
            tasks.setdefault(*_mbuffer_task(executor, target.host))
    return list(tasks.items())


def _master_task(side: Side) -> TaskOf[Callable[[], None] | None]:
    """The prefetch task starting ``side``'s shared ssh connection (``Side.connect``): it only
    starts the process, so the handshake runs beside the rest of the start-up."""
    return ("ssh master", side.host), side.connect


def _wait_for_master(run: _ReplicateRun, side: Side) -> None:
    """Wait until ``side``'s shared ssh connection is up (or failed: the first transfer then
    says why), so the transfers that start at once ride on one connection instead of each
    racing to open its own."""
    if side.control_dir is None:
        return
    waiting = run.prefetched(*_master_task(side))
    if waiting is not None:
        waiting()


def _pool_task(zfs: Callable[[str, str | None], Zfs], host: str, pool: str, *,
               with_size: bool = False) -> TaskOf[PoolReport]:
    """The prefetch task (``zrepl_py.runtime.prefetch``) of a pool's health report (read
    with a client that probes no capabilities)."""
    return (("pool_report", host, pool, with_size),
            lambda: pool_report(zfs(host, None), pool, with_size=with_size))


def _pool_report(run: _ReplicateRun, host: str, pool: str, *,
                 with_size: bool = False) -> PoolReport:
    """The pool's health report, prefetched if the run started it (``_prefetch_tasks``)."""
    return run.prefetched(*_pool_task(run.zfs, host, pool, with_size=with_size))


def _pool_health(run: _ReplicateRun, target: Endpoint) -> list[str]:
    """Health before sending to ``target`` (``zrepl_py.checks.health``): the source pool's
    warnings, then the target pool's and its ``min_free`` floor. A directory target, or a host
    without zpool (method auto falls back to rsync there), has no pool to check.

    Raises:
        InsufficientSpace: the target pool is under the floor (nothing must be sent).
        HostUnreachable, HostKeyMismatch, ZfsError: a pool could not be read.
    """
    now = run.clock.now()
    source = run.job.source
    warnings = source_warnings(_pool_report(run, source.host, source.dataset.pool), now)
    if target.dataset is None:
        return warnings
    floor = run.cfg.min_free
    try:
        report = _pool_report(run, target.host, target.dataset.pool, with_size=needs_size(floor))
    except CommandFailed as exc:
        if exc.returncode == COMMAND_NOT_FOUND:
            return warnings
        raise
    return warnings + target_warnings(report, floor, job=run.name, target=str(target), now=now)


def _crosses_ssh(sides: Mapping[str, Side], job: JobConfig, target: Endpoint) -> bool:
    return any(sides[host].config is not None for host in (job.source.host, target.host))


def _mbuffer_task(executor: Callable[[str], Executor], host: str) -> TaskOf[bool]:
    return ("mbuffer", host), lambda: has_mbuffer(executor(host))


def _receive_buffer(run: _ReplicateRun, target: Endpoint) -> int | None:
    """Bytes of the receive buffer for ``target`` (``transport.stages``), or None: the
    stream stays on this machine, ``receive_buffer`` is 0, or the host has no mbuffer."""
    size = run.cfg.receive_buffer
    if not size or not _crosses_ssh(run.sides, run.job, target):
        return None
    if run.prefetched(*_mbuffer_task(run.executor, target.host)):
        return size
    log.info("%s has no mbuffer: receiving without a buffer (installing it speeds up "
             "transfers over ssh; receive_buffer = 0 silences this)", target.host)
    return None


def _one_target(run: _ReplicateRun, target: Endpoint, inventory: Inventory, src: Zfs,
                result: TargetResult) -> None:
    if not run.dry_run:
        result.warnings += _pool_health(run, target)
    source_side, target_side = run.sides[run.job.source.host], run.sides[target.host]
    directory = target if result.method == "rsync" else None
    if directory is None:
        assert target.dataset is not None
        with run.lock(f"target {target}", "replicate"):
            try:
                dst = run.zfs(target.host, target.dataset.pool)
            except CommandFailed as exc:
                directory = no_zfs_fallback(run.job, target, exc)
                if directory is None:
                    raise
                log.warning("%s has no zfs (%s): method auto falls back to rsync into %s",
                            target.host, exc.stderr, directory.directory)
                result.method = "rsync"
                result.warnings.append(
                    f"no zfs on {target.host}: rsync fallback into {directory.directory}")
            else:
                _to_zfs_target(run, target, inventory, src, dst, result,
                               source_side, target_side)
                return
    synced = _to_directory(run, directory, inventory, src, target_side, dry_run=run.dry_run,
                           cursor_key=str(target))
    result.snapshots_synced, result.bytes = synced.snapshots, synced.bytes
    result.warnings.extend(synced.warnings)


def _to_directory(run: _ReplicateRun, target: Endpoint, inventory: Inventory, src: Zfs,
                  target_side: Side, *, dry_run: bool, cursor_key: str,
                  dataset: DatasetName | None = None) -> DirectoryOutcome:
    """``rsync_target.replicate_to_directory`` under the directory target's lock."""
    with run.lock(f"target {target}", "replicate"):
        return replicate_to_directory(
            catalog=run.catalog, clock=run.clock, state_dir=run.state_dir,
            executor=run.executor(target.host), job_name=run.name, job=run.job, target=target,
            inventory=inventory, src=src, target_side=target_side, dry_run=dry_run,
            cursor_key=cursor_key, dataset=dataset,
        )


def _to_zfs_target(run: _ReplicateRun, target: Endpoint, inventory: Inventory, src: Zfs,
                   dst: Zfs, result: TargetResult, source_side: Side, target_side: Side) -> None:
    """Replicate to a ZFS target (``zfs_target``) under the job's ``bandwidth_limit``
    (followed as its timetable changes, ``replication.bandwidth.follow``), publishing the run's
    queue and transfers for ``zbak status``."""
    cfg, name = run.cfg, run.name
    concurrency = cfg.concurrency or default_concurrency(usable_cpus())
    limit = cfg.bandwidth_limit
    rate = SharedRate(limit.at(run.clock.now()).limit, concurrency) if limit.limited else None

    def in_force() -> int | None:
        return rate.total if rate is not None else None

    with contextlib.ExitStack() as stack:
        queue = None
        if not run.dry_run:
            queue = stack.enter_context(Queue(
                Slot(run.state_dir, "replicate", name, str(target)),
                [str(info.name) for info in inventory.datasets], limit=in_force))
            if rate is not None:
                stack.enter_context(follow(rate, limit, run.clock))
            for side in (source_side, target_side):
                _wait_for_master(run, side)
        transfer = Transfer(source_side, target_side, cfg.compression == "zstd", rate,
                            None if run.dry_run else _receive_buffer(run, target),
                            cfg.on_divergence,
                            reporting(run.state_dir, "replicate", name, str(target),
                                      limit=in_force),
                            threading.Event(), queue)
        fallback = None
        if cfg.method == "auto":
            fallback = _stream_fallback(run, target, inventory, src, dst, target_side, result)
        result.datasets = replicate_to_zfs_target(
            job_name=name, job=run.job, target=target, inventory=inventory, src=src, dst=dst,
            transfer=transfer, catalog=run.catalog, clock=run.clock, dry_run=run.dry_run,
            fallback=fallback, concurrency=concurrency,
        )
    result.bytes = sum(d.bytes for d in result.datasets)
    diverged = [d.diverged for d in result.datasets if d.diverged]
    if diverged:
        result.error = "; ".join(diverged)
        log.error("job %s: %d dataset(s) diverged on %s: %s", name, len(diverged),
                  target, result.error)


def _stream_fallback(run: _ReplicateRun, target: Endpoint, inventory: Inventory, src: Zfs,
                     dst: Zfs, target_side: Side, result: TargetResult) -> Fallback:
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
        synced = _to_directory(run, Endpoint(target.host, None, directory), inventory, src,
                               target_side, dry_run=False, cursor_key=str(target),
                               dataset=dataset)
        result.warnings.extend(synced.warnings)
        result.snapshots_synced.extend(f"{dataset}@{short}" for short in synced.snapshots)
        reached = synced.snapshots[-1] if synced.snapshots else _last_cursor(run, target,
                                                                             dataset)
        return FallbackResult(synced.bytes or 0, reached, directory)

    return fallback


def _last_cursor(run: _ReplicateRun, target: Endpoint, dataset: DatasetName) -> str | None:
    for cursor in run.catalog.cursors(run.name):
        if cursor.target == str(target) and cursor.source_dataset == str(dataset):
            return cursor.snapshot_name
    return None
