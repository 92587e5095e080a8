"""``zbak archive`` for one job: plan each dataset's chain, write the streams, protect the tip.

Once per run for the job's whole tree (docs/decisions.md#an-archive-run-reads-its-tree-once): the
snapshots (one ``zfs get``, catalog synced), the catalog's streams and volume rows of the tree in
the store (one read each) and one listing of the tree in the store (``_Tree``; a dataset's part is
listed again once that is ``RELIST_AFTER`` old). Per dataset: check the current chain's objects
against that listing (``archive.damage``; a stream that lost a volume is marked ``bad`` with an
alert event, and the planner starts a new full), plan with ``archive.planner``, write each planned
stream with ``archive.writer`` (which asks the store only for what the listing showed at the
stream's prefix), then move the archive hold (``zbak:<job>:archive:<store>``, plus a
bookmark where supported) to the new chain tip so no pruner can remove the next
incremental's base. Leftovers of interrupted runs
whose plan changed (a prefix with ``progress.json`` but no manifest) are deleted first; a
folder the catalog does not know is never deleted otherwise (it may hold history a lost
catalog forgot).
A dataset that fails is reported and the others still run.

Before anything, the store's catalog exports are checked against this machine's high-water
marks (``catalog.export.StoreGuard``: a rolled-back or replaced store stops the run with
``CatalogReplay``); after a run that is not a dry run, the job's export in the store is
rewritten when its rows changed (docs/reliability.md#r25-catalog-rollback-detection and
docs/reliability.md#r26-catalog-metadata-copy-with-checksum).

Encrypted datasets (``encryption`` not ``off``, read for all datasets of the job in one
``zfs get``) are archived raw, ``zfs send -w`` (docs/reliability.md#r38-encrypted-datasets): without
``-w`` an encrypted dataset whose key is loaded is sent DECRYPTED (zfs-send(8) ``-w, --raw``), which
would put plaintext in the store. A host whose ``zfs send`` has no ``-w`` gets
``RawSendUnavailable`` for such a dataset and nothing is sent. The manifest records ``-w``
(``Manifest.raw``); the catalog has no column for it. A chain written decrypted before (its tip's
manifest is not raw) is not continued with raw incrementals, which no ``zfs receive`` could apply on
it: a new raw full starts a new chain.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from zrepl_py.archive.damage import chain_damage, mark_bad
from zrepl_py.archive.planner import ArchivePlan, ChainPolicy, PlannedStream, plan_archive
from zrepl_py.archive.progress import ProgressHome, progress_home
from zrepl_py.archive.rolling_lock import roll_locks
from zrepl_py.archive.throttle import Throttle
from zrepl_py.archive.writer import StreamSpec, WrittenStream, delete_prefix, write_stream
from zrepl_py.catalog.chains import current_chain
from zrepl_py.catalog.export import StoreGuard
from zrepl_py.catalog.rows import StreamRow, VolumeRow, first_three, recorded_versions
from zrepl_py.checks.health import source_warnings
from zrepl_py.checks.source import source_errors
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.schema import replica_datasets
from zrepl_py.errors import (
    ObjectNotFound,
    RawSendUnavailable,
    StorePermanent,
    StreamCorrupt,
    UsageError,
    ZbakError,
)
from zrepl_py.hooks.around import ActionHooks
from zrepl_py.hooks.environment import Facts, Outcome
from zrepl_py.invocation.context import Context, lock_key
from zrepl_py.objects.checked import read_with_copy
from zrepl_py.objects.layout import (
    MANIFEST,
    MANIFEST_COPY,
    PROGRESS,
    dataset_prefix,
    is_stream_prefix,
    stream_prefix,
)
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest
from zrepl_py.objects.versions import as_written
from zrepl_py.observe.runlog import RunSet, recorded_run
from zrepl_py.observe.transfers import Queue, Slot, reporting
from zrepl_py.pruning.archive import store_streams
from zrepl_py.snapshots.inventory import take_inventory
from zrepl_py.stores.base import Backend, ObjectInfo
from zrepl_py.stores.sealing import writing_codec
from zrepl_py.stores.settings import StorageClasses
from zrepl_py.streams.codec import Codec
from zrepl_py.transport.stages import Side
from zrepl_py.zfs.capabilities import Capabilities
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.encryption import probe_encryption
from zrepl_py.zfs.estimate import expected_size
from zrepl_py.zfs.model import SnapshotInfo
from zrepl_py.zfs.names import DatasetName
from zrepl_py.zfs.pool_status import pool_report
from zrepl_py.zfs.protect import move_protection
from zrepl_py.zfs.sendrecv import send_argv
from zrepl_py.zfs.steps import Full, Incremental, SnapRef

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.clock import Clock

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


@dataclasses.dataclass(frozen=True)
class _ArchiveRun:
    """What one archive run of a job shares across its datasets (read once from the context
    and the config)."""

    name: str
    job: JobConfig
    store: str
    backend: Backend
    catalog: Catalog
    clock: Clock
    state_dir: Path
    policy: ChainPolicy
    classes: StorageClasses
    volume_size: int
    codec: Codec
    progress: ProgressHome
    force_full: bool
    dry_run: bool
    throttle: Throttle
    """Paces the uploads under the store's ``bandwidth_limit`` (``archive.throttle``)."""


RELIST_AFTER = dt.timedelta(minutes=10)
"""How old the tree's listing may be when a dataset's chain is checked against it; older
(a run that spent hours on a large full first), the dataset's prefix is listed again, so a
volume lost meanwhile is found before its chain is extended."""


@dataclasses.dataclass
class _Tree:
    """What the catalog and the store hold of the job's tree, read once per run under the
    job's lock (nothing else of zbak writes there meanwhile; a dataset's part of the listing
    is read again when it is older than ``RELIST_AFTER``, see ``refresh``).

    Attributes:
        streams: the catalog's streams in the store by dataset, in chain order.
        volumes: their volume rows by stream id.
        listing: every object under the tree's prefix in the store, by key.
        leaves: the names listed at each directory (``prefix/`` -> names).
        listed_at: when the whole tree was listed (UTC).
    """

    streams: dict[str, list[StreamRow]]
    volumes: Mapping[int, Sequence[VolumeRow]]
    listing: dict[str, ObjectInfo]
    leaves: dict[str, set[str]]
    listed_at: dt.datetime
    _by_dataset: dict[str, dict[str, set[str]]] | None = None  # stream_dirs' index

    @classmethod
    def read(cls, run: _ArchiveRun, host: str, root: str) -> _Tree:
        """Read them (raises ``CatalogError``, ``StoreError``)."""
        streams: dict[str, list[StreamRow]] = {}
        for stream in run.catalog.bulk_streams(host=host, below=root, store=run.store):
            streams.setdefault(stream.dataset, []).append(stream)
        listed_at = run.clock.now()
        prefix = dataset_prefix(host, root)
        listing = {info.key: info for info in run.backend.list(prefix)}
        volumes = run.catalog.bulk_volumes(host=host, below=root, store=run.store)
        listing = _as_written(run.backend, listing, prefix, streams, volumes)
        return cls(streams, volumes, listing, _leaves(listing), listed_at)

    def refresh(self, run: _ArchiveRun, host: str, dataset: str) -> None:
        """List the dataset's prefix (and so its descendants') again when the tree's listing
        is ``RELIST_AFTER`` old (raises ``StoreError``)."""
        if run.clock.now() - self.listed_at < RELIST_AFTER:
            return
        prefix = dataset_prefix(host, dataset)
        log.debug("the store's listing is from %s: listing %s again", self.listed_at, prefix)
        fresh = _as_written(run.backend, {info.key: info for info in run.backend.list(prefix)},
                            prefix, self.streams, self.volumes)
        self.listing = {k: v for k, v in self.listing.items() if not k.startswith(prefix)}
        self.listing.update(fresh)
        self.leaves = {k: v for k, v in self.leaves.items() if not k.startswith(prefix)}
        self.leaves.update(_leaves(fresh))
        self._by_dataset = None


    def stream_dirs(self, prefix: str) -> dict[str, set[str]]:
        """The stream folders directly under the dataset ``prefix`` (``stream prefix/`` ->
        names listed there); one index of the tree, so a tree of many datasets does not
        filter every folder for each dataset."""
        if self._by_dataset is None:
            self._by_dataset = {}
            for stream, names in self.leaves.items():
                if is_stream_prefix(stream):
                    parent = stream[:stream.rstrip("/").rfind("/") + 1]
                    self._by_dataset.setdefault(parent, {})[stream] = names
        return self._by_dataset.get(prefix, {})


def _as_written(backend: Backend, listing: dict[str, ObjectInfo], prefix: str,
                streams: Mapping[str, Sequence[StreamRow]],
                volumes: Mapping[int, Sequence[VolumeRow]]) -> dict[str, ObjectInfo]:
    """``listing`` of ``prefix``, on a write-once store (``Backend.keeps_versions``) with the
    catalogued streams' objects as zbak wrote them (``objects.versions.as_written``): an
    overwrite or a delete marker neither makes the damage check mark a stream bad nor the
    planner upload it again (raises ``StoreError``)."""
    if not backend.keeps_versions:
        return listing
    mine = {s.object_prefix for rows in streams.values() for s in rows
            if s.object_prefix.startswith(prefix)}
    return as_written(backend, listing, [prefix], mine, recorded_versions(volumes))[0]


def _leaves(listing: Mapping[str, ObjectInfo]) -> dict[str, set[str]]:
    """The names listed at each directory of ``listing`` (``prefix/`` -> names)."""
    leaves: dict[str, set[str]] = {}
    for key in listing:
        head, _, leaf = key.rpartition("/")
        leaves.setdefault(head + "/", set()).add(leaf)
    return leaves


@dataclasses.dataclass(frozen=True)
class _Source:
    """The job's source host as this run sends from it: its ZFS client, how its commands are
    run (``Side``), its host name, and its datasets that are encrypted."""

    zfs: Zfs
    side: Side
    host: str
    encrypted: frozenset[DatasetName]


def archive_job(ctx: Context, name: str, job: JobConfig, *, force_full: bool = False,
                dry_run: bool = False) -> ArchiveResult:
    """Archive one job's datasets to its store (see the module docstring).

    Raises:
        UsageError: the job has no ``[archive]`` section.
        Locked: another run holds the job's dataset lock (exit 3).
        CatalogReplay: the store's catalog export is older than this machine wrote, or gone.
        CatalogExportCorrupt: a catalog export and its copy are both damaged.
        SourceMissing: the source dataset or its pool does not exist.
        ZfsError, HostUnreachable, CatalogError, StoreError: listing the source or the store,
            or writing the catalog export, failed (per-dataset failures are reported in the
            result instead). Except for dry runs, the root dataset's run (target
            ``STORE:DATASET``) is recorded before any of these can happen, so each is a
            recorded failed run; that run also covers the root's own streams and ends ``ok``
            when it had none to write.
        HookFailed: a pre or post archive hook failed (``zrepl_py.hooks``; they run around
            the run, inside the lock, never in a dry run).
    """
    if job.archive is None:
        raise UsageError(f"job {name} has no [jobs.{name}.archive] section in {ctx.config_path}")
    cfg = job.archive
    store_cfg = ctx.config.stores[cfg.store]
    backend = ctx.store(cfg.store)
    source = job.source
    run = _ArchiveRun(
        name=name, job=job, store=cfg.store, backend=backend, catalog=ctx.catalog(),
        clock=ctx.clock, state_dir=ctx.state_dir,
        policy=ChainPolicy(cfg.full_every, cfg.max_chain_length, cfg.max_chain_bytes),
        classes=cfg.storage_class or store_cfg.storage_class, volume_size=store_cfg.volume_size,
        codec=writing_codec(cfg.store, store_cfg, cfg.compression_level),
        progress=progress_home(cfg.store, store_cfg.keeps_progress_locally, backend,
                               ctx.state_dir),
        force_full=force_full, dry_run=dry_run,
        throttle=Throttle(store_cfg.bandwidth_limit, ctx.clock))
    root_target = f"{cfg.store}:{source.dataset}"
    results: list[DatasetArchive] = []
    with ctx.lock(lock_key(job), "archive"), \
            contextlib.ExitStack() as stack:
        hooks = stack.enter_context(ActionHooks(
            job.hooks.get("archive"), run.catalog, run.clock,
            Facts("archive", name, source.host, str(source.dataset), (cfg.store,)),
            dry_run=dry_run))
        # The root dataset's run row is open before anything can fail (the store's
        # guard, listing the source): such a failure is a recorded failed run and an
        # alert, not a silent exit 1 (docs/decisions.md#every-failed-action-is-a-recorded-run).
        # Child datasets get their own rows.
        runs = None if dry_run else stack.enter_context(
            RunSet(run.catalog, run.clock, name, "archive", [root_target]))
        stack.enter_context(source_errors(ctx, name, job))
        guard = StoreGuard(run.backend, cfg.store, run.state_dir, job=name)
        guard.check()
        zfs = ctx.zfs(source.host, source.dataset.pool)
        health = [] if dry_run else source_warnings(pool_report(zfs, source.dataset.pool),
                                                    run.clock.now())
        inventory = take_inventory(zfs, run.catalog, job, run.clock.now(),
                                   replicas=replica_datasets(ctx.config, source.host))
        encryption = probe_encryption(zfs, [info.name for info in inventory.datasets])
        sending = _Source(zfs, Side.of(ctx.config, source.host), source.host,
                          encryption.encrypted)
        tree = _Tree.read(run, source.host, str(source.dataset))
        queue = None if dry_run else stack.enter_context(Queue(
            Slot(run.state_dir, "archive", name, cfg.store),
            [str(info.name) for info in inventory.datasets], limit=lambda: run.throttle.limit))
        for info in inventory.datasets:
            if queue is not None:
                queue.started(str(info.name))
            results.append(_archive_dataset(run, sending, info.name,
                                            inventory.tree.snapshots(info.name), runs, health,
                                            tree, root=info.name == source.dataset))
            if queue is not None:
                queue.ended(str(info.name))
        if not dry_run:
            _roll_locks(run, tree, store_cfg.upload_concurrency)
            guard.publish(store_streams(run.catalog, job, cfg.store), run.clock.now())
            guard.extend_lock(run.clock.now())  # a failure fails the run, as _roll_locks'
        result = ArchiveResult(name, cfg.store, dry_run, results)
        _tell_hooks(hooks.outcome, result, str(source.dataset))
    return result


def _roll_locks(run: _ArchiveRun, tree: _Tree, concurrency: int) -> None:
    """Extend the Object Lock of the catalogued volumes retention still wants where it is due
    (``archive.rolling_lock``; the streams written by this run are locked afresh).

    Raises:
        StoreError: an extension failed (the run fails: a lock left to lapse is what the
            rolling lock is for), CatalogError.
    """
    streams = [s for rows in tree.streams.values() for s in rows]
    rolled = roll_locks(run.backend, run.catalog, run.job, streams, tree.volumes,
                        run.clock.now(), concurrency=concurrency)
    if rolled.failed:
        raise StorePermanent(f"store {run.store}: the Object Lock of {len(rolled.failed)}"
                             f" version(s) could not be extended: {first_three(rolled.failed)}",
                             store=run.store)


def _tell_hooks(outcome: Outcome, result: ArchiveResult, root: str) -> None:
    """Fill in the post hook's ``outcome`` (``hooks.environment``): ``partial`` when some
    dataset failed, ``failed`` when all did; the snapshot is the newest one archived of the
    job's dataset."""
    outcome.datasets = tuple(d.dataset for d in result.datasets)
    outcome.bytes = result.stored_bytes
    failed = [d for d in result.datasets if d.error]
    outcome.result = ("ok" if not failed else "failed" if len(failed) == len(result.datasets)
                      else "partial")
    outcome.error = "; ".join(f"{d.dataset}: {d.error}" for d in failed) or None
    written = [p.to_snap.name for d in result.datasets if d.dataset == root for p, _ in d.written]
    outcome.snapshot = written[-1] if written else None


def _archive_dataset(run: _ArchiveRun, source: _Source, dataset: DatasetName,
                     snapshots: Sequence[SnapshotInfo], runs: RunSet | None, health: list[str],
                     tree: _Tree, *, root: bool) -> DatasetArchive:
    """Check, plan and write one dataset's streams. A failure becomes the outcome's error
    (and the dataset's recorded run's), so the job's other datasets still run."""
    name = str(dataset)
    snaps = [CarriedSnapshot(s.short, s.guid, s.createtxg) for s in snapshots]
    streams = tree.streams.get(name, [])
    try:
        tree.refresh(run, source.host, name)
        streams, damaged = _check_chain(run, streams, tree, dataset=name)
    except ZbakError as exc:
        log.error("job %s: checking the chain of %s in store %s failed: %s",
                  run.name, name, run.store, exc)
        return DatasetArchive(name, ArchivePlan((), "not checked"), error=str(exc))
    restart = (_decrypted_chain(run.backend, dataset, streams)
               if dataset in source.encrypted else None)
    plan = plan_archive(snaps, streams, run.policy, run.clock.now(), force_full=run.force_full,
                        new_chain=restart, damaged=damaged, sealed_to=run.codec.sealed_to)
    outcome = DatasetArchive(name, plan)
    target = f"{run.store}:{name}"
    if runs is None or (not plan.streams and not root):
        return outcome
    try:
        with contextlib.ExitStack() as own:
            record = (runs.records[target] if root else
                      own.enter_context(recorded_run(run.catalog, run.clock, run.name,
                                                     "archive", target)))
            try:
                if plan.streams:  # the root's run is recorded also when up to date
                    _write_plan(run, source, dataset, plan, streams, outcome, tree)
            finally:
                record.bytes = sum(w.stored_bytes for _, w in outcome.written)
            record.error = "; ".join(health) or None
    except ZbakError as exc:
        log.error("job %s: archiving %s failed: %s", run.name, name, exc)
        outcome.error = str(exc)
        if root:
            runs.records[target].result = "failed"
            runs.records[target].error = str(exc)
    return outcome


def _check_chain(run: _ArchiveRun, streams: list[StreamRow], tree: _Tree, *,
                 dataset: str) -> tuple[list[StreamRow], dict[int, str]]:
    """Check the current chain's objects before it is extended (``archive.damage``, against
    the tree's listing): mark each stream that lost a volume ``bad`` (not in a dry run) and
    say why.

    Returns:
        the dataset's streams (read again when a state changed) and, for the planner,
        stream id -> what the store lacks of it.

    Raises:
        CatalogError: writing or reading the catalog failed.
    """
    damage = chain_damage(current_chain(streams), tree.volumes, tree.listing)
    marked = False
    for found in damage:
        log.warning("job %s: %s", run.name, found.problem)
        if found.lost and not run.dry_run:
            marked |= mark_bad(run.catalog, found.stream, found.what, run.clock.now(),
                               job=run.name, action="archive")
    if marked:
        first = streams[0]
        streams = run.catalog.streams(host=first.host, dataset=dataset, store=first.store)
    return streams, {d.stream.id: d.problem + (" (marked bad)" if d.lost and not run.dry_run
                                               else "")
                     for d in damage}


def _write_plan(run: _ArchiveRun, source: _Source, dataset: DatasetName, plan: ArchivePlan,
                streams: list[StreamRow], outcome: DatasetArchive, tree: _Tree) -> None:
    """Write the planned streams of one dataset in order and move the archive hold.

    Raises:
        RawSendUnavailable: the dataset is encrypted and the host has no ``zfs send -w``
            (before anything touched the store).
    """
    zfs, encrypted = source.zfs, dataset in source.encrypted
    # Every argv first: an encrypted dataset on a host without -w is refused before the
    # store is touched.
    sends = [archive_send(p, dataset, zfs.capabilities, encrypted=encrypted, zfs=zfs.zfs)
             for p in plan.streams]
    if encrypted:
        log.info("%s is encrypted: archiving it raw (zfs send -w)", dataset)
    prefixes = [_prefix(source.host, dataset, p) for p in plan.streams]
    _clean_stale_uploads(run.backend, run.progress, tree, dataset_prefix(source.host, str(dataset)),
                         keep=set(prefixes), catalogued={s.object_prefix for s in streams})
    chain = current_chain(streams)
    # The hold moves from the current chain's tip, also when a new full starts a new chain:
    # the old chain cannot be continued, so its tip needs no protection any more.
    old_tip = chain[-1].to_name if chain else None
    parent_id = plan.streams[0].parent_id
    for planned, prefix, (argv, flags) in zip(plan.streams, prefixes, sends, strict=True):
        if planned.kind == "full":
            parent_id = None
        spec = StreamSpec(
            host=source.host, dataset=str(dataset), store=run.store, planned=planned,
            parent_id=parent_id, prefix=prefix,
            send_stages=tuple(source.side.wrap([argv], "zfs send")), send_flags=flags,
            volume_size=run.volume_size, codec=run.codec,
            storage_class=(run.classes.full if planned.kind == "full"
                           else run.classes.incremental),
        )
        expected = expected_size(zfs, argv, full=(f"{dataset}@{planned.to_snap.name}"
                                                  if planned.kind == "full" else None))
        with reporting(run.state_dir, "archive", run.name, run.store,  # for zbak status
                       limit=lambda: run.throttle.limit)(
                f"{dataset}@{planned.to_snap.name} -> {run.store}", expected.bytes,
                dataset=str(dataset), expected_source=expected.source,
                from_snap=planned.from_snap.name if planned.from_snap else None,
                to_snap=planned.to_snap.name) as progress:
            written = write_stream(spec, run.backend, run.catalog, run.clock.now,
                                   progress=progress, listed=tree.leaves.get(prefix, set()),
                                   home=run.progress, throttle=run.throttle)
        outcome.written.append((planned, written))
        parent_id = written.stream_id
        move_protection(zfs, dataset, planned.to_snap.name, planned.to_snap.guid, old_tip,
                        job=run.name, target=f"archive:{run.store}")
        old_tip = planned.to_snap.name


def archive_send(planned: PlannedStream, dataset: DatasetName, caps: Capabilities, *,
                 encrypted: bool, zfs: str = "zfs") -> tuple[list[str], tuple[str, ...]]:
    """The ``zfs send`` argv of one planned stream and the send flags its manifest records
    (pure).

    Unencrypted: plain streams (no ``-c/-L/-e``), restorable into any pool whatever its
    features (zstd compresses anyway): ``zfs send DS@to`` or ``zfs send -I DS@from DS@to``,
    flags ``()`` or ``("-I",)``. Encrypted: ``zfs send -w ...`` (``-w`` implies ``-L -e -c``,
    zfs-send(8)), flags ``("-w",)`` or ``("-w", "-I")``.

    Args:
        planned: the stream (kind, from/to snapshots).
        dataset: the source dataset the short names belong to.
        caps: the sending host's capabilities.
        encrypted: the dataset's ``encryption`` is not ``off`` (``zfs.encryption``).
        zfs: the zfs command on the sending host.

    Raises:
        RawSendUnavailable: ``encrypted`` and ``caps.raw_send`` is False
            (docs/reliability.md#r38-encrypted-datasets: never archive an encrypted dataset
            decrypted).
        InvalidName: a name breaks the ZFS naming rules.
    """
    if encrypted and not caps.raw_send:
        raise RawSendUnavailable(
            f"{dataset} is encrypted, but zfs send on its host has no -w (raw send): refusing"
            " to archive it decrypted. Upgrade that host's ZFS to OpenZFS 0.8 or later"
            " (`zbak init` shows the features found)")
    to = SnapRef(planned.to_snap.name, planned.to_snap.guid, planned.to_snap.createtxg)
    step: Full | Incremental
    flags: tuple[str, ...]
    if planned.kind == "full":
        step, flags = Full(to), ()
    else:
        start = planned.from_snap
        assert start is not None  # the planner gives every incremental its base
        base = SnapRef(start.name, start.guid, start.createtxg)
        step, flags = Incremental(base, to, intermediates=True), ("-I",)
    plain = dataclasses.replace(caps, compressed_send=False)
    argv = send_argv(step, source_dataset=str(dataset), caps=plain, raw=encrypted, zfs=zfs)
    return argv, (("-w",) + flags if encrypted else flags)


def _decrypted_chain(backend: Backend, dataset: DatasetName, streams: Sequence[StreamRow]
                     ) -> str | None:
    """Why an encrypted dataset's current chain must not be continued, or None: its tip was
    archived without ``-w`` (before docs/reliability.md#r38-encrypted-datasets), and a raw
    incremental cannot be received on a dataset received from a non-raw stream (zfs-receive(8)), or
    the tip's manifest cannot be read to tell. One small read (the manifest is STANDARD class)."""
    chain = current_chain(streams)
    if not chain:
        return None
    key = chain[-1].object_prefix + MANIFEST
    try:
        manifest = read_with_copy(backend, key, Manifest.from_json, StreamCorrupt).value
    except (ObjectNotFound, StreamCorrupt) as exc:
        return (f"{dataset} is encrypted and the chain's tip manifest {key} cannot be read"
                f" ({exc}): a new raw chain starts")
    if manifest.raw:
        return None
    return (f"{dataset} is encrypted but its chain was archived decrypted (without"
            " zfs send -w): a new raw chain starts")


def _prefix(host: str, dataset: DatasetName, planned: PlannedStream) -> str:
    return stream_prefix(host, str(dataset), to_createtxg=planned.to_snap.createtxg,
                         to_guid=planned.to_snap.guid,
                         from_guid=planned.from_snap.guid if planned.from_snap else None)


def _clean_stale_uploads(backend: Backend, home: ProgressHome, tree: _Tree, prefix: str,
                         keep: set[str], catalogued: set[str]) -> None:
    """Delete what interrupted runs left under the dataset's ``prefix`` (as the tree's listing
    shows it): stream folders
    neither planned now nor catalogued that are this machine's own unfinished uploads (a
    ``progress.json``, or volumes without a manifest: killed before its first progress
    record), and stale progress records of catalogued streams (in the store, and in
    ``home`` when it is this host's). Only stream folders directly under ``prefix`` are
    considered: a child dataset's are its own.

    Never deleted (docs/decisions.md#archive-clean-up-never-deletes-a-finished-stream): a
    folder holding a manifest and no ``progress.json`` (a finished stream the catalog does
    not know), and anything at all when the catalog knows no stream of the dataset here
    while the store holds some (the catalog was lost or replaced). Those are named in a
    warning; ``zbak catalog rebuild STORE --merge`` adopts what it can.
    """
    for stream, leaves in tree.stream_dirs(prefix).items():
        if stream in keep:
            continue
        if stream in catalogued:
            if PROGRESS in leaves:
                backend.delete(stream + PROGRESS)
            if home.may_hold(stream, leaves):
                home.delete(stream)
            continue
        unfinished = PROGRESS in leaves or not leaves & {MANIFEST, MANIFEST_COPY}
        if unfinished and catalogued:
            log.info("deleting %s, left by an interrupted run whose plan changed", stream)
            delete_prefix(backend, stream, dt.datetime.now(dt.UTC))
            home.delete(stream)
        else:
            log.warning("%s is in the store but not in the catalog: kept (run `zbak catalog"
                        " rebuild STORE --merge` to adopt it, `zbak audit` to see what it holds)",
                        stream)
