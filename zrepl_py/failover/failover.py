"""``zbak failover JOB``: make the job's replica the live dataset (the driver of
``failover.plan.plan_failover``).

Unplanned (the source is gone): the source is not needed; it is looked at once, and a source
that answers and is writable stops the failover (two writable copies would diverge: make it
read-only, stop it, or use ``--planned``). Planned (``--planned``, the source reachable):
every source dataset of the job is marked and made read-only (``SOURCE_PROPERTY``), a
snapshot is taken and the last incremental sent (``zbak snapshot`` and ``zbak replicate`` of
the one target), and only when every source dataset's newest snapshot is on the replica
does the switch happen: nothing written before it is lost.

The switch is ``failover.replica.ReplicaHost.promote`` of each replica dataset, parents
first, under the job's and the target's locks, then a ``failovers`` row and a ``failover``
run in the catalog (where this host has one: a failover works from any host with the config
and ssh to the target, and a catalog it cannot open only costs the record, which the next
replication from a host that has one makes when it meets the mark).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from zrepl_py.catalog.rows import FailoverRow
from zrepl_py.config.hosts import LOCAL_HOST, DatasetEndpoint
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.schema import replica_datasets
from zrepl_py.errors import CatalogError, UsageError, ZbakError
from zrepl_py.failover.facts import readonly_values, replica_states
from zrepl_py.failover.plan import (
    FailoverFacts,
    FailoverPlan,
    caught_up,
    plan_failover,
)
from zrepl_py.failover.replica import ReplicaHost
from zrepl_py.invocation.context import Context, lock_key
from zrepl_py.observe.runlog import RunRecord, recorded_run
from zrepl_py.snapshots.inventory import list_selection
from zrepl_py.values.failover import SOURCE_PROPERTY, SourceMark
from zrepl_py.zfs.names import DatasetName
from zrepl_py.zfs.steps import SnapRef

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog

log = logging.getLogger(__name__)


class FailoverFailed(ZbakError):
    """A failover could not be done: the message says why and what was changed (a planned
    one that could not catch up leaves the source read-only and the replica as it was)."""


def zfs_target(ctx: Context, name: str, job: JobConfig, wanted: str | None) -> DatasetEndpoint:
    """The ZFS target of ``job`` to fail over to: the only one, or the one ``wanted`` names
    (its host name, or the target as written in ``targets``).

    Raises:
        UsageError: no ``[replicate]``, no ZFS target, several without ``wanted``, or none
            that ``wanted`` names (rsync targets cannot be failed over to).
    """
    where = f"[jobs.{name}.replicate] in {ctx.config_path}"
    if job.replicate is None:
        raise UsageError(f"job {name} has no replica to fail over to (no {where})")
    written = job.replicate.targets
    endpoints = [(text, e) for text, e in zip(written, job.replicate.endpoints(), strict=True)]
    zfs = [(text, e) for text, e in endpoints
           if isinstance(e, DatasetEndpoint) and job.replicate.method != "rsync"]
    if wanted is not None:
        zfs = [(text, e) for text, e in zfs if wanted in (text, str(e), e.host)]
        if not zfs:
            raise UsageError(f"--target {wanted}: not a ZFS target of job {name} ({where}: "
                             f"{', '.join(written)}; rsync targets cannot be failed over to)")
    if not zfs:
        raise UsageError(f"job {name} has no ZFS target ({where}): a directory an rsync "
                         "target fills cannot be failed over to")
    if len(zfs) > 1:
        raise UsageError(f"job {name} has {len(zfs)} ZFS targets: name one with --target "
                         f"({', '.join(text for text, _ in zfs)})")
    found = zfs[0][1]
    assert isinstance(found, DatasetEndpoint)
    return found


def usable_catalog(ctx: Context) -> Catalog | None:
    """The catalog, or None (with a warning) where this host cannot open it: a failover or
    failback from a host without the master's catalog still works, unrecorded."""
    try:
        return ctx.catalog()
    except CatalogError as exc:
        log.warning("not recorded in the catalog (%s): zbak status on this host will not "
                    "show it", exc)
        return None


@contextlib.contextmanager
def maybe_recorded(catalog: Catalog | None, ctx: Context, name: str, action: str,
                   target: str) -> Iterator[RunRecord]:
    """``recorded_run`` where there is a catalog, a bare record otherwise."""
    if catalog is None:
        yield RunRecord()
        return
    with recorded_run(catalog, ctx.clock, name, action, target) as record:
        yield record


def failover_facts(ctx: Context, name: str, job: JobConfig, target: DatasetEndpoint, *,
                   planned: bool) -> FailoverFacts:
    """List the replica side (``failover.facts.replica_states``) for ``plan_failover``.

    Raises:
        HostUnreachable, ZfsError, UsageError: the target could not be read.
    """
    assert job.replicate is not None
    dst = ctx.zfs(target.host, target.dataset.pool)
    return FailoverFacts(
        job=name, target=str(target), replica_root=target.dataset,
        replicas=replica_states(dst, target.dataset, recursive=job.recursive),
        now=ctx.clock.now(), planned=planned,
        failover_mountpoint=job.replicate.failover_mountpoint)


def source_live(ctx: Context, job: JobConfig) -> str | None:
    """Why the source looks live, or None: it answers, its dataset exists and is writable.
    A source that cannot be reached, or whose dataset or pool is gone, is not live."""
    source = job.source
    try:
        props = ctx.zfs(source.host).get_properties(str(source.dataset), ["readonly"])
    except ZbakError as exc:
        log.info("the source %s:%s does not answer (%s): failing over without it",
                 source.host, source.dataset, exc)
        return None
    if props.get("readonly") == "on":
        return None
    return (f"the source {source.host}:{source.dataset} answers and is writable: failing over "
            "now would leave two writable copies. Use zbak failover --planned (it makes the "
            "source read-only and sends what the replica lacks first), or make the source "
            f"read-only (zfs set readonly=on {source.dataset}) or export its pool")


def _freeze_source(ctx: Context, name: str, job: JobConfig) -> list[DatasetName]:
    """Mark every source dataset of the job and make it read-only (planned failover);
    return them, parents first."""
    source = job.source
    src = ctx.zfs(source.host, source.dataset.pool)
    tree, selection, _ = list_selection(src, job, replica_datasets(ctx.config, source.host))
    chosen = [d.name for d in tree.datasets if d.name in set(selection.selected)]
    found = src.dataset_properties(source.dataset, ["readonly", SOURCE_PROPERTY],
                                   recursive=job.recursive)
    readonly_of = readonly_values(src, source.dataset, found, recursive=job.recursive)
    now = ctx.clock.now()
    for dataset in chosen:
        readonly = readonly_of.get(dataset)
        mark = found.get(dataset, {}).get(SOURCE_PROPERTY)
        if mark is None or mark.source != "local":
            own = readonly.value if readonly is not None and readonly.source == "local" else None
            src.set_property(dataset, SOURCE_PROPERTY, SourceMark(now, name, own).value())
        if readonly is None or readonly.value != "on":
            src.set_property(dataset, "readonly", "on")
    return chosen


def _catch_up(ctx: Context, name: str, job: JobConfig, target: DatasetEndpoint) -> None:
    """Snapshot the frozen source and send the last incremental to ``target``; raise
    ``FailoverFailed`` unless every source dataset's newest snapshot is on the replica."""
    from zrepl_py.replication.job import replicate_job
    from zrepl_py.snapshots.job import snapshot_job

    assert job.replicate is not None
    snapshot_job(ctx, name, job)
    targets = [text for text, e in zip(job.replicate.targets, job.replicate.endpoints(),
                                       strict=True) if str(e) == str(target)]
    one = job.model_copy(update={"replicate": job.replicate.model_copy(
        update={"targets": targets})})
    result = replicate_job(ctx, name, one, dry_run=False)
    errors = [t.error for t in result.targets if t.error]
    source = job.source
    src = ctx.zfs(source.host, source.dataset.pool)
    tree, selection, _ = list_selection(src, job, replica_datasets(ctx.config, source.host))
    listed = [(d.name, tuple(SnapRef(s.short, s.guid, s.createtxg)
                             for s in tree.snapshots(d.name)))
              for d in tree.datasets if d.name in set(selection.selected)]
    dst = ctx.zfs(target.host, target.dataset.pool)
    lost = caught_up(listed, replica_states(dst, target.dataset, recursive=job.recursive),
                     source.dataset, target.dataset)
    if errors or lost:
        raise FailoverFailed(
            f"planned failover of job {name}: the replica did not catch up "
            f"({'; '.join(errors + lost)}). Nothing was switched; the source stays read-only "
            f"(zfs inherit readonly and {SOURCE_PROPERTY} on it to go back). Run zbak "
            f"failover {name} --planned again once replication works")


def failover_job(ctx: Context, name: str, job: JobConfig, *, target_name: str | None,
                 planned: bool, dry_run: bool,
                 show: Callable[[FailoverPlan], None]) -> FailoverPlan:
    """Fail job ``name`` over to its replica (see the module doc); ``show`` is called with
    the plan before anything changes (and with the dry run's plan).

    Raises:
        UsageError: no ZFS target, several without ``--target``, a mark of another job.
        FailoverFailed: the plan has problems, the source is live (unplanned), or a
            planned failover could not catch up.
        Locked: another run holds the job's or the target's lock.
        FailoverRefused: the target's zbak serve refused a verb.
        ZfsError, HostUnreachable: a command failed (a rerun continues).
    """
    target = zfs_target(ctx, name, job, target_name)
    facts = failover_facts(ctx, name, job, target, planned=planned)
    plan = plan_failover(facts)
    root_marked = any(r.mark is not None for r in facts.replicas
                      if r.name == target.dataset)
    if plan.problems:
        show(plan)
        raise FailoverFailed("; ".join(plan.problems))
    if not planned and not root_marked and not dry_run:
        live = source_live(ctx, job)
        if live is not None:
            show(plan)
            raise FailoverFailed(live)
    show(plan)
    if dry_run:
        return plan
    catalog = usable_catalog(ctx)
    with maybe_recorded(catalog, ctx, name, "failover", str(target)):
        if planned and not root_marked:
            with ctx.lock(lock_key(job), "failover"):
                _freeze_source(ctx, name, job)
            _catch_up(ctx, name, job, target)
            plan = plan_failover(failover_facts(ctx, name, job, target, planned=True))
        dst = ctx.zfs(target.host, target.dataset.pool)
        host = ReplicaHost(dst, local=target.host == LOCAL_HOST)
        with ctx.lock(lock_key(job), "failover"), ctx.lock(f"target {target}", "failover"):
            for step in plan.promotions:
                if not step.done:
                    log.info("promoting %s: %s", step.dataset, step.where)
                    host.promote(step.dataset, step.mark, step.mountpoint)
        if catalog is not None:
            catalog.record_failover(FailoverRow(
                name, str(target), str(target.dataset), plan.mark.at, plan.mark.planned,
                ctx.clock.now()))
    return plan
