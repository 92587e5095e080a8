"""``zbak status`` facts per job: last successes, replica lag, archive chains, held bytes,
running runs, transfers in progress, next scheduled runs and the last restore drill per
source.

Everything comes from the catalog and the config (``job_status``, no host dialled) except
the bytes pinned by zbak's holds, which only the source's ZFS knows (``read_held``: one
``zfs get -Hp`` listing of the job's tree). ``zrepl_py.status.metrics`` exports the same facts.

Definitions (all times aware UTC, sizes bytes):

* lag of a target, per source dataset: ``lag_seconds`` is the creation time of the source's
  newest snapshot minus that of the snapshot the target's cursor names (how much newer the
  source's data is), ``lag_snapshots`` the live source snapshots newer than the cursor (by
  createtxg). A target's own figures are the worst of its datasets; ``cursor`` is the root
  dataset's.
* chain: the current chain (``archive.planner.current_chain``) of a dataset in the job's
  store: its streams, full first.
* held bytes: the ``used`` bytes (zfs(8): space freed if that snapshot alone were destroyed)
  of the source snapshots that carry a zbak hold: each replication cursor's snapshot and each
  chain's last snapshot, where ``userrefs`` > 0. A lower bound of what destroying them all
  would free (space shared by two held snapshots counts in neither). The replication part
  counts the cursors' snapshots alone: what ``protection_budget.max_bytes`` limits.
* copies: per ``[jobs.NAME.copy.STORE]``, how far the copy lags (``copying.lag``: the streams
  the store lacks and the next ``zbak copy`` would copy, their bytes, the age of the oldest,
  the newest stream in each store), from the catalog too.
* transfers: what the zbak processes moving bytes right now publish under the state dir
  (``zrepl_py.observe.transfers``): per replication target, archive store or restore, the dataset and
  snapshots sent, bytes so far, expected bytes, rate, ETA, start and PID. Files left by a
  process that is gone are dropped (and removed) and listed as ``stale_transfers``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, TypeVar

from zrepl_py.catalog.chains import current_chain
from zrepl_py.catalog.rows import CursorRow, DrillRow, FailoverRow, RunRow, SnapshotRow, StreamRow
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.schema import Config
from zrepl_py.observe.runlog import sweep_interrupted
from zrepl_py.observe.transfers import (
    QueuedRun,
    RunningTransfer,
    StaleTransfer,
    read_queues,
    read_running,
)
from zrepl_py.status.watch import job_limits
from zrepl_py.values.timetable import InForce

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.copying.lag import CopyLag
    from zrepl_py.invocation.context import Context

N = TypeVar("N", int, float)

Chains = dict[str, tuple[list[StreamRow], list[StreamRow]]]
"""Per dataset: its current chain (full first) and all its streams in the job's store."""

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DatasetLag:
    """How far one source dataset's replica on one target lags (see module doc)."""

    dataset: str
    cursor: str | None
    cursor_time: dt.datetime | None
    lag_seconds: float | None
    lag_snapshots: int | None


@dataclasses.dataclass(frozen=True)
class TargetStatus:
    """One replication target.

    Attributes:
        target: the config's target string.
        cursor / cursor_time: the root dataset's cursor snapshot and its creation time.
        lag_seconds / lag_snapshots: the worst of ``datasets`` (None: never replicated).
        last_success: end of the newest ok replicate run to this target.
        last_result: result of the newest replicate run to this target.
        datasets: one DatasetLag per source dataset with a cursor (the root first).
        failed_over: the target's failover not failed back yet (``catalog.failovers``),
            None while it is a replica.
    """

    target: str
    cursor: str | None
    cursor_time: dt.datetime | None
    lag_seconds: float | None
    lag_snapshots: int | None
    last_success: dt.datetime | None
    last_result: str | None
    datasets: list[DatasetLag]
    failed_over: FailoverRow | None = None


@dataclasses.dataclass(frozen=True)
class ChainStatus:
    """The current archive chain of one dataset in one store.

    Attributes:
        length: streams in the chain, the full included.
        chains: chains of the dataset in the store (not condemned).
        stored_bytes / raw_bytes: the chain's bytes as stored and as zfs sent them.
        full_time: when the chain's full was written.
        newest / newest_time: the chain's last snapshot and when its stream was written.
    """

    dataset: str
    store: str
    length: int
    chains: int
    stored_bytes: int
    raw_bytes: int
    full_time: dt.datetime
    newest: str
    newest_time: dt.datetime


@dataclasses.dataclass(frozen=True)
class RunningRun:
    """A run the catalog shows as still running, with ``seconds`` since it started.

    A zbak killed with SIGKILL leaves such a row behind; it is shown until the next run of the
    same action and target replaces it as the newest.
    """

    action: str
    target: str | None
    started_at: dt.datetime
    seconds: float


@dataclasses.dataclass(frozen=True)
class Success:
    """The newest ok run of one action (and target): when it ended and the bytes it moved."""

    action: str
    target: str | None
    time: dt.datetime
    bytes: int


@dataclasses.dataclass(frozen=True)
class Held:
    """Bytes pinned by zbak's holds on a job's source (see module doc).

    Attributes:
        bytes: the sum of ``used`` of ``snapshots``; None when it could not be read.
        snapshots: the held snapshots (``DATASET@NAME``).
        error: why it could not be read (host down, ...), else None.
        replication_bytes: the part of ``bytes`` pinned by replication cursors (what a
            job's ``protection_budget.max_bytes`` limits); None when not read.
    """

    bytes: int | None
    snapshots: list[str]
    error: str | None = None
    replication_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """One job's state (see module doc for the definitions).

    Attributes:
        snapshots / newest / newest_time: live catalogued snapshots under the source.
        last_runs: the newest run per action and target.
        last_success: the newest ok run per action and target.
        targets: replication targets; chains: archive chains of the job's store.
        held_bytes / held_snapshots / held_error / held_replication_bytes: see ``Held``
            (None: not read, ``--offline``).
        running: runs still marked running.
        next_runs: per scheduled action, the next fire time (UTC) of its cron schedule.
        transfers: transfers in progress now (``zrepl_py.observe.transfers``); stale_transfers: the
            files of this job's transfers whose process is gone (removed when read).
        queues: the queues of this job's running runs (``observe.transfers.QueuedRun``).
        bandwidth_limits: the job's bandwidth limits in force now (``status.watch.job_limits``).
        drills: the newest restore drill of each source (``zrepl_py.drill``);
            drill_successes: the newest that ended ok, per source.
        copies: how far each copy of ``[jobs.NAME.copy.STORE]`` lags (``copying.lag``).
    """

    job: str
    source: str
    snapshots: int
    newest: str | None
    newest_time: dt.datetime | None
    last_runs: list[RunRow]
    last_success: list[Success]
    targets: list[TargetStatus]
    chains: list[ChainStatus]
    held_bytes: int | None
    held_snapshots: list[str] | None
    held_error: str | None
    running: list[RunningRun]
    next_runs: dict[str, dt.datetime | None]
    transfers: list[RunningTransfer] = dataclasses.field(default_factory=list)
    stale_transfers: list[StaleTransfer] = dataclasses.field(default_factory=list)
    queues: list[QueuedRun] = dataclasses.field(default_factory=list)
    bandwidth_limits: dict[str, InForce] = dataclasses.field(default_factory=dict)
    drills: list[DrillRow] = dataclasses.field(default_factory=list)
    drill_successes: list[DrillRow] = dataclasses.field(default_factory=list)
    held_replication_bytes: int | None = None
    copies: list[CopyLag] = dataclasses.field(default_factory=list)


def job_schedules(job: JobConfig) -> dict[str, str | None]:
    """The cron schedule (UTC) of every action ``job`` configures: ``snapshot`` always,
    ``replicate``/``archive`` when their sections exist, and any other section of the job
    that has a ``schedule`` (e.g. prune, audit); None where the schedule is switched off."""
    found: dict[str, str | None] = {}
    for field in type(job).model_fields:
        section = getattr(job, field)
        if hasattr(section, "schedule"):
            found[field] = section.schedule
    return found


def next_fire(schedule: str | None, now: dt.datetime) -> dt.datetime | None:
    """The first fire time of the crontab line ``schedule`` (UTC) at or after ``now``; None
    for no schedule (see ``crontab_trigger``)."""
    if schedule is None:
        return None
    from zrepl_py.daemon.crontab import crontab_trigger  # APScheduler: only for a schedule

    return crontab_trigger(schedule).get_next_fire_time(None, now)


def scheduled_runs(config: Config, now: dt.datetime) -> dict[str, dict[str, dt.datetime | None]]:
    """Per job, per action the daemon schedules (``daemon.plan.plan_entries``: job schedules,
    ``[daemon] prune_schedule``/``audit_schedule``, ``every``), the next fire time (UTC)."""
    from zrepl_py.daemon.plan import make_trigger, plan_entries

    found: dict[str, dict[str, dt.datetime | None]] = {name: {} for name in config.jobs}
    for entry in plan_entries(config):
        trigger = make_trigger(entry)
        found[entry.job][entry.action] = trigger.get_next_fire_time(None, now)
    return found


def _lag(dataset: str, cursor: CursorRow | None, snaps: list[SnapshotRow],
         by_guid: dict[int, SnapshotRow]) -> DatasetLag:
    if cursor is None:
        return DatasetLag(dataset, None, None, None, None)
    base = by_guid.get(cursor.guid)
    newer = [s for s in snaps if s.createtxg > cursor.createtxg]
    lag = None
    if base is not None:
        newest = snaps[-1].creation if snaps else base.creation
        lag = max(0.0, (newest - base.creation).total_seconds())
    return DatasetLag(dataset, cursor.snapshot_name, base.creation if base else None, lag,
                      len(newer))


def _worst(values: Sequence[N | None]) -> N | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _target_status(target: str, root: str, cursors: list[CursorRow],
                   live: dict[str, list[SnapshotRow]],
                   by_guid: dict[str, dict[int, SnapshotRow]],
                   last_ok: RunRow | None, last: RunRow | None,
                   left_out: Collection[str] = ()) -> TargetStatus:
    mine = sorted((c for c in cursors if c.target == target and c.source_dataset not in left_out),
                  key=lambda c: (c.source_dataset != root, c.source_dataset))
    if root not in left_out and not any(c.source_dataset == root for c in mine):
        mine_lags = [DatasetLag(root, None, None, None, None)]
    else:
        mine_lags = []
    for cursor in mine:
        snaps = live.get(cursor.source_dataset, [])
        mine_lags.append(_lag(cursor.source_dataset, cursor, snaps,
                              by_guid.get(cursor.source_dataset, {})))
    # The root's row heads the target; a selection that leaves the root out (``[select]``
    # on a pool) is headed by its first selected dataset.
    head = next((d for d in mine_lags if d.dataset == root), None) or next(
        iter(mine_lags), DatasetLag(root, None, None, None, None))
    return TargetStatus(
        target=target, cursor=head.cursor, cursor_time=head.cursor_time,
        lag_seconds=_worst([d.lag_seconds for d in mine_lags]) if head.cursor else None,
        lag_snapshots=_worst([d.lag_snapshots for d in mine_lags]) if head.cursor else None,
        last_success=(last_ok.ended_at or last_ok.started_at) if last_ok else None,
        last_result=last.result if last else None, datasets=mine_lags,
    )


def current_chains(catalog: Catalog, job: JobConfig) -> Chains:
    """Per dataset at or below the job's dataset with streams in the job's store: its
    current chain (``catalog.chains.current_chain``, full first) and all its streams there
    (one bulk read); empty without ``[archive]``."""
    if job.archive is None:
        return {}
    source = job.source
    by_dataset: dict[str, list[StreamRow]] = {}
    for stream in catalog.bulk_streams(host=source.host, below=str(source.dataset),
                                       store=job.archive.store):
        by_dataset.setdefault(stream.dataset, []).append(stream)
    return {dataset: (current_chain(rows), rows) for dataset, rows in by_dataset.items()}


def _chains(found: Chains, store: str) -> list[ChainStatus]:
    chains = []
    for dataset, (chain, rows) in sorted(found.items()):
        if not chain:
            continue
        fulls = [s for s in rows if s.kind == "full" and s.state != "condemned"]
        chains.append(ChainStatus(
            dataset=dataset, store=store, length=len(chain), chains=len(fulls),
            stored_bytes=sum(s.stored_bytes for s in chain),
            raw_bytes=sum(s.raw_bytes for s in chain), full_time=chain[0].created_at,
            newest=chain[-1].to_name, newest_time=chain[-1].uploaded_at or chain[-1].created_at,
        ))
    return chains


def _below(dataset: str, root: str) -> bool:
    return dataset == root or dataset.startswith(root.rstrip("/") + "/")


def job_status(catalog: Catalog, name: str, job: JobConfig, now: dt.datetime, *,
               held: Held | None = None,
               next_runs: dict[str, dt.datetime | None] | None = None,
               left_out: Collection[str] = (), chains: Chains | None = None) -> JobStatus:
    """Summarise one job from the catalog (no host is dialled); ``now`` is aware UTC.

    ``held`` comes from ``read_held`` (None: left out, e.g. ``zbak status --offline``);
    ``next_runs`` from ``scheduled_runs`` (None: from the job's own schedules only);
    ``left_out`` names datasets below the root the job's selection leaves out
    (``snapshots.inventory.left_out_now``), which the summary then leaves out too;
    ``chains`` from ``current_chains`` (None: read here).

    Raises:
        CatalogError: the catalog cannot be read.
    """
    source = job.source
    root = str(source.dataset)
    live: dict[str, list[SnapshotRow]] = {}
    for snap in catalog.snapshots(host=source.host, below=root):
        if snap.dataset not in left_out:
            live.setdefault(snap.dataset, []).append(snap)
    # The root's newest; without one (left out, or skipped by min_change) the newest of the
    # tree (createtxg counts pool-wide).
    root_snaps = live.get(root) or sorted((s for rows in live.values() for s in rows),
                                          key=lambda s: s.createtxg)
    newest = root_snaps[-1] if root_snaps else None
    last_runs = catalog.last_runs(name)
    cursors = [c for c in catalog.cursors(name) if c.source_host == source.host]
    # The cursors' snapshots, destroyed ones too (the lag is measured from them).
    by_guid: dict[str, dict[int, SnapshotRow]] = {}
    for snap in catalog.snapshots_by_guid((c.source_host, c.source_dataset, c.guid)
                                          for c in cursors):
        by_guid.setdefault(snap.dataset, {})[snap.guid] = snap
    ok = {}
    for action in sorted({r.action for r in last_runs}):
        ok.update({(action, t): r for (_, t), r in catalog.last_successes(action, name).items()})
    latest = {(r.action, r.target): r for r in last_runs}
    live_failovers = {f.target: f for f in catalog.failovers(name) if f.failed_back_at is None}
    targets = [dataclasses.replace(
        _target_status(t, root, cursors, live, by_guid, ok.get(("replicate", t)),
                       latest.get(("replicate", t)), left_out),
        failed_over=live_failovers.get(str(endpoint)))
        for t, endpoint in zip(job.replicate.targets if job.replicate else [],
                               job.replicate.endpoints() if job.replicate else [], strict=True)]
    if chains is None:
        chains = current_chains(catalog, job)
    chains = {d: found for d, found in chains.items() if d not in left_out}
    return JobStatus(
        job=name,
        source=str(source),
        snapshots=sum(len(v) for v in live.values()),
        newest=newest.name if newest else None,
        newest_time=newest.creation if newest else None,
        last_runs=last_runs,
        last_success=sorted((Success(a, t, r.ended_at or r.started_at, r.bytes)
                             for (a, t), r in ok.items()),
                            key=lambda s: (s.action, s.target or "")),
        targets=targets,
        chains=_chains(chains, job.archive.store) if job.archive is not None else [],
        held_bytes=held.bytes if held else None,
        held_snapshots=held.snapshots if held else None,
        held_error=held.error if held else None,
        held_replication_bytes=held.replication_bytes if held else None,
        running=[RunningRun(r.action, r.target, r.started_at,
                            max(0.0, (now - r.started_at).total_seconds()))
                 for r in last_runs if r.result == "running"],
        next_runs=(next_runs if next_runs is not None else
                   {a: next_fire(s, now) for a, s in job_schedules(job).items()}),
        drills=catalog.last_drills(name),
        drill_successes=catalog.last_drill_successes(name),
        copies=_copy_lags(catalog, job, now),
    )


def _copy_lags(catalog: Catalog, job: JobConfig, now: dt.datetime) -> list[CopyLag]:
    """``copying.lag.copy_lags``; its modules (the retention planners) are loaded for a job
    with copies only (docs/decisions.md#commands-start-in-under-300-ms)."""
    if not job.copies:
        return []
    from zrepl_py.copying.lag import copy_lags

    return copy_lags(catalog, job, now)


def _cursor_guids(catalog: Catalog, name: str, job: JobConfig) -> set[tuple[str, int]]:
    """``(dataset, guid)`` of the source snapshots ``job``'s replication cursors name."""
    source = job.source
    root = str(source.dataset)
    return {(c.source_dataset, c.guid) for c in catalog.cursors(name)
            if c.source_host == source.host and _below(c.source_dataset, root)}


def held_guids(catalog: Catalog, name: str, job: JobConfig,
               chains: Chains | None = None) -> set[tuple[str, int]]:
    """``(dataset, guid)`` of every source snapshot zbak holds for ``job``: the replication
    cursors' snapshots and the last snapshot of each current archive chain (``chains``
    from ``current_chains``; None: read here)."""
    found = _cursor_guids(catalog, name, job)
    if chains is None:
        chains = current_chains(catalog, job)
    found.update((dataset, chain[-1].to_guid) for dataset, (chain, _) in chains.items()
                 if chain)
    return found


def read_held(ctx: Context, name: str, job: JobConfig, chains: Chains | None = None) -> Held:
    """Read the bytes zbak's holds pin on ``job``'s source (see module doc).

    One ``zfs get -Hp -r|-d 1 -o name,property,value guid,userrefs,used ROOT`` on the source
    host (zfs-fuse includes snapshots in ``get -r``; ``-p`` gives exact bytes). Never raises
    for the host: a failure comes back as ``Held(None, [], error)``.

    Args:
        ctx: the ``zrepl_py.invocation.context.Context`` (its executors and catalog are used).
        chains: ``current_chains`` of the job (None: read here).
    """
    from zrepl_py.checks.source import source_errors
    from zrepl_py.errors import SourceMissing, ZbakError
    from zrepl_py.zfs.client import parse_get_output
    from zrepl_py.zfs.model import ListingError

    source = job.source
    wanted = held_guids(ctx.catalog(), name, job, chains)
    if not wanted:
        return Held(0, [], replication_bytes=0)
    cfg = ctx.config.hosts.get(source.host)
    argv = [cfg.zfs if cfg else "zfs", "get", "-Hp", *(["-r"] if job.recursive else ["-d", "1"]),
            "-o", "name,property,value", "guid,userrefs,used", str(source.dataset)]
    try:
        with source_errors(ctx, name, job):
            done = ctx.executors().get(source.host).run(argv, check=True, timeout=120)
        rows = parse_get_output(done.text)
    except SourceMissing as exc:
        return Held(None, [], str(exc))
    except (ZbakError, ListingError) as exc:
        return Held(None, [], f"cannot read held bytes on {source.host}: {exc}")
    cursors = _cursor_guids(ctx.catalog(), name, job)
    total, replication, names = 0, 0, []
    for snap, props in rows:
        dataset, at, _ = snap.partition("@")
        if not at or not props.get("guid", "").isdigit():
            continue
        key = (dataset, int(props["guid"]))
        if key in wanted and props.get("userrefs", "0") not in ("0", "-"):
            used = int(props["used"]) if props.get("used", "").isdigit() else 0
            total += used
            replication += used if key in cursors else 0
            names.append(snap)
    return Held(total, names, replication_bytes=replication)


def _left_out(ctx: Context, name: str, job: JobConfig) -> tuple[str, ...]:
    """What the selection of a job with ``[select]`` leaves out now (one listing of the
    source); () for other jobs, and when the source does not answer (then logged)."""
    from zrepl_py.config.schema import replica_datasets
    from zrepl_py.errors import ZbakError
    from zrepl_py.snapshots.inventory import left_out_now

    if job.select is None:
        return ()
    source = job.source
    try:
        return left_out_now(ctx.zfs(source.host, source.dataset.pool), job,
                            replica_datasets(ctx.config, source.host))
    except ZbakError as exc:
        log.warning("job %s: cannot read its selection on %s (%s): its status covers every"
                    " dataset below %s", name, source.host, exc, source.dataset)
        return ()


def job_statuses(ctx: Context, names: Sequence[str] = (), *, offline: bool = False) -> list[JobStatus]:
    """``job_status`` of each named job (all when empty), held bytes read unless ``offline``,
    with its transfers in progress (``transfers.read_running``: stale files are removed, logged
    as warnings and listed in ``stale_transfers``). Runs left ``running`` by processes of
    this host that are gone are ended ``interrupted`` first (``runlog.sweep_interrupted``).
    A config without jobs has nothing to show: the catalog is not opened
    (docs/decisions.md#commands-start-in-under-300-ms: SQLAlchemy alone costs about 0.2 s of CPU,
    paid by every monitoring probe of such a host), so its schema is not checked and no run is
    swept.

    Raises:
        UsageError: an unknown job name.
        CatalogError: the catalog cannot be read.
    """
    chosen = ctx.select_jobs(names)
    transfers, stale = read_running(ctx.state_dir)
    queues = read_queues(ctx.state_dir)
    for gone in stale:
        log.warning("dropped stale transfer file %s: %s", gone.path, gone.reason)
    if not chosen:
        return []
    catalog, now = ctx.catalog(), ctx.clock.now()
    sweep_interrupted(catalog, ctx.clock)
    upcoming = scheduled_runs(ctx.config, now)
    found = []
    for name, job in chosen:
        chains = current_chains(catalog, job)  # read once for the held bytes and the status
        held = None if offline else read_held(ctx, name, job, chains)
        left_out = () if offline else _left_out(ctx, name, job)
        state = job_status(catalog, name, job, now, held=held, next_runs=upcoming[name],
                           left_out=left_out, chains=chains)
        found.append(dataclasses.replace(
            state, transfers=[t for t in transfers if t.job == name],
            stale_transfers=[g for g in stale if g.transfer and g.transfer.job == name],
            queues=[q for q in queues if q.job == name],
            bandwidth_limits=job_limits(ctx.config, name, now)))
    return found
