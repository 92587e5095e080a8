"""Replicate a job's datasets to one ZFS target: list both sides, plan (pure), execute.

Per target: one listing of the target tree; then the covered datasets are replicated
``concurrency`` at a time (``runtime.fanout``), each in a worker thread that plans it (its
listing, the pure planner) and runs its steps' pipelines in order, a dataset whose target
does not exist yet only after the dataset above it (``replication.order``: its receive needs
the parent). The run's own thread settles what the workers finished, in batches, while the
next transfers go on (``replication.settle``): the target's guid of each received snapshot,
the source's holds and bookmarks, the cursors. Two workers never touch one dataset: each
dataset is one piece of work, and its target dataset is its alone.

A diverged dataset is left untouched and reported in its outcome
(``DatasetOutcome.diverged``) while the other datasets go on
(docs/decisions.md#one-diverged-dataset-does-not-stop-its-tree). A failed transfer stops the target:
no dataset starts after it, those running finish and are settled (every snapshot received keeps its
cursor), and the error is raised; the failed dataset's cursor stays where it was, so the next run
re-plans from what the target really has.

Replica properties (``[replicate] properties``, ``zfs.properties``): where the receiving zfs
takes ``-o``/``-x`` (OpenZFS), streams carry the dataset's properties (``send -p``) and each
receive sets and excludes the job's ones; after the last step the replica is read back with
the guid check and what zfs did not apply is repaired (``ReceiveProperties.fixes``: ``-x``
misses, openzfs/zfs#17240). A target without them (zfs-fuse, pool v23) gets no properties
from the stream (nothing could keep the source's mountpoint or shares off the backup host)
and the set ones with ``zfs set`` when the full receive that created the replica (``-u``:
mounted nowhere) is settled.

The receive buffer (``Transfer.receive_buffer``, ``transport.stages``) is for streams long
enough to arrive in bursts: a job of several datasets reads, in one ``zfs get`` on the source,
what each stores (``usedbydataset`` + ``usedbysnapshots``), and a dataset storing less than
``SMALL_DATASET`` bytes is received without one. Its remote side is then the ``zfs receive``
alone, a shell and an mbuffer fewer: the first replication of a tree of 101 datasets of 4 KiB
took 2.35 s instead of 2.57 s (median of 5, zfs-fuse over sshd on 127.0.0.1,
benchmarks/replication.py's test bed), while streams of 2 to 32 MiB took as long with the
buffer as without (median of 7: the buffer pays off on longer ones).

A stream the target's ZFS rejects as unsupported (``StreamUnsupported``: zfs-fuse receiving
any OpenZFS 2.x stream, a pool without a feature the stream needs) is handed to the
caller's ``fallback`` for that dataset (method ``auto``: rsync), and the next datasets go on
with ZFS streams; without a fallback (method ``zfs``) it stops the target. Every run tries the
ZFS stream first, so a target whose ZFS was upgraded goes back to receiving streams.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from zrepl_py.catalog.rows import CursorRow
from zrepl_py.clock import Clock
from zrepl_py.config.hosts import Endpoint
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.replicate import SnapshotFilter
from zrepl_py.errors import (
    DatasetNotFound,
    Diverged,
    PipelineFailed,
    StreamUnsupported,
    TargetModified,
    ZbakError,
    ZfsError,
)
from zrepl_py.proc.pipeline import PipelineResult, run_pipeline
from zrepl_py.proc.ratelimit import SharedRate
from zrepl_py.replication.failed_over import failed_over, failed_over_error, refuse_failed_over
from zrepl_py.replication.order import prerequisites
from zrepl_py.replication.planner import Plan, SourceState, TargetState, plan_replication
from zrepl_py.replication.settle import Arrival, Settler
from zrepl_py.runtime.fanout import Finished, fan_out
from zrepl_py.snapshots.inventory import Inventory
from zrepl_py.snapshots.naming import is_own
from zrepl_py.transport.stages import Side, metered_transfer
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.encryption import probe_encryption
from zrepl_py.zfs.errors import receive_refusal
from zrepl_py.zfs.estimate import expected_size
from zrepl_py.zfs.model import DatasetInfo, Tree
from zrepl_py.zfs.names import DatasetName, SnapshotName
from zrepl_py.zfs.properties import ReceiveProperties
from zrepl_py.zfs.resume import describe_token
from zrepl_py.zfs.sendrecv import receive_argv, send_argv
from zrepl_py.zfs.steps import (
    AbortResume,
    BookmarkRef,
    Full,
    Incremental,
    Resume,
    Rollback,
    SnapRef,
    Step,
)

if TYPE_CHECKING:  # SQLAlchemy loads with the catalog, while the run's SSH prefetch goes on
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.observe.transfers import Queue

log = logging.getLogger(__name__)



SMALL_DATASET = 16 * 1024 * 1024
"""Bytes a dataset stores (its data and snapshots, not its children) below which its streams
go without the receive buffer (see the module doc)."""


@dataclasses.dataclass
class DatasetOutcome:
    """What happened to one dataset: the plan, bytes sent, and the snapshot now on the target.

    ``method`` is ``"rsync"`` when the target rejected the stream and the fallback copied the
    dataset's snapshots instead (``reached``: the newest snapshot copied; ``fallback``: the
    directory on the target host they went to). ``diverged`` says why the target dataset
    was left untouched (the plan found it diverged, or the receiver refused it as modified);
    None otherwise.
    """

    source: str
    target: str
    plan: Plan
    bytes: int = 0
    reached: str | None = None
    method: str = "zfs"
    fallback: str | None = None
    diverged: str | None = None


@dataclasses.dataclass(frozen=True)
class FallbackResult:
    """What a fallback did for one dataset: bytes sent, newest snapshot copied (short name,
    None when there is none yet), and the directory on the target host it copied into."""

    bytes: int
    reached: str | None
    where: str


Fallback = Callable[[DatasetName, DatasetName, StreamUnsupported], FallbackResult]
"""``fallback(source dataset, target dataset, error)``: copy the dataset another way."""


@dataclasses.dataclass(frozen=True)
class Transfer:
    """How to move bytes to this target (from the job's ``[replicate]`` section)."""

    source_side: Side
    target_side: Side
    compress: bool
    rate: SharedRate | None
    """The job's ``bandwidth_limit``, shared by the transfers running at once; None: none."""
    receive_buffer: int | None
    """Bytes of mbuffer before ``zfs receive`` (``proc.mbuffer.mbuffer_argv``), None for none."""
    on_divergence: Literal["stop", "rollback"]
    progress: Callable[..., Callable[[int, float], None] | None]
    """Given a label, the expected bytes (or None) and the keywords ``dataset``,
    ``from_snap``, ``to_snap`` (what is sent) and ``expected_source``, as
    ``observe.transfers.progress_callback`` takes them, return a ``(bytes, seconds)``
    callback, or None for no progress."""
    cancel: threading.Event | None = None
    """Set when the run is interrupted: running pipelines stop (``run_pipeline``)."""
    queue: Queue | None = None
    """Told when each dataset starts and ends (``zbak status --watch`` shows the queue)."""


def _target_tree(zfs: Zfs, root: DatasetName) -> Tree | None:
    try:
        return zfs.tree(root, recursive=True)
    except DatasetNotFound:
        return None


def _refs(tree: Tree | None, dataset: DatasetName) -> tuple[SnapRef, ...]:
    if tree is None or not any(d.name == dataset for d in tree.datasets):
        return ()
    return tuple(SnapRef(s.short, s.guid, s.createtxg) for s in tree.snapshots(dataset))


def _source_state(zfs: Zfs, inventory: Inventory, dataset: DatasetName) -> SourceState:
    caps = zfs.capabilities
    bookmarks: tuple[BookmarkRef, ...] = ()
    if caps is not None and caps.bookmarks:
        bookmarks = tuple(BookmarkRef(b.name.split("#", 1)[1], b.guid, b.createtxg)
                          for b in zfs.bookmarks(dataset))
    encrypted = dataset in probe_encryption(zfs, [dataset]).encrypted
    snaps = tuple(SnapRef(s.short, s.guid, s.createtxg) for s in inventory.tree.snapshots(dataset))
    return SourceState(str(dataset), snaps, bookmarks, encrypted)


def _target_state(
    src: Zfs, dst: Zfs, tree: Tree | None, dataset: DatasetName, source: SourceState, prefix: str
) -> TargetState:
    exists = tree is not None and any(d.name == dataset for d in tree.datasets)
    snaps = _refs(tree, dataset)
    token = None
    caps = dst.capabilities
    if caps is not None and caps.resume_tokens:
        # A partial receive of a new dataset leaves the token on DATASET itself even though
        # the dataset is not listed as complete; ask for it whenever the parent exists.
        try:
            raw = dst.resume_token(str(dataset))
        except DatasetNotFound:
            raw = None
        if raw:
            token = describe_token(src.executor, raw, zfs=src.zfs)
    source_guids = {s.guid for s in source.snapshots}
    foreign = frozenset(s.name for s in snaps
                        if s.guid not in source_guids and not is_own(prefix, s.name))
    return TargetState(str(dataset), exists, snaps, token, foreign)


def replicate_to_zfs_target(
    *,
    job_name: str,
    job: JobConfig,
    target: Endpoint,
    inventory: Inventory,
    src: Zfs,
    dst: Zfs,
    transfer: Transfer,
    catalog: Catalog,
    clock: Clock,
    dry_run: bool,
    fallback: Fallback | None = None,
    concurrency: int = 1,
) -> list[DatasetOutcome]:
    """Bring ``target`` up to date for every dataset the job covers.

    Args:
        fallback: called for a dataset whose stream the target rejects as unsupported
            (see the module doc); None: raise ``StreamUnsupported``.
        concurrency: datasets replicated at once (``replication.order``: a dataset whose
            target does not exist yet waits for the dataset above it).

    Returns:
        one outcome per covered dataset, parents first; a diverged target dataset (snapshots
        or writes the source does not have; nothing on it was changed) has ``diverged`` set
        and the others were still replicated.

    Raises:
        FailedOver: a dataset of the target carries a failover mark (``values.failover``):
            nothing was sent (docs/decisions.md#failed-over-is-recorded-on-the-replica).
        StreamUnsupported: the target's ZFS cannot receive the stream and there is no
            ``fallback``.
        PipelineFailed, ZfsError, HostUnreachable: a transfer or command failed; no dataset
            starts after it, those running finish, and every dataset that received a
            snapshot has its new cursor. The first such error (in dataset order) is raised.
        ReplicaPropertiesFailed: every dataset was replicated, but a replica's properties
            could not be made the job's.
        HoldNotReleased: every dataset was replicated and its cursor moved, but an old
            base's hold could not be released.
    """
    assert target.dataset is not None and job.replicate is not None
    wanted = job.replicate.properties
    takes = dst.capabilities is not None and dst.capabilities.receive_properties
    tree = _target_tree(dst, target.dataset)
    if tree is not None:  # before any receive or rollback: a live replica is never written
        marks = failed_over(dst, target.dataset, recursive=job.recursive)
        if marks:
            raise failed_over_error(str(target), marks)
    present = {d.name for d in tree.datasets} if tree is not None else set()
    cursors = {(c.target, c.source_dataset): c for c in catalog.cursors(job_name)}
    infos = {info.name: info for info in inventory.datasets}
    buffered = bool(transfer.receive_buffer) and not dry_run and len(infos) > 1
    run = _TargetRun(
        job_name=job_name, job=job, target=target, inventory=inventory, src=src, dst=dst,
        transfer=transfer, tree=tree, present=present, dry_run=dry_run, fallback=fallback,
        receive_props=wanted.receive(), takes=takes, send_props=wanted.send and takes,
        cursors={source: row for (where, source), row in cursors.items() if where == str(target)},
        admits=job.replicate.filter_for(target),
        small=_small_datasets(src, list(infos)) if buffered else frozenset())
    settler = Settler(job_name, target, job.source.host, src, dst, catalog, clock, takes)
    outcomes: dict[DatasetName, DatasetOutcome] = {}

    def settle(batch: list[Finished[DatasetName, _Worked]]) -> bool:
        for item in batch:
            if item.error is None and item.result is not None:
                outcomes[item.key] = item.result.outcome
        # What reached the target is settled first, also for a dataset whose later step
        # failed (a full received, its incremental refused): the snapshot that arrived gets
        # its hold and cursor. The transfer's error is recorded after, so it wins.
        stop = not dry_run and settler.settle(
            [i.result.arrival for i in batch if i.result is not None and i.result.arrival])
        for item in batch:
            if item.error is not None:  # not a ZbakError: a bug, raised after the others
                settler.settled.errors[item.key] = item.error
            elif item.result is not None and item.result.error is not None:
                settler.settled.errors[item.key] = item.result.error
        return stop

    def failed(item: Finished[DatasetName, _Worked]) -> bool:
        return item.error is not None or (item.result is not None
                                          and item.result.error is not None)

    targets = {name: target.dataset.child(name.relative_to(job.source.dataset)) for name in infos}
    queue = transfer.queue

    def work(dataset: DatasetName) -> _Worked:
        if queue is None:
            return run.replicate(dataset)
        queue.started(str(dataset))
        try:
            return run.replicate(dataset)
        finally:
            queue.ended(str(dataset))

    fan_out(list(infos), work, concurrency=concurrency, settle=settle, stop=failed,
            after=prerequisites(list(infos), {n for n, t in targets.items() if t in present}),
            cancel=transfer.cancel, name=f"zbak-{target.host}", idle=settler.idle)
    errors = settler.settled.errors
    if errors:
        first = next(errors[name] for name in infos if name in errors)
        raise first
    if settler.settled.property_errors:
        raise settler.settled.property_errors[0]
    if settler.settled.unreleased:
        raise settler.settled.unreleased[0]
    return [outcomes[name] for name in infos]


def _small_datasets(src: Zfs, datasets: list[DatasetName]) -> frozenset[DatasetName]:
    """The datasets of ``datasets`` storing less than ``SMALL_DATASET`` bytes, read in one
    ``zfs get`` (``usedbydataset`` and ``usedbysnapshots``, zfsprops(7); both date from pool
    version 13, zfs-fuse has them); none when the source cannot say (every stream then keeps
    the buffer)."""
    props = ("usedbydataset", "usedbysnapshots")
    try:
        found = src.property_sources([str(d) for d in datasets], props)
    except ZfsError as exc:
        log.debug("receive buffer for every dataset: their sizes could not be read: %s", exc)
        return frozenset()
    small = set()
    for dataset in datasets:
        values = [found.get(str(dataset), {}).get(p, ("-", "-"))[0] for p in props]
        if all(v.isdigit() for v in values) and sum(map(int, values)) < SMALL_DATASET:
            small.add(dataset)
    return frozenset(small)


@dataclasses.dataclass(frozen=True)
class _Worked:
    """What a worker did for one dataset: its outcome, what to settle, the error that
    stopped its steps (after ``arrival``'s snapshot was received, if any)."""

    outcome: DatasetOutcome
    arrival: Arrival | None = None
    error: ZbakError | None = None


@dataclasses.dataclass(frozen=True)
class _TargetRun:
    """Everything a worker needs to replicate one dataset to the target (read-only but for
    ``present``, guarded by ``lock``)."""

    job_name: str
    job: JobConfig
    target: Endpoint
    inventory: Inventory
    src: Zfs
    dst: Zfs
    transfer: Transfer
    tree: Tree | None
    present: set[DatasetName]
    """Datasets known to exist on the target: listed, or created in this run."""
    dry_run: bool
    fallback: Fallback | None
    receive_props: ReceiveProperties
    takes: bool
    send_props: bool
    cursors: dict[str, CursorRow]
    admits: SnapshotFilter
    small: frozenset[DatasetName] = frozenset()
    """Datasets received without the receive buffer (``_small_datasets``)."""
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @functools.cached_property
    def infos(self) -> dict[DatasetName, DatasetInfo]:
        """The covered datasets by name."""
        return {info.name: info for info in self.inventory.datasets}

    def replicate(self, dataset: DatasetName) -> _Worked:
        """Plan and run the steps of one dataset (in a worker thread)."""
        assert self.target.dataset is not None
        target_ds = self.target.dataset.child(dataset.relative_to(self.job.source.dataset))
        source_state = _source_state(self.src, self.inventory, dataset)
        target_state = _target_state(self.src, self.dst, self.tree, target_ds, source_state,
                                     self.job.snapshot.prefix)
        sendable = None if not self.admits.active else frozenset(
            s.guid for s in source_state.snapshots if self.admits.admits(s.name))
        plan = plan_replication(source_state, target_state,
                                on_divergence=self.transfer.on_divergence, sendable=sendable)
        outcome = DatasetOutcome(str(dataset), str(target_ds), plan)
        if plan.diverged:
            outcome.diverged = f"{self.target}: {target_ds} diverged from {dataset}: {plan.diverged}"
            return _Worked(outcome)
        if self.dry_run or not plan.steps:
            return self._nothing_to_send(outcome, source_state)
        if not target_state.exists:
            self._ensure_parent(target_ds)
        return self._send(dataset, target_ds, plan, outcome, source_state,
                          {s.guid for s in target_state.snapshots})

    def _nothing_to_send(self, outcome: DatasetOutcome, source: SourceState) -> _Worked:
        """A dataset up to date (or a dry run): nothing to settle, unless its cursor lags
        behind what the target has (a run killed between its receive and its batch): then
        its hold and cursor move there."""
        common = outcome.plan.common
        if common is None:
            return _Worked(outcome)
        outcome.reached = common.name
        base = next((s for s in source.snapshots if s.guid == common.guid), None)
        old = self.cursors.get(outcome.source)
        if self.dry_run or base is None or (old is not None and old.guid == base.guid):
            return _Worked(outcome)
        return _Worked(outcome, Arrival(DatasetName(outcome.source), DatasetName(outcome.target),
                                        base, old_base=old.snapshot_name if old else None,
                                        listed=True))

    def _send(self, dataset: DatasetName, target_ds: DatasetName, plan: Plan,
              outcome: DatasetOutcome, source: SourceState, listed: set[int]) -> _Worked:
        """Run the plan's steps in order; what reached the target is settled even when a
        later step failed (``_Worked.error``)."""
        props = self.receive_props.for_kind(self.infos[dataset].kind)
        old = self.cursors.get(str(dataset))
        lost = old.snapshot_name if old is not None and old.guid not in listed else None
        reached: SnapRef | None = None
        created = False
        error: ZbakError | None = None
        transfer = self.transfer
        if dataset in self.small:
            transfer = dataclasses.replace(transfer, receive_buffer=None)
        try:
            for step in plan.steps:
                outcome.bytes += execute_step(step, dataset, target_ds, source, self.src,
                                              self.dst, transfer, props=props,
                                              send_props=self.send_props, lost=lost)
                created = created or isinstance(step, Full)
                if isinstance(step, (Full, Incremental, Resume)):
                    reached = step.to
        except StreamUnsupported as exc:
            if self.fallback is None:
                error = exc
            else:
                log.warning("%s cannot receive %s: %s; falling back to rsync", self.target,
                            dataset, exc.stderr)  # fmt: skip
                done = self.fallback(dataset, target_ds, exc)
                outcome.method, outcome.fallback = "rsync", done.where
                outcome.bytes += done.bytes
                outcome.reached = done.reached
                return _Worked(outcome)
        except Diverged as exc:  # the receiver refused it as modified: nothing was received
            outcome.diverged = f"{self.target}: {exc}"
            return _Worked(outcome)
        except ZbakError as exc:
            error = exc
        if reached is None:
            return _Worked(outcome, None, error)
        outcome.reached = reached.name
        with self.lock:
            self.present.add(target_ds)
        checked = props if self.send_props else ReceiveProperties(props.assigned)
        return _Worked(outcome, Arrival(
            dataset, target_ds, reached, created=created,
            old_base=old.snapshot_name if old else None, props=props, checked=checked), error)

    def _ensure_parent(self, target_ds: DatasetName) -> None:
        """Create the target's missing parents (``zfs create -p``) once, whichever worker
        needs them first."""
        parent = DatasetName(target_ds.rsplit("/", 1)[0]) if "/" in target_ds else None
        if parent is None:
            return
        with self.lock:
            if parent not in self.present and not self.dst.exists(str(parent)):
                self.dst.create_filesystem(parent, parents=True)
            self.present.add(parent)


def execute_step(step: Step, dataset: DatasetName, target_ds: DatasetName,
                 source: SourceState, src: Zfs, dst: Zfs, transfer: Transfer, *,
                 props: ReceiveProperties, send_props: bool, lost: str | None = None,
                 rolled_back: bool = False) -> int:
    """Run one step; return the bytes sent (replication, and a failback's sends from the
    replica to the source: ``failover.failback``).

    A rollback (``on_divergence = "rollback"``) reads the target dataset's failover mark
    right before it changes anything, whatever the run's listing said: a replica failed
    over meanwhile is never rolled back (``replication.failed_over``).

    Args:
        props: set and excluded on receive (where the receiver takes ``-o``/``-x``).
        send_props: send the dataset's properties (``zfs send -p``).
        lost: short name of the last snapshot zbak replicated to ``target_ds`` (its cursor)
            when the target no longer lists it; names the cause when zfs refuses the
            target as modified.

    Raises:
        Diverged: the receiver refused ``target_ds`` as modified since its newest snapshot
            (and ``on_divergence`` is not ``rollback``, or rolling back did not help).
        FailedOver: a rollback was due, but ``target_ds`` carries a failover mark.
        StreamUnsupported: the receiver rejected the stream itself.
        PipelineFailed, ZfsError: the transfer or a command failed otherwise.
    """
    if isinstance(step, AbortResume):
        log.warning("%s: aborting the partial receive: %s", target_ds, step.reason)
        dst.abort_resume(str(target_ds))
        return 0
    if isinstance(step, Rollback):
        refuse_failed_over(dst, target_ds)
        for short in step.destroy:
            log.warning("%s: destroying %s to roll back (on_divergence = rollback)", target_ds, short)
            dst.destroy_snapshot(SnapshotName.of(target_ds, short))
        dst.rollback(SnapshotName.of(target_ds, step.to.name))
        return 0
    # Stream features the receiving pool takes: -c/-L/-e only where it has their features
    # (zfs-fuse has none, nor a pool created with -d or compatibility=legacy).
    caps = dst.capabilities
    send = send_argv(step, source_dataset=str(dataset), caps=src.capabilities,
                     raw=source.encrypted, receiver=caps, properties=send_props, zfs=src.zfs)
    receive = receive_argv(str(target_ds), caps=caps, resumable=bool(caps and caps.resume_tokens),
                           properties=props, zfs=dst.zfs)
    # Count the stream where it is really read or written (stages.metered_transfer): a remote
    # sender's ssh, a local OpenZFS `zfs send`, or what stage 1 reads from zfs-fuse's daemon.
    writes = src.capabilities is not None and src.capabilities.send_writes_stream
    lease = transfer.rate.lease() if transfer.rate is not None else None
    label = f"{dataset}@{step.to.name} -> {target_ds}"
    try:
        try:  # the lease goes back whatever fails, also before the pipeline started
            stages, meter = metered_transfer(
                send, receive, source=transfer.source_side, target=transfer.target_side,
                compress=transfer.compress, bandwidth_limit=None,
                limiter=lease.argv if lease is not None else None,
                send_writes_stream=writes, receive_buffer=transfer.receive_buffer,
            )  # fmt: skip
            limiter = next((i for i, s in enumerate(stages) if s.name == "rate limit"), None)

            def started(pids: tuple[int, ...]) -> None:
                if lease is not None and limiter is not None:
                    lease.started(pids[limiter])

            log.info("sending %s (%s)", label, type(step).__name__.lower())
            base = getattr(step, "base", None)  # what zbak status shows (observe.transfers)
            full = SnapshotName.of(dataset, step.to.name) if isinstance(step, Full) else None
            expected = expected_size(src, send, full=full)
            progress = transfer.progress(label, expected.bytes, dataset=str(dataset),
                                         to_snap=step.to.name,
                                         from_snap=base.name if base is not None else None,
                                         expected_source=expected.source)
            result: PipelineResult = run_pipeline(stages, progress=progress, meter=meter,
                                                  cancel=transfer.cancel, on_start=started)
        finally:
            if lease is not None:
                lease.close()
    except PipelineFailed as exc:
        refusal = receive_refusal(exc, receive, dst.executor.host)
        if isinstance(refusal, StreamUnsupported):
            raise refusal from exc
        if not (isinstance(step, Incremental) and isinstance(refusal, TargetModified)):
            raise
        base = SnapshotName.of(target_ds, step.base.name)
        if transfer.on_divergence != "rollback" and lost is not None:
            # Destroying the newest snapshot leaves its data in the dataset, which zfs then
            # calls "modified since most recent snapshot" (seen on zfs-fuse 0.7).
            raise Diverged(
                f"{target_ds}@{lost}, the last snapshot replicated to it, was destroyed on the"
                f" target: its data is still in {target_ds}, newer than its newest snapshot"
                f" @{step.base.name}, so zfs refuses to receive. Nothing was received and"
                f" nothing on it was changed. Roll the target back to @{step.base.name} (zfs"
                f" rollback {base}), or set on_divergence = \"rollback\" to let zbak do it;"
                f" the next run sends everything after @{step.base.name} again") from exc
        if transfer.on_divergence != "rollback" or rolled_back:
            raise Diverged(
                f"{target_ds} was modified since its newest snapshot @{step.base.name} (files"
                f" written, or access times while mounted read-write): nothing was received"
                f" and nothing on it was changed. Keep the replica unmodified (zfs set"
                f" readonly=on {target_ds}), or set on_divergence = \"rollback\" to discard"
                f" the changes (zfs rollback {base})") from exc
        refuse_failed_over(dst, target_ds)
        log.warning("%s was modified since @%s: rolling it back (on_divergence = rollback)",
                    target_ds, step.base.name)
        dst.rollback(base)
        return execute_step(step, dataset, target_ds, source, src, dst, transfer, props=props,
                        send_props=send_props, lost=lost, rolled_back=True)
    log.info("received %s: %d bytes in %.1f s", label, result.bytes, result.seconds)
    return result.bytes
