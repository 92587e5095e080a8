"""``zbak archive`` for one job: plan each dataset's chain, write the streams, protect the tip.

Per dataset of the job's tree: list snapshots (one ``zfs get`` for the tree, catalog synced),
plan with ``archive.planner``, write each planned stream with ``archive.writer``, then move
the archive hold (``zbak:<job>:archive:<store>``, plus a bookmark where supported) to the new
chain tip so no pruner can remove the next incremental's base. Leftovers of interrupted runs
whose plan changed (a prefix with ``progress.json`` but no manifest) are deleted first.
A dataset that fails is reported and the others still run.
"""

from __future__ import annotations

import dataclasses
import logging

from zrepl_py.archive.layout import (
    PROGRESS,
    dataset_prefix,
    is_stream_prefix,
    stream_prefix,
)
from zrepl_py.catalog.repository import CarriedSnapshot
from zrepl_py.archive.planner import (
    ArchivePlan,
    ChainPolicy,
    PlannedStream,
    current_chain,
    plan_archive,
)
from zrepl_py.archive.writer import StreamSpec, WrittenStream, delete_prefix, write_stream
from zrepl_py.config.schema import JobConfig
from zrepl_py.context import Context, lock_key
from zrepl_py.errors import UsageError, ZbakError
from zrepl_py.health import before_archive
from zrepl_py.locking import dataset_lock
from zrepl_py.replication.planner import Full, Incremental, SnapRef
from zrepl_py.replication.protect import move_protection
from zrepl_py.replication.stages import Side
from zrepl_py.runs import recorded_run
from zrepl_py.snapshots.inventory import take_inventory
from zrepl_py.stores.base import Backend
from zrepl_py.stores.open import open_store
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName
from zrepl_py.zfs.sendrecv import send_argv

log = logging.getLogger(__name__)


@dataclasses.dataclass
class DatasetArchive:
    """One dataset's plan and what was written (``written`` pairs each planned stream with
    its outcome), or the error that stopped it."""

    dataset: str
    plan: ArchivePlan
    written: list[tuple[PlannedStream, WrittenStream]] = dataclasses.field(default_factory=list)
    error: str | None = None


@dataclasses.dataclass
class ArchiveResult:
    """All datasets of one job."""

    job: str
    store: str
    dry_run: bool
    datasets: list[DatasetArchive]

    @property
    def failed(self) -> bool:
        """True when any dataset failed."""
        return any(d.error for d in self.datasets)

    @property
    def stored_bytes(self) -> int:
        """Bytes stored by this run."""
        return sum(w.stored_bytes for d in self.datasets for _, w in d.written)


def archive_job(ctx: Context, name: str, job: JobConfig, *, force_full: bool = False,
                dry_run: bool = False) -> ArchiveResult:
    """Archive one job's datasets to its store (see the module docstring).

    Raises:
        UsageError: the job has no ``[archive]`` section.
        Locked: another run holds the job's dataset lock (exit 3).
        ZfsError, HostUnreachable, CatalogError, StoreError: listing the source or the store
            failed (per-dataset failures are reported in the result instead).
    """
    if job.archive is None:
        raise UsageError(f"job {name} has no [jobs.{name}.archive] section in {ctx.config_path}")
    cfg = job.archive
    store_cfg = ctx.config.stores[cfg.store]
    classes = cfg.storage_class or store_cfg.storage_class
    policy = ChainPolicy(cfg.full_every, cfg.max_chain_length, cfg.max_chain_bytes)
    source = job.source
    catalog = ctx.catalog()
    results: list[DatasetArchive] = []
    backend = open_store(cfg.store, store_cfg)
    try:
        with dataset_lock(ctx.state_dir, lock_key(job), "archive"):
            zfs = ctx.zfs(source.host, source.dataset.pool)
            health = [] if dry_run else before_archive(ctx, job)  # pool warnings (zrepl_py.health)
            inventory = take_inventory(zfs, catalog, job, ctx.clock.now())
            side = Side.of(ctx.config, source.host)
            for info in inventory.datasets:
                dataset = str(info.name)
                snaps = [CarriedSnapshot(s.short, s.guid, s.createtxg)
                         for s in inventory.tree.snapshots(info.name)]
                streams = catalog.streams(host=source.host, dataset=dataset, store=cfg.store)
                plan = plan_archive(snaps, streams, policy, ctx.clock.now(), force_full=force_full)
                outcome = DatasetArchive(dataset, plan)
                results.append(outcome)
                if dry_run or not plan.streams:
                    continue
                try:
                    with recorded_run(catalog, ctx.clock, name, "archive", f"{cfg.store}:{dataset}") as record:
                        _write_plan(ctx, name, cfg.store, backend, zfs, side, source.host,
                                    info.name, plan, streams, store_cfg.volume_size,
                                    cfg.compression_level, classes, outcome)
                        record.bytes = sum(w.stored_bytes for _, w in outcome.written)
                        record.error = "; ".join(health) or None
                except ZbakError as exc:
                    log.error("job %s: archiving %s failed: %s", name, dataset, exc)
                    outcome.error = str(exc)
    finally:
        backend.close()
    return ArchiveResult(name, cfg.store, dry_run, results)


def _write_plan(ctx: Context, job_name: str, store: str, backend: Backend, zfs: Zfs, side: Side,
                host: str, dataset: DatasetName, plan: ArchivePlan, streams, volume_size: int,
                level: int, classes, outcome: DatasetArchive) -> None:
    """Write the planned streams of one dataset in order and move the archive hold."""
    prefixes = [_prefix(host, dataset, p) for p in plan.streams]
    _clean_stale_uploads(backend, dataset_prefix(host, str(dataset)), keep=set(prefixes),
                         catalogued={s.object_prefix for s in streams})
    chain = current_chain(streams)
    # The hold moves from the current chain's tip, also when a new full starts a new chain:
    # the old chain cannot be continued, so its tip needs no protection any more.
    old_tip = chain[-1].to_name if chain else None
    parent_id = plan.streams[0].parent_id
    caps = zfs.capabilities
    plain = dataclasses.replace(caps, compressed_send=False)
    for planned, prefix in zip(plan.streams, prefixes):
        to = SnapRef(planned.to_snap.name, planned.to_snap.guid, planned.to_snap.createtxg)
        if planned.kind == "full":
            step, flags, parent_id = Full(to), (), None
        else:
            base = SnapRef(planned.from_snap.name, planned.from_snap.guid,
                           planned.from_snap.createtxg)
            step, flags = Incremental(base, to, intermediates=True), ("-I",)
        # Plain streams (no -c/-L/-e): restorable into any pool, whatever its features; zstd
        # compresses anyway.
        argv = send_argv(step, source_dataset=str(dataset), caps=plain, raw=False,
                         zfs=zfs.zfs)
        spec = StreamSpec(
            host=host, dataset=str(dataset), store=store, planned=planned, parent_id=parent_id,
            prefix=prefix, send_stages=tuple(side.wrap([argv], "zfs send")), send_flags=flags,
            volume_size=volume_size, level=level,
            storage_class=classes.full if planned.kind == "full" else classes.incremental,
        )
        written = write_stream(spec, backend, ctx.catalog(), ctx.clock.now)
        outcome.written.append((planned, written))
        parent_id = written.stream_id
        move_protection(zfs, dataset, planned.to_snap.name, planned.to_snap.guid, old_tip,
                        job=job_name, target=f"archive:{store}")
        old_tip = planned.to_snap.name


def _prefix(host: str, dataset: DatasetName, planned: PlannedStream) -> str:
    return stream_prefix(host, str(dataset), to_createtxg=planned.to_snap.createtxg,
                         to_guid=planned.to_snap.guid,
                         from_guid=planned.from_snap.guid if planned.from_snap else None)


def _clean_stale_uploads(backend: Backend, prefix: str, keep: set[str], catalogued: set[str]) -> None:
    """Delete what interrupted runs left under the dataset's ``prefix`` that no plan or catalog
    row accounts for: stream folders neither planned now nor catalogued (a partial upload, or
    a manifest written before its catalog row, whose plan changed), and stale
    ``progress.json`` records next to catalogued streams. Only stream folders directly under
    ``prefix`` are considered: a child dataset's folders are its own."""
    by_stream: dict[str, set[str]] = {}
    for info in backend.list(prefix):
        head, _, leaf = info.key.rpartition("/")
        stream = head + "/"
        if stream[len(prefix):].count("/") == 1 and is_stream_prefix(stream):
            by_stream.setdefault(stream, set()).add(leaf)
    for stream, leaves in by_stream.items():
        if stream in keep:
            continue
        if stream in catalogued:
            if PROGRESS in leaves:
                backend.delete(stream + PROGRESS)
            continue
        log.info("deleting %s, left by an interrupted run whose plan changed", stream)
        delete_prefix(backend, stream)
