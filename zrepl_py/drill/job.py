"""``zbak drill``: prove that each source of a job restores, and record how long it took.

For each source ``drill.plan`` chose (every store holding the job's streams, every ZFS
replica target), under the job's own drill lock (``drill HOST:DATASET``: a drill reads
beside snapshot, replicate and archive runs, and refuses while a prune or ``audit --repair``
holds the job's dataset lock, like a plain audit):

1. leftovers of killed drills below the scratch's parent are destroyed (``drill.scratch``);
2. a store whose newest restorable snapshot is cold (``thaw = true``): every frozen volume
   is asked back in one pass (``restore.thaw.request_thaws``); while any is not readable
   the source is ``pending`` (exit 75) and nothing is restored;
3. the scratch ``PARENT/zbak-drill-<hex>`` is created, and each dataset is restored below
   it by the restore engine (``restore.execute.execute_restore``: volumes verified before
   a byte is received, the received snapshot's guid checked): the seconds this takes are the
   recovery time;
4. the restored snapshot's files are compared with the same snapshot (by guid) on the
   source (``drill.manifest``): both manifests are made where the data is (a replica's copy
   on the replica's host); any difference fails the drill. Where the source snapshot is
   gone, or the copy arrived encrypted without its key, only the guid is checked (said in
   the record);
5. the scratch is destroyed, one name at a time, whatever happened (a scratch that cannot be
   destroyed fails the drill: it holds space; its line comes after what failed the drill
   before, never in its place);
6. the drill is recorded: a row of ``drills`` (when, result, recovery time, bytes,
   datasets, files compared, thaw, why) and a run of action ``drill`` with the source as its
   target, which raises the ``failure`` alert of a failed drill and the ``recovery`` after it
   (``observe.runlog``). A skipped or pending source is a run that ended ``ok`` with why.

Hooks ``[jobs.NAME.hooks.drill]`` run around the whole drill (``zrepl_py.hooks``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Sequence

from zrepl_py.audit.job import refuse_beside_deleters
from zrepl_py.catalog.rows import DrillRow
from zrepl_py.config.jobs import JobConfig
from zrepl_py.drill import manifest, scratch
from zrepl_py.drill.gather import gather_drill
from zrepl_py.drill.plan import STORE, DrillItem, SourcePlan, plan_drill, thaw_text
from zrepl_py.errors import DrillMismatch, ScratchLeft, ThawPending, ZbakError
from zrepl_py.hooks.around import ActionHooks
from zrepl_py.hooks.environment import Facts
from zrepl_py.invocation.context import Context, lock_key
from zrepl_py.observe.runlog import RunSet
from zrepl_py.restore.execute import execute_restore
from zrepl_py.restore.thaw import request_thaws
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName, SnapshotName

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ItemResult:
    """One dataset restored and checked.

    Attributes:
        dataset: the source dataset.
        snapshot: the snapshot restored (its short name).
        into: the scratch dataset it was restored into (destroyed since).
        seconds: how long the restore took.
        bytes: ``referenced`` of the restored snapshot.
        files: files compared with the source, None when none were.
        note: why files were not compared, else None.
    """

    dataset: str
    snapshot: str
    into: str
    seconds: float
    bytes: int
    files: int | None
    note: str | None


@dataclasses.dataclass(frozen=True)
class SourceResult:
    """One source's drill: its record, the datasets done, and the leftovers swept."""

    row: DrillRow
    items: tuple[ItemResult, ...] = ()
    swept: scratch.Swept = scratch.Swept()


@dataclasses.dataclass(frozen=True)
class DrillResult:
    """The drill of one job: one ``SourceResult`` per source, in plan order."""

    job: str
    sources: tuple[SourceResult, ...]

    @property
    def failed(self) -> bool:
        """True when a source's drill failed."""
        return any(s.row.result == "failed" for s in self.sources)

    @property
    def pending(self) -> bool:
        """True when a source waits for a thaw."""
        return any(s.row.result == "pending" for s in self.sources)


def drill_job(ctx: Context, name: str, job: JobConfig, *, from_: str | None = None
              ) -> DrillResult:
    """Drill every source of job ``name`` (or the one ``from_`` names; see the module doc).

    Raises:
        UsageError: ``from_`` names no source of the job.
        Locked: another drill of the job runs, or a prune or ``audit --repair`` holds the
            job's dataset lock (exit 3).
        CatalogError: the catalog cannot be read or written.
        HookFailed: a pre or post drill hook failed.
        (What one source's drill meets is that source's result instead.)
    """
    catalog = ctx.catalog()
    with ctx.lock(f"drill {lock_key(job)}", "drill"):
        refuse_beside_deleters(ctx, job, "drill")
        plan = plan_drill(gather_drill(ctx, name, job, from_))
        labels = [s.label for s in plan.sources]
        facts = Facts("drill", name, job.source.host, str(job.source.dataset), tuple(labels))
        with ActionHooks(job.hooks.get("drill"), catalog, ctx.clock, facts) as hooks, \
                RunSet(catalog, ctx.clock, name, "drill", labels) as runs:
            done = []
            for source in plan.sources:
                result = _drill_source(ctx, name, source)
                catalog.record_drill(result.row)
                record = runs.records[source.label]
                record.bytes = result.row.bytes
                record.result = "failed" if result.row.result == "failed" else "ok"
                record.error = {"ok": None, "failed": result.row.detail}.get(
                    result.row.result, f"{result.row.result}: {result.row.detail}")
                runs.end(source.label)
                done.append(result)
            drilled = DrillResult(name, tuple(done))
            hooks.outcome.result = "failed" if drilled.failed else "ok"
            hooks.outcome.bytes = sum(s.row.bytes for s in done)
            hooks.outcome.datasets = tuple(sorted({i.dataset for s in done for i in s.items}))
            hooks.outcome.error = "; ".join(f"{s.row.source}: {s.row.detail}" for s in done
                                            if s.row.result == "failed") or None
        return drilled


def _program(ctx: Context, host: str) -> str:
    """zbak on ``host`` (``[hosts.NAME] zbak``)."""
    settings = ctx.config.hosts.get(host)
    return settings.zbak if settings is not None else "zbak"


def _row(name: str, source: SourcePlan, started: dt.datetime, ended: dt.datetime, result: str,
         detail: str | None, items: Sequence[ItemResult] = ()) -> DrillRow:
    return DrillRow(
        job=name, source=source.label, kind=source.kind, started_at=started, ended_at=ended,
        result=result, seconds=sum(i.seconds for i in items) if items else None,
        bytes=sum(i.bytes for i in items), datasets=source.datasets,
        files=(sum(i.files for i in items if i.files is not None)
               if any(i.files is not None for i in items) else None),
        snapshot=(items[0].snapshot if items else
                  source.items[0].plan.target.name if source.items else None),
        thaw=thaw_text(source.thaw) if source.thaw is not None else None, detail=detail)


def _drill_source(ctx: Context, name: str, source: SourcePlan) -> SourceResult:
    """Drill one source (steps 1-5 of the module doc); never raises a ``ZbakError``: what
    went wrong is the result's."""
    started = ctx.clock.now()
    if source.skip is not None:
        log.info("drill of job %s: %s skipped: %s", name, source.label, source.skip)
        return SourceResult(_row(name, source, started, ctx.clock.now(), "skipped", source.skip))
    if source.problem is not None or source.scratch is None:
        return SourceResult(_row(name, source, started, ctx.clock.now(), "failed",
                                 source.problem or "nowhere to restore"))
    items: list[ItemResult] = []
    swept = scratch.Swept()
    try:
        zfs = ctx.zfs(source.host, DatasetName(source.scratch).pool)
        swept = scratch.sweep(zfs, source.scratch.rpartition("/")[0])
        if source.kind == STORE and source.thaw is not None:
            waiting = _thaw(ctx, source)
            if waiting:
                return SourceResult(_row(name, source, started, ctx.clock.now(), "pending",
                                         waiting), swept=swept)
        scratch.create(zfs, source.scratch)
        try:
            for item in source.items:
                items.append(_drill_item(ctx, zfs, source, item))
        except BaseException as failed:
            _destroy(zfs, source.scratch, failed)
            raise
        _destroy(zfs, source.scratch)
    except ThawPending as exc:
        return SourceResult(_row(name, source, started, ctx.clock.now(), "pending", str(exc),
                                 items), tuple(items), swept)
    except ZbakError as exc:
        log.error("drill of job %s from %s failed: %s", name, source.label, exc)
        return SourceResult(_row(name, source, started, ctx.clock.now(), "failed", str(exc),
                                 items), tuple(items), swept)
    notes = "; ".join(f"{i.dataset}: {i.note}" for i in items if i.note) or None
    return SourceResult(_row(name, source, started, ctx.clock.now(), "ok", notes, items),
                        tuple(items), swept)


def _thaw(ctx: Context, source: SourcePlan) -> str | None:
    """Ask for every frozen volume of the source's restore paths at once; None when all can
    be read now, else what is waiting and until when."""
    backend, cfg = None, ctx.config.restore
    waiting, ready_by = 0, None
    for item in source.items:
        path = item.plan.chosen.path
        if path is None or item.plan.thaw is None:
            continue
        backend = backend or ctx.store(path.store)
        count, when = request_thaws(backend, ctx.catalog(), path.streams, item.plan.volumes,
                                    cfg, ctx.clock.now())
        waiting += count
        if when is not None:
            ready_by = when if ready_by is None else max(ready_by, when)
    if not waiting:
        return None
    after = f" after {ready_by:%Y-%m-%d %H:%M}Z" if ready_by is not None else " later"
    return (f"{waiting} volume(s) in store {source.label} are thawing (tier {cfg.thaw_tier}):"
            f" the next drill{after} restores them")


def _destroy(zfs: Zfs, name: str, failed: BaseException | None = None) -> None:
    """Destroy the scratch; a failure is the drill's (it holds space until destroyed).

    Args:
        failed: what stopped the drill before, when something did: a scratch that cannot be
            destroyed then is named after it, never in its place.

    Raises:
        ScratchLeft: naming the scratch and what to do (after ``failed``, when given).
    """
    try:
        scratch.destroy(zfs, name)
    except ZbakError as exc:
        first = f"{failed}; " if failed is not None else ""
        raise ScratchLeft(f"{first}the scratch {zfs.host}:{name} could not be destroyed ({exc});"
                          " the next drill destroys it, or zfs destroy its datasets yourself"
                          ) from exc


def _drill_item(ctx: Context, zfs: Zfs, source: SourcePlan, item: DrillItem) -> ItemResult:
    """Restore one dataset into the scratch and compare its files with the source.

    Raises:
        DrillMismatch: the restored files differ from the source's.
        ThawPending, RestoreError, StreamCorrupt, PipelineFailed, DigestError, ZfsError, ...:
            from the restore and the reads.
    """
    plan = item.plan
    began = time.monotonic()
    outcome = execute_restore(ctx, plan)
    seconds = time.monotonic() - began
    restored = SnapshotName.of(DatasetName(plan.into), plan.target.name)
    referenced = zfs.get_properties(str(restored), ["referenced"]).get("referenced", "0")
    size = int(referenced) if referenced.isdigit() else 0
    log.info("drill: %s@%s restored from %s into %s:%s in %.1f s", item.dataset,
             plan.target.name, source.label, source.host, plan.into, seconds)
    note = item.gone
    if outcome.locked:
        note = "it arrived encrypted, its key not loaded: its guid was checked, its files not compared"
    if item.original is None or outcome.locked:
        return ItemResult(item.dataset, plan.target.name, plan.into, seconds, size, None, note)
    copy = manifest.read(zfs, restored, program=_program(ctx, source.host))
    host = plan.host
    original = SnapshotName.of(DatasetName(item.dataset), item.original.name)
    own = manifest.read(ctx.zfs(host), original, program=_program(ctx, host))
    found = manifest.compare(own, copy)
    if not found.same:
        raise DrillMismatch(f"{item.dataset}@{plan.target.name} restored from {source.label}"
                            f" differs from the source: {found.message()}")
    return ItemResult(item.dataset, plan.target.name, plan.into, seconds, size, found.files, None)
