"""``zbak failback JOB``: bring the source back from the live replica (the driver of
``failover.plan.plan_failback``), in this order (docs/design.md#failover-and-failback-orders):

1. each failed-over replica dataset is demoted (read-only first, then unmounted): nothing
   written on it from here on can be lost;
2. it gets a last snapshot (skipped where ``written`` says nothing changed);
3. the source side is prepared: with a kept tree, the source's tree is unmounted and its
   root renamed to the kept name, and each dataset made again as a clone of its kept
   dataset's common snapshot (read-only, marked, left mounted where zfs mounts it) and
   promoted; a source dataset that receives directly is marked (``SOURCE_PROPERTY``) and
   made read-only;
4. each replica dataset's later snapshots are sent to its source dataset (``-I`` from the
   common snapshot: replication's planner and steps, resumable where both sides can);
   steps 3 and 4 go dataset by dataset, parents first;
5. the source datasets the replica lacks go back from the kept tree to their place, and the
   kept datasets are made read-only and ``canmount=noauto`` (never mounted over the live
   ones);
6. the source's newest snapshot is held for the target and the cursor moves (as replication
   settles it), older holds of this target are released;
7. each replica dataset is released (its way-back hold and mark go, children first): a
   replica again, which ``zbak replicate`` updates incrementally;
8. each source dataset goes live: its own readonly and canmount back, mounted, its mark
   cleared (the root's last).

Every step is idempotent, and every run plans from what the datasets say (the replica's
marks, the source's marks, the kept tree), so a run killed anywhere is finished by the next:
the replica is never writable once step 1 ran, the source not before step 8, and nothing
is destroyed. A direct receive that zfs refuses because the source was written after all
(a ZFS without ``written``) makes the driver plan again with that dataset kept aside.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import tenacity

from zrepl_py.catalog.rows import CursorRow, FailoverRow
from zrepl_py.config.hosts import LOCAL_HOST, DatasetEndpoint
from zrepl_py.config.jobs import JobConfig
from zrepl_py.errors import (
    DatasetBusy,
    DatasetExists,
    DatasetNotFound,
    Diverged,
    HoldNotFound,
    InvalidName,
    UsageError,
    ZfsError,
)
from zrepl_py.failover.facts import receiver_limits, replica_states, source_states
from zrepl_py.failover.failover import (
    FailoverFailed,
    maybe_recorded,
    usable_catalog,
    zfs_target,
)
from zrepl_py.failover.plan import (
    DatasetBack,
    FailbackFacts,
    FailbackPlan,
    ReplicaState,
    plan_failback,
)
from zrepl_py.failover.replica import ReplicaHost
from zrepl_py.invocation.context import Context, lock_key
from zrepl_py.observe.transfers import reporting
from zrepl_py.replication.planner import SourceState as SendSource
from zrepl_py.replication.planner import TargetState, plan_replication
from zrepl_py.replication.zfs_target import Transfer, execute_step
from zrepl_py.snapshots.naming import format_short_name
from zrepl_py.transport.stages import Side
from zrepl_py.values.failover import (
    MARK_PROPERTIES,
    MOUNTPOINT_PROPERTY,
    SOURCE_PROPERTY,
    FailoverMark,
    SourceMark,
    kept_name,
)
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName, SnapshotName
from zrepl_py.zfs.properties import NATIVE, ReceiveProperties, is_user_property
from zrepl_py.zfs.protect import BaseMove, hold_tag, move_protection_many
from zrepl_py.zfs.resume import describe_token
from zrepl_py.zfs.steps import SnapRef

log = logging.getLogger(__name__)
RENAME_BUSY_SECONDS = 15.0
"""How long a rename of a just unmounted tree is tried again while zfs calls it busy."""

_NOT_COPIED = frozenset({"readonly", *MARK_PROPERTIES, MOUNTPOINT_PROPERTY})
"""Local properties of a kept dataset its clone does not take: ``readonly`` zbak sets while
the clone is not live and puts the kept dataset's own back at the end (its mark)."""


@dataclasses.dataclass
class FailbackResult:
    """What a failback did.

    Attributes:
        plan: the plan (the last one, when the run planned again).
        bytes: stream bytes sent from the replica to the source.
        snapshot: the replica's last snapshot taken by this run (short name), or None.
    """

    plan: FailbackPlan
    bytes: int = 0
    snapshot: str | None = None


class _Modified(Exception):
    """zfs found a directly receiving source dataset written: plan again with it kept."""

    def __init__(self, rel: str):
        super().__init__(rel)
        self.rel = rel


@dataclasses.dataclass
class _Run:
    """One failback's hosts and clients."""

    ctx: Context
    name: str
    job: JobConfig
    target: DatasetEndpoint
    full: bool
    dst: Zfs = dataclasses.field(init=False)
    """The replica's host."""
    src: Zfs | None = None
    """The source's host (with the pool's capabilities once the pool exists)."""
    replicas: dict[DatasetName, ReplicaState] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dst = self.ctx.zfs(self.target.host, self.target.dataset.pool)

    @property
    def source(self) -> DatasetEndpoint:
        """The job's source."""
        return self.job.source

    def facts(self, modified: frozenset[str]) -> FailbackFacts:
        """List both sides for ``plan_failback``."""
        states = replica_states(self.dst, self.target.dataset, recursive=self.job.recursive)
        self.replicas = {r.name: r for r in states}
        root = self.replicas.get(self.target.dataset)
        source = self.source
        plain = self.ctx.zfs(source.host)
        pool = plain.exists(source.dataset.pool)
        facts = FailbackFacts(self.name, str(self.target), self.target.dataset,
                              source.dataset, states, {}, source_pool=pool, full=self.full,
                              modified=modified)
        if not pool:
            return facts
        self.src = self.ctx.zfs(source.host, source.dataset.pool)
        sources = source_states(self.src, source.dataset)
        kept = {}
        if root is not None and root.mark is not None and "/" in source.dataset:
            kept = source_states(self.src, kept_name(source.dataset, root.mark))
        return dataclasses.replace(facts, sources=sources, kept=kept,
                                   receiver=receiver_limits(self.src, source.dataset.pool))


def failback_job(ctx: Context, name: str, job: JobConfig, *, target_name: str | None,
                 full: bool, dry_run: bool,
                 confirm: Callable[[FailbackPlan], bool]) -> FailbackResult | None:
    """Fail job ``name`` back (see the module doc). ``confirm`` is shown the plan before
    anything changes and says whether to go on (it is the dry run's display too).

    Returns:
        what was done; None when ``confirm`` declined (or a dry run).

    Raises:
        UsageError: nothing to fail back (no mark on the replica or the source), no ZFS
            target, several without ``--target``.
        FailoverFailed: the plan has blockers (a version the source cannot receive, no
            common snapshot without ``--full``, a missing pool): nothing was changed.
        Locked: another run holds the job's or the target's lock.
        FailoverRefused, ZfsError, PipelineFailed, HostUnreachable: a step failed; what
            ran is safe and a rerun continues.
    """
    target = zfs_target(ctx, name, job, target_name)
    run = _Run(ctx, name, job, target, full)
    with ctx.lock(lock_key(job), "failback"), ctx.lock(f"target {target}", "failback"):
        modified: frozenset[str] = frozenset()
        plan = plan_failback(run.facts(modified), now=ctx.clock.now())
        if not plan.datasets:
            if _record_finished(ctx, name, job, target):
                return None
            raise UsageError(f"job {name} is not failed over to {target} (no zbak:failover "
                             f"mark on {target.dataset}, no zbak:failover-source on "
                             f"{job.source.dataset}): nothing to fail back")
        go = confirm(plan)
        if plan.blockers:
            raise FailoverFailed("cannot fail back: " + "; ".join(plan.blockers))
        if dry_run or not go:
            return None
        catalog = usable_catalog(ctx)
        result = FailbackResult(plan)
        with maybe_recorded(catalog, ctx, name, "failback", str(target)) as record:
            while True:
                try:
                    _execute(run, result)
                    break
                except _Modified as exc:
                    log.warning("zfs receive found %s written since its newest snapshot: "
                                "keeping it aside as the plan said",
                                job.source.dataset.child(exc.rel))
                    modified |= {exc.rel}
                    result.plan = plan_failback(run.facts(modified), now=ctx.clock.now())
                    if result.plan.blockers:
                        raise FailoverFailed("cannot fail back: "
                                             + "; ".join(result.plan.blockers)) from None
            record.bytes = result.bytes
            if catalog is not None and plan.mark is not None:
                catalog.end_failover(FailoverRow(
                    name, str(target), str(target.dataset), plan.mark.at, plan.mark.planned,
                    ctx.clock.now()), ctx.clock.now(),
                    str(result.plan.kept_root) if result.plan.kept_root else None)
            elif plan.finishing:  # the replica's mark is gone: the killed run's row is open
                _record_finished(ctx, name, job, target)
    return result


def _record_finished(ctx: Context, name: str, job: JobConfig, target: DatasetEndpoint) -> bool:
    """Whether the failover of ``target`` the catalog knows last is failed back, while no
    mark on either side says it is failed over: a failback killed after its last zfs step
    (the source root's mark cleared), before or after its record
    (docs/failover.md#when-a-failover-or-failback-is-killed). A row still open is recorded
    as failed back now, naming its kept tree where it exists.

    Raises:
        ZfsError, HostUnreachable: the source could not be read.
    """
    catalog = usable_catalog(ctx)
    if catalog is None:
        return False
    rows = [r for r in catalog.failovers(name) if r.target == str(target)]
    if not rows:
        return False
    row = rows[-1]
    if row.failed_back_at is not None:
        log.warning("the failover of job %s to %s at %s was failed back at %s: nothing left "
                    "to do", name, target, f"{row.failed_over_at:%Y-%m-%d %H:%M:%SZ}",
                    f"{row.failed_back_at:%Y-%m-%d %H:%M:%SZ}")
        return True
    try:
        kept: str | None = str(kept_name(job.source.dataset,
                                         FailoverMark(row.failed_over_at, name)))
    except InvalidName:  # a pool's root dataset: nothing was kept
        kept = None
    src = ctx.zfs(job.source.host, job.source.dataset.pool)
    found = kept if kept is not None and src.exists(kept) else None
    log.warning("the failover of job %s to %s at %s is failed back (no mark on either side "
                "says otherwise) but was not recorded so: a failback stopped before its "
                "record; recorded now%s", name, target,
                f"{row.failed_over_at:%Y-%m-%d %H:%M:%SZ}",
                f", the source as it was kept as {found}" if found else "")
    catalog.end_failover(row, ctx.clock.now(), found)
    return True


def _execute(run: _Run, result: FailbackResult) -> None:
    """Carry out ``result.plan`` (steps 1-8 of the module doc)."""
    plan = result.plan
    # The replica datasets still to demote, snapshot and send: the marked ones, and those
    # made on the live replica after the failover (unmarked, sent whole).
    marked = [b for b in plan.datasets
              if (replica := run.replicas.get(b.replica)) is not None
              and (replica.mark is not None or b.action == "full")]
    host = ReplicaHost(run.dst, local=run.target.host == LOCAL_HOST)
    if not plan.finishing:
        for back in reversed(marked):
            host.demote(back.replica)
        if result.snapshot is None:
            result.snapshot = _last_snapshot(run, marked)
        assert run.src is not None
        if plan.rename and plan.kept_root is not None:
            _unmount_tree(run.src, plan.source_root)
            log.info("keeping %s as %s", plan.source_root, plan.kept_root)
            _rename_unmounted(run.src, plan.source_root, plan.kept_root)
        transfer = _transfer(run)
        for back in plan.datasets:
            _prepare(run.src, back)
            if back in marked:
                result.bytes += _send(run, back, transfer)
        if plan.kept_root is not None:
            _settle_kept(run.src, plan)
        _protect(run, plan)
        for back in reversed(marked):
            host.release(back.replica)
    assert run.src is not None or plan.finishing
    _go_live(run, plan)


def _last_snapshot(run: _Run, marked: list[DatasetBack]) -> str | None:
    """Snapshot every marked replica dataset that may hold unsnapshotted writes (all of
    them where ``written`` is unknown); return the short name, None when none needed it."""
    short = format_short_name(run.job.snapshot.prefix, run.ctx.clock.now())
    taken = None
    for back in marked:
        replica = run.replicas[back.replica]
        if replica.written == 0 and replica.snapshots:
            continue
        try:
            run.dst.snapshot(SnapshotName.of(back.replica, short))
        except DatasetExists:
            pass  # taken by this run before it planned again, or in the same second
        taken = short
    return taken


@tenacity.retry(retry=tenacity.retry_if_exception_type(DatasetBusy), reraise=True,
                stop=tenacity.stop_after_delay(RENAME_BUSY_SECONDS),
                wait=tenacity.wait_exponential(multiplier=0.1, max=1.0))
def _rename_unmounted(zfs: Zfs, old: DatasetName, new: DatasetName) -> None:
    """``zfs rename OLD NEW`` of a tree just unmounted, again while zfs answers "dataset is
    busy" for up to ``RENAME_BUSY_SECONDS``: zfs-fuse can still call a tree busy right after
    its last unmount returned (seen in two of four runs of the failback's whole-cycle test).

    Raises:
        DatasetBusy: still busy after ``RENAME_BUSY_SECONDS``.
        DatasetExists, DatasetNotFound: as ``Zfs.rename``.
    """
    zfs.rename(old, new)


def _unmount_tree(zfs: Zfs, root: DatasetName) -> None:
    """Unmount every mounted filesystem at and below ``root``, children first (zfs-fuse
    renames no mounted dataset; a rename must move an unused tree)."""
    mounted = zfs.dataset_properties(root, ["mounted"], recursive=True)
    for dataset in sorted(mounted, key=lambda d: d.count("/"), reverse=True):
        if mounted[dataset].get("mounted") is not None \
                and mounted[dataset]["mounted"].value == "yes":
            zfs.unmount(dataset)


def _prepare(zfs: Zfs, back: DatasetBack) -> None:
    """Step 3 for one dataset: make its clone, promote it, or mark and freeze it."""
    if back.action == "clone":
        assert back.clone_from is not None and back.mark is not None
        own = zfs.local_properties(back.clone_from.dataset)
        copied = {k: v for k, v in own.items()
                  if k not in _NOT_COPIED and (k in NATIVE or is_user_property(k))}
        left = sorted(set(own) - set(copied) - _NOT_COPIED)
        if left:
            log.warning("%s: not copied to its clone (set them by hand if they matter): %s",
                        back.clone_from.dataset, ", ".join(left))
        log.info("making %s again from %s", back.source, back.clone_from)
        # Read-only until it goes live; left mounted where zfs mounts it (zfs-fuse mounts
        # every clone): a child's clone made below an unmounted parent would leave its
        # mountpoint directory in the grandparent, which then refuses the parent's mount.
        zfs.clone(back.clone_from, back.source,
                  {**copied, "readonly": "on", SOURCE_PROPERTY: back.mark.value()})
    if back.action in ("clone", "promote"):
        zfs.promote(back.source)
    if back.freeze and back.mark is not None:
        zfs.set_property(back.source, SOURCE_PROPERTY, back.mark.value())
        zfs.set_property(back.source, "readonly", "on")


def _transfer(run: _Run) -> Transfer:
    cfg = run.job.replicate
    assert cfg is not None
    sides = (Side.of(run.ctx.config, run.target.host), Side.of(run.ctx.config, run.source.host))
    for side in sides:
        waiting = side.connect()
        if waiting is not None:
            waiting()
    return Transfer(sides[0], sides[1], cfg.compression == "zstd", None, None, "stop",
                    reporting(run.ctx.state_dir, "failback", run.name, str(run.target)))


def _send(run: _Run, back: DatasetBack, transfer: Transfer) -> int:
    """Step 4 for one dataset: replication's planner from the replica dataset (the sender)
    to the source dataset, its steps run; return the bytes sent."""
    assert run.src is not None
    sent = run.dst.tree(back.replica, recursive=False)
    snaps = tuple(SnapRef(s.short, s.guid, s.createtxg) for s in sent.snapshots(back.replica))
    sender = SendSource(str(back.replica), snaps, (), run.replicas[back.replica].encrypted)
    try:
        got = run.src.tree(back.source, recursive=False)
        have = tuple(SnapRef(s.short, s.guid, s.createtxg) for s in got.snapshots(back.source))
        exists = True
    except DatasetNotFound:
        have, exists = (), False
        if "/" in back.source:
            parent = DatasetName(back.source.rsplit("/", 1)[0])
            if not run.src.exists(parent):
                run.src.create_filesystem(parent, parents=True)
    token = None
    if exists and run.src.capabilities.resume_tokens:
        raw = run.src.resume_token(back.source)
        if raw:
            token = describe_token(run.dst.executor, raw, zfs=run.dst.zfs)
    plan = plan_replication(sender, TargetState(str(back.source), exists, have, token))
    if plan.diverged:
        raise FailoverFailed(f"cannot send {back.replica} to {back.source}: {plan.diverged}")
    sent_bytes = 0
    for step in plan.steps:
        try:
            sent_bytes += execute_step(step, back.replica, back.source, sender, run.dst,
                                       run.src, transfer, props=ReceiveProperties(),
                                       send_props=False)
        except Diverged:
            if back.action != "receive":
                raise
            raise _Modified(back.rel) from None
    if back.action == "full" and back.mark is None:
        _mark_created(run, back)
    return sent_bytes


def _mark_created(run: _Run, back: DatasetBack) -> None:
    """Mark a source dataset a full stream created (not live until step 8)."""
    assert run.src is not None
    root = run.replicas.get(run.target.dataset)
    at = root.mark.at if root is not None and root.mark is not None else run.ctx.clock.now()
    run.src.set_property(back.source, SOURCE_PROPERTY, SourceMark(at, run.name).value())


def _settle_kept(zfs: Zfs, plan: FailbackPlan) -> None:
    """Step 5: the source's own datasets the replica lacks go back to their place; each
    kept dataset of a replica dataset is made read-only and never mounted automatically."""
    assert plan.kept_root is not None
    for rel in plan.back:
        log.info("moving %s back to %s", plan.kept_root.child(rel), plan.source_root.child(rel))
        _rename_unmounted(zfs, plan.kept_root.child(rel), plan.source_root.child(rel))
    for back in plan.datasets:
        if back.kept_as is None:
            continue
        props = zfs.property_sources([back.kept_as], ["readonly", "canmount", SOURCE_PROPERTY])
        got = props.get(back.kept_as, {})
        if got.get("canmount", ("-", "-"))[0] != "noauto":
            zfs.set_property(back.kept_as, "canmount", "noauto")
        if got.get("readonly", ("-", "-"))[0] != "on":
            zfs.set_property(back.kept_as, "readonly", "on")
        if got.get(SOURCE_PROPERTY, ("-", "-"))[1] == "local":
            zfs.inherit_property(back.kept_as, SOURCE_PROPERTY)


def _protect(run: _Run, plan: FailbackPlan) -> None:
    """Step 6: hold (and bookmark) each source dataset's newest snapshot for the target,
    release this target's hold on the older ones, and move the cursors."""
    assert run.src is not None
    tag = hold_tag(run.name, str(run.target))
    moves, rows = [], []
    now = run.ctx.clock.now()
    for back in plan.datasets:
        tree = run.src.tree(back.source, recursive=False)
        snaps = tree.snapshots(back.source)
        if not snaps:
            continue
        newest = snaps[-1]
        moves.append(BaseMove(back.source, newest.short, newest.guid, None))
        rows.append(CursorRow(run.name, str(run.target), run.source.host, str(back.source),
                              str(back.replica), "zfs", newest.short, newest.guid,
                              newest.createtxg, now))
        for old in snaps[:-1]:
            if old.userrefs:
                try:
                    run.src.release(old.name, tag)
                except (HoldNotFound, DatasetNotFound):
                    pass
    moved = move_protection_many(run.src, moves, job=run.name, target=str(run.target))
    if moved.failed:
        raise next(iter(moved.failed.values()))
    catalog = usable_catalog(run.ctx)
    if catalog is not None:
        catalog.set_cursors([r for r in rows if DatasetName(r.source_dataset) not in moved.failed])


def _go_live(run: _Run, plan: FailbackPlan) -> None:
    """Step 8: each source dataset's own readonly and canmount back, mounted (parents
    first), then the marks cleared (the root's last)."""
    zfs = run.src if run.src is not None else run.ctx.zfs(run.source.host,
                                                          run.source.dataset.pool)
    props = zfs.dataset_properties(
        plan.source_root, ["type", "canmount", "mountpoint", "mounted", SOURCE_PROPERTY],
        recursive=True)
    marked = {b.source: b.mark for b in plan.datasets}
    for dataset in sorted(props, key=lambda d: d.count("/")):
        got = props[dataset]
        mark = marked.get(dataset)
        if mark is None and got.get(SOURCE_PROPERTY) is not None \
                and got[SOURCE_PROPERTY].source == "local":
            mark = SourceMark.parse(got[SOURCE_PROPERTY].value)
        if mark is not None and got.get(SOURCE_PROPERTY, None) is not None \
                and got[SOURCE_PROPERTY].source == "local":
            if mark.readonly is None:
                zfs.inherit_property(dataset, "readonly")
            else:
                zfs.set_property(dataset, "readonly", mark.readonly)
        canmount = got["canmount"].value if "canmount" in got else "-"
        where = got["mountpoint"].value if "mountpoint" in got else "-"
        if got.get("type") is not None and got["type"].value == "filesystem" \
                and canmount == "on" and where.startswith("/") \
                and (got.get("mounted") is None or got["mounted"].value != "yes"):
            try:
                zfs.mount(dataset)
            except ZfsError as exc:
                log.warning("%s is live but could not be mounted at %s: %s", dataset, where,
                            exc)
    for dataset in sorted(props, key=lambda d: d.count("/"), reverse=True):
        value = props[dataset].get(SOURCE_PROPERTY)
        if value is not None and value.source == "local":
            zfs.inherit_property(dataset, SOURCE_PROPERTY)


def describe(plan: FailbackPlan) -> list[tuple[str, str, str, str]]:
    """The plan as rows (replica, source, what, why) for the command's table."""
    rows = []
    if plan.rename and plan.kept_root is not None:
        rows.append(("", str(plan.source_root), f"renamed to {plan.kept_root}",
                     "kept, never destroyed: " + "; ".join(plan.kept_because)))
    for back in plan.datasets:
        what = {"receive": "receives", "clone": "made again (clone, promote), receives",
                "promote": "promoted, receives", "full": "created by a full stream",
                "done": "goes live"}[back.action]
        if back.common is not None and back.action != "done":
            what += f" from @{back.common.name}"
        rows.append((str(back.replica), str(back.source), what, back.why))
    for rel in plan.back:
        assert plan.kept_root is not None
        rows.append(("", str(plan.kept_root.child(rel)), "moved back",
                     f"the replica has no {plan.source_root.child(rel)}: the source's own"))
    return rows

