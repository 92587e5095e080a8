"""``zbak audit`` for one job: the three levels over the job's datasets, recorded as a run.

1. graph: the catalog rows of the job's datasets (``audit.load``, one query per table), its
   replica cursors (each ZFS target dataset listed once, to see the cursor's snapshot is
   there) and, when the job has ``[archive]``, the archive's progress (``audit.graph``);
2. objects: per store holding the job's streams, a listing of the datasets' prefixes (the
   job's own store's made in a thread while the catalog is read), the manifests read
   and compared unless an earlier read of the same, unchanged object agreed
   (``audit.objects``, whose stamps ``catalog.stamps`` keeps); a stream with a volume
   missing or of the wrong size is marked ``bad`` (``archive.damage.mark_bad``, an alert
   event);
3. with ``deep``: the chosen streams re-read and checked, verified or marked bad, and with
   ``receive_into`` their chains test-received (``audit.deep``).

Batches (docs/decisions.md#catalog-commands-stay-fast-at-100000-streams: reading a job of 100,000
streams at once peaked at 604 MiB, growing linearly): the job's datasets and their stream counts are
read first (``Catalog.dataset_streams``), then grouped into batches of whole datasets of up to
:data:`BATCH_STREAMS` streams (:func:`plan_batches`; a dataset is never split, so every
chain is checked whole). Each batch is read, listed, checked (graph and objects levels,
marks, stamps, coverage) and dropped before the next: its catalog reads are scoped to its
datasets' ids, and its listing is one per dataset and store (``dataset_prefix``), leaving
out the directories of catalogued datasets below it, which their own batch lists
(``Backend.list_outside``; a ``file://`` store never reads them). After the batches, one
listing per store of the job's prefix outside every catalogued dataset's directory (a
``file://`` store reads just the directories above the datasets) finds what no batch saw:
stray stream directories of datasets the catalog does not know, and stray files; and the
replica cursors are checked once. The findings are those one batch over the whole job
gives, in the same order (``sort_findings`` is stable, and the batches' findings are kept
per level and store as one batch would give them). A job that fits in one batch, and
every ``--deep`` audit (its sample and ``--max-duration`` are shared by the whole job), is
read as one batch with one listing of the job's prefix per store, as before.
Assumed, as ``zbak archive`` writes them: a stream's objects lie under its own dataset's
prefix (``objects.layout``).

A plain audit only reads the store (in the catalog it writes its run, the manifest stamps
and the streams it marks bad), so it does not take the job's dataset lock: it runs beside
``zbak archive``, ``replicate`` and ``snapshot`` (a long archive does not make the weekly
audit exit 3, docs/decisions.md#audit-runs-beside-an-archive). What a running archive is writing is
not yet in the catalog (the catalog row comes after the manifest, ``archive.writer``): its partial
upload shows as information. It does not run beside what deletes: when ``zbak prune`` or ``zbak
audit --repair`` holds the dataset lock, the audit stops with ``Locked`` (exit 3), and two audits
of one job do not overlap (their own lock, ``audit HOST:DATASET``). ``--repair``
(``repair_job``) takes the dataset lock itself, exclusive as before.
The run is recorded with action ``audit``: ``ok`` when nothing is wrong, ``failed`` with a
summary when a warning or error was found, ``partial`` when cold volumes are still thawing.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import functools
import logging
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from zrepl_py.archive.damage import mark_bad
from zrepl_py.archive.rolling_lock import roll_locks
from zrepl_py.audit.deep import Deadline, DeepAudit, DeepResult, ScratchPool, choose
from zrepl_py.audit.findings import Finding, Severity
from zrepl_py.audit.graph import ChainStream, GraphInput, TargetListing, audit_graph, sort_findings
from zrepl_py.audit.load import load_graph_input
from zrepl_py.audit.objects import (
    audit_objects,
    export_version_findings,
    foreign_generation_findings,
    unfinished_findings,
    version_findings,
)
from zrepl_py.audit.restorable import Coverage, coverage, coverage_findings, stray, strays_of
from zrepl_py.catalog.base import CHUNK
from zrepl_py.catalog.export import StoreGuard
from zrepl_py.catalog.rows import (
    CursorRow,
    DatasetStreams,
    SnapshotRow,
    StreamRow,
    VolumeRow,
    first_three,
    owners,
    recorded_versions,
)
from zrepl_py.config.hosts import LOCAL_HOST, parse_endpoint
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.schema import replica_datasets
from zrepl_py.errors import (
    Locked,
    NeedsThaw,
    ObjectNotFound,
    StoreError,
    StreamCorrupt,
    UsageError,
    ZbakError,
)
from zrepl_py.hooks.around import ActionHooks
from zrepl_py.hooks.environment import Facts
from zrepl_py.invocation.context import Context, lock_key
from zrepl_py.objects.checked import read_with_copy
from zrepl_py.objects.generations import job_generations
from zrepl_py.objects.layout import (
    EXPORT_PREFIX,
    MANIFEST,
    MANIFEST_COPY,
    dataset_prefix,
    stream_dataset,
    volume_index,
)
from zrepl_py.objects.manifest import Manifest
from zrepl_py.objects.versions import as_written, pin
from zrepl_py.observe.runlog import recorded_run
from zrepl_py.runtime.prefetch import Prefetch
from zrepl_py.snapshots.inventory import left_out_now
from zrepl_py.snapshots.selection import covers
from zrepl_py.stores.base import Backend, ObjectInfo, stat_recorded, under_any
from zrepl_py.transport.stages import Side
from zrepl_py.zfs.names import DatasetName

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog

log = logging.getLogger(__name__)


@dataclasses.dataclass
class AuditResult:
    """One job's audit.

    Attributes:
        job: the job's name.
        findings: every finding, errors first (each names the job).
        streams: streams of the job's datasets in the catalog.
        verified / bad: stream ids the deep level verified / the objects or deep level
            marked bad.
        received: the fulls whose chains were test-received.
        skipped: streams chosen but not read because ``--max-duration`` ran out.
        manifests_read / manifests_trusted: manifests the objects level read, and trusted
            from an earlier agreeing read because the listing shows them unchanged
            (``audit.objects.must_read``).
        coverage: per dataset and store, the snapshots restorable, stored but
            unrestorable, and not catalogued (``audit.restorable.Coverage``).
        waiting: cold volumes still thawing (deep level); ``ready_by`` when they should be
            readable (aware UTC).
    """

    job: str
    findings: list[Finding]
    streams: int = 0
    verified: list[int] = dataclasses.field(default_factory=list)
    bad: list[int] = dataclasses.field(default_factory=list)
    received: list[int] = dataclasses.field(default_factory=list)
    waiting: int = 0
    ready_by: dt.datetime | None = None
    skipped: int = 0
    coverage: list[Coverage] = dataclasses.field(default_factory=list)
    manifests_read: int = 0
    manifests_trusted: int = 0

    @property
    def wrong(self) -> bool:
        """True when a finding is a warning or an error (``zbak audit`` exits 4)."""
        return any(f.wrong for f in self.findings)

    def summary(self) -> str:
        """``N error(s), M warning(s), K info`` plus thaw state, for the run record."""
        counts = {s: sum(1 for f in self.findings if f.severity is s) for s in Severity}
        text = (f"{counts[Severity.ERROR]} error(s), {counts[Severity.WARNING]} warning(s),"
                f" {counts[Severity.INFO]} info")
        if self.waiting:
            text += f"; {self.waiting} cold volume(s) thawing"
        return text


def _left_out(ctx: Context, job: JobConfig) -> tuple[tuple[str, ...], list[Finding]]:
    """For a job that selects by property (``[select]``): the datasets its selection leaves
    out now, read from the source (one listing). The audit otherwise needs no source, so
    when the source cannot be listed (a lost pool is when an audit matters most) every
    catalogued dataset below the root is audited and an information finding says so."""
    if job.select is None:
        return (), []
    source = job.source
    try:
        zfs = ctx.zfs(source.host, source.dataset.pool)
        return left_out_now(zfs, job, replica_datasets(ctx.config, source.host)), []
    except ZbakError as exc:
        return (), [Finding(
            Severity.INFO, "graph", f"the source {source} could not be listed ({exc}), so its"
            f" {job.select.property} values were not read: every catalogued dataset below"
            f" {source.dataset} was audited, also ones the selection may leave out",
            "none needed; audit again when the source answers to audit the selection only")]


def _targets(ctx: Context, cursors: Sequence[CursorRow]) -> dict[tuple[str, str], TargetListing]:
    """List each ZFS target dataset named by a cursor once (one ``zfs get`` each)."""
    listings: dict[tuple[str, str], TargetListing] = {}
    for cur in cursors:
        key = (cur.target, cur.target_location)
        if cur.method != "zfs" or key in listings:
            continue
        try:
            host = parse_endpoint(cur.target, allow_directory=True).host
            zfs = ctx.zfs(host)
            tree = zfs.tree(cur.target_location, recursive=False)
            guids = frozenset(s.guid for s in tree.snapshots(cur.target_location))
            listings[key] = TargetListing(cur.target, cur.target_location, guids)
        except (ZbakError, ValueError) as exc:
            listings[key] = TargetListing(cur.target, cur.target_location, None, str(exc))
    return listings


def receive_into_place(ctx: Context, receive_into: str) -> tuple[str, DatasetName]:
    """``(host, dataset)`` of ``--receive-into [HOST:]POOL[/PATH]``, checked against the
    config before any audit starts, so a bad value is refused even when no chain would be
    received (docs/decisions.md#one-line-for-a-refused-command-line).

    Raises:
        UsageError: the host is not ``local`` and not under ``[hosts]``.
        InvalidName: the dataset breaks the ZFS naming rules (both exit 2).
    """
    host, sep, pool = receive_into.partition(":")
    if not sep:
        host, pool = LOCAL_HOST, receive_into
    if host != LOCAL_HOST and host not in ctx.config.hosts:
        raise UsageError(f"--receive-into {receive_into}: host {host!r} is not under [hosts]"
                         f" in {ctx.config_path}")
    return host, DatasetName(pool)


def _scratch(ctx: Context, receive_into: str) -> ScratchPool:
    host, name = receive_into_place(ctx, receive_into)
    zfs = ctx.zfs(host, name.pool)
    side = Side.of(ctx.config, host)
    return ScratchPool.under(zfs, side, str(name))


def audit_job(ctx: Context, name: str, job: JobConfig, *, deep: bool = False,
              sample: float | None = None, receive_into: str | None = None,
              deadline: Deadline | None = None) -> AuditResult:
    """Audit one job (see the module docstring).

    Args:
        ctx: the invocation's context.
        name / job: the job.
        deep: read the volumes back (level 3).
        sample: with ``deep``, the percentage of streams to read (least recently verified
            first); None: all.
        receive_into: with ``deep``, ``[HOST:]POOL[/PATH]`` to test-receive chains under.
        deadline: with ``deep``, the run's ``--max-duration`` budget, shared by the jobs of
            one invocation; None: unbounded.

    Raises:
        Locked: another audit of the job runs, or a prune or ``audit --repair`` holds the
            job's dataset lock (exit 3).
        UsageError: a bad ``sample`` or ``receive_into``.
        CatalogError, StoreError, ZfsError: the catalog, a store listing or the scratch pool
            failed (what one stream's reads find is a finding instead).
        HookFailed: a pre or post audit hook failed (``zrepl_py.hooks``; they run around
            the audit, inside its lock).
    """
    if sample is not None and not 0 < sample <= 100:
        raise UsageError(f"--sample must be a percentage in (0, 100], not {sample}")
    catalog = ctx.catalog()
    source = job.source
    facts = Facts("audit", name, source.host, str(source.dataset),
                  (job.archive.store,) if job.archive else ())
    with ctx.lock(f"audit {lock_key(job)}", "audit"):
        refuse_beside_deleters(ctx, job)
        with ActionHooks(job.hooks.get("audit"), catalog, ctx.clock, facts) as hooks:
            result = _recorded_audit(ctx, catalog, name, job, deep=deep, sample=sample,
                                     receive_into=receive_into, deadline=deadline)
            hooks.outcome.result = ("failed" if result.wrong else
                                    "partial" if result.waiting else "ok")
            hooks.outcome.error = None if hooks.outcome.result == "ok" else result.summary()
            hooks.outcome.datasets = tuple(sorted({c.dataset for c in result.coverage}))
        return result


DELETERS = ("prune", "audit --repair")
"""Lock holders a plain audit does not read beside: they delete objects and rows, so the
audit would report what they remove on purpose as missing."""


def refuse_beside_deleters(ctx: Context, job: JobConfig, action: str = "audit") -> None:
    """Raise ``Locked`` when a ``DELETERS`` run holds the job's dataset lock: ``action`` (a
    plain audit, a drill) reads what it deletes."""
    found = ctx.lock_holder(lock_key(job))
    if found is not None and found.action in DELETERS:
        raise Locked(f"{lock_key(job)} is locked by {found.describe()}, which deletes what the"
                     f" {action} would read; nothing done. Run the {action} again when it is"
                     " finished.")


def _recorded_audit(ctx: Context, catalog: Catalog, name: str, job: JobConfig, *, deep: bool,
                    sample: float | None, receive_into: str | None,
                    deadline: Deadline | None) -> AuditResult:
    source = job.source
    with recorded_run(catalog, ctx.clock, name, "audit") as record:
        result = _audit(ctx, name, job, source.host, str(source.dataset), deep=deep,
                        sample=sample, receive_into=receive_into,
                        deadline=deadline or Deadline(None))
        record.error = result.summary()
        record.result = "failed" if result.wrong else ("partial" if result.waiting else "ok")
        if not result.wrong and not result.waiting:
            record.error = None
    return result


BATCH_STREAMS = 20_000
"""Streams a plain audit reads at once: the job's datasets are audited in batches of whole
datasets holding up to this many streams together (a larger dataset is a batch of its
own), each read, listed, checked and dropped before the next, so the audit's memory
follows the batch, not the catalog (604 MiB for 100,000 streams read at once)."""


def plan_batches(datasets: Sequence[DatasetStreams], limit: int, *,
                 max_datasets: int = CHUNK) -> list[list[DatasetStreams]]:
    """Group ``datasets`` (in their order) into batches of whole datasets.

    Args:
        datasets: every dataset to audit (``Catalog.dataset_streams``).
        limit: streams per batch (every store together); a dataset with more is a batch of
            its own: one dataset is never split, its chains are checked together.
        max_datasets: datasets per batch (each is one bound parameter of the batch's reads).

    Returns:
        the batches, each a non-empty list, together ``datasets`` in order (none for none).
        Pure: raises nothing.
    """
    batches: list[list[DatasetStreams]] = []
    current: list[DatasetStreams] = []
    count = 0
    for dataset in datasets:
        streams = dataset.streams
        if current and (count + streams > limit or len(current) >= max_datasets):
            batches.append(current)
            current, count = [], 0
        current.append(dataset)
        count += streams
    if current:
        batches.append(current)
    return batches


def _audit(ctx: Context, name: str, job: JobConfig, host: str, root: str, *, deep: bool,
           sample: float | None, receive_into: str | None, deadline: Deadline) -> AuditResult:
    catalog = ctx.catalog()
    left_out, notes = _left_out(ctx, job)
    mine = covers(job, left_out)
    datasets = catalog.dataset_streams(host=host, below=root)
    stores = sorted({store for d in datasets if mine(d.name) for store in d.stores}
                    | ({job.archive.store} if job.archive else set()))
    run = _JobAudit(ctx, name, job, host, root, stores, mine, left_out, deep=deep,
                    sample=sample, receive_into=receive_into, deadline=deadline)
    cursors = catalog.cursors(job=name)
    run.pinned = catalog.snapshots_by_guid(
        (c.source_host, c.source_dataset, c.guid) for c in cursors)
    # --deep chooses the streams to read (least recently verified first) over the whole
    # job and shares one deadline among them: one batch.
    batches = [datasets] if deep else plan_batches(datasets, BATCH_STREAMS)
    if len(batches) <= 1:
        run.batch(None, [dataset_prefix(host, root)])
    else:
        names = [d.name for d in datasets]
        for batch in batches:
            run.batch([d.id for d in batch], [dataset_prefix(host, d.name) for d in batch],
                      names)
        if root not in names:
            run.uncatalogued(names)
    run.unfinished()
    run.exports()
    # The replica cursors once, after every batch (as they came after the archives; their
    # targets are listed here, once the store's listing is no longer waited for).
    run.graph += audit_graph(GraphInput(streams=[], snapshots=run.pinned, cursors=cursors,
                                        targets=_targets(ctx, cursors)))
    return run.result(notes)


class _JobAudit:
    """One plain or deep audit of a job, batch by batch (``_audit``): what the batches
    gather, kept in the order one batch over the whole job gives it."""

    def __init__(self, ctx: Context, name: str, job: JobConfig, host: str, root: str,
                 stores: list[str], mine: Callable[[str], bool], left_out: Collection[str], *,
                 deep: bool,
                 sample: float | None, receive_into: str | None, deadline: Deadline):
        self.ctx, self.name, self.job, self.host, self.root = ctx, name, job, host, root
        self.mine, self.left_out = mine, left_out
        self.deep, self.sample, self.receive_into, self.deadline = (deep, sample, receive_into,
                                                                    deadline)
        self.totals = AuditResult(name, [])
        self.pinned: list[SnapshotRow] = []  # the snapshots the replica cursors name
        self.graph: list[Finding] = []
        self.found: dict[str, list[Finding]] = {store: [] for store in stores}
        self.bad: dict[str, list[int]] = {store: [] for store in stores}
        self.backends = {}
        for store in stores:
            if store not in ctx.config.stores:
                self.found[store].append(Finding(
                    Severity.WARNING, "objects", f"store {store} holds streams of job {name}"
                    f" but is not under [stores] in {ctx.config_path}: its objects were not"
                    " checked", f"add [stores.{store}] back to the config", store=store))
            else:
                self.backends[store] = ctx.store(store)

    def _listing(self, backend: Backend, prefixes: Sequence[str],
                 names: Sequence[str] | None) -> dict[str, ObjectInfo]:
        """Every object under ``prefixes`` by key, one listing each; with ``names`` (every
        catalogued dataset of the job, sorted), without the objects of the catalogued
        datasets below each prefix (their own batch lists them)."""
        listing: dict[str, ObjectInfo] = {}
        for prefix in prefixes:
            skip: set[str] = set()
            if names is not None:
                dataset = prefix[len(self.host) + 1:-1]
                low = bisect.bisect_left(names, dataset + "/")
                high = bisect.bisect_left(names, dataset + "0")  # "0" follows "/"
                skip = {dataset_prefix(self.host, n) for n in names[low:high]}
            for info in backend.list_outside(prefix, skip):
                listing[info.key] = info
        return listing

    def batch(self, ids: list[int] | None, prefixes: Sequence[str],
              names: Sequence[str] | None = None) -> None:
        """Audit the datasets of ``ids`` (None: every dataset of the job) listed at
        ``prefixes``; ``names`` as in :meth:`_listing`."""
        ctx, job, mine = self.ctx, self.job, self.mine
        catalog = ctx.catalog()
        # The job's store is listed in a thread while the catalog is read: the listing waits
        # on the store (system calls or HTTP) most of the time.
        ahead = []
        own = job.archive.store if job.archive is not None else None
        if own in self.backends:
            # partial binds the backend now: the loop below rebinds the name ``backend``
            # while the prefetch thread may not have started yet.
            ahead.append((own, functools.partial(self._listing, self.backends[own], prefixes,
                                                 names)))
        listings = Prefetch(ahead)
        try:
            archives = [(self.name, own)] if own is not None else []
            data = load_graph_input(catalog, host=self.host, below=self.root, archives=archives,
                                    datasets=ids)
            covered = [s for s in data.streams if mine(s.dataset)]
            data = dataclasses.replace(
                data, streams=covered, snapshots=[*data.snapshots, *self.pinned],
                archives=[a for a in data.archives if mine(a.dataset)])
            self.totals.streams += len(covered)
            chain = _chain_heads(covered)
            self.graph += _with_chains(audit_graph(data), chain)
            del data, covered
            for store, backend in self.backends.items():
                # Not kept here: _audit_store drops the listing once done with it (memory).
                found = _audit_store(
                    ctx, backend, self.name, job, self.host, self.root, store, deep=self.deep,
                    sample=self.sample, receive_into=self.receive_into, result=self.totals,
                    deadline=self.deadline, left_out=self.left_out, datasets=ids,
                    bad=self.bad[store], listing=listings.take(
                        store, functools.partial(self._listing, backend, prefixes, names)))
                self.found[store] += _with_chains(found, chain)
        finally:
            listings.close()

    def uncatalogued(self, names: Sequence[str]) -> None:
        """Audit what lies under the job's prefix outside every catalogued dataset's (stray
        directories of datasets the catalog does not know, stray files): one listing per
        store that leaves the catalogued datasets' directories unread (``file://``)."""
        skip = {dataset_prefix(self.host, n) for n in names}
        for store, backend in self.backends.items():
            listing = {info.key: info for info in
                       backend.list_outside(dataset_prefix(self.host, self.root), skip)}
            self.found[store] += _audit_store(
                self.ctx, backend, self.name, self.job, self.host, self.root, store,
                deep=self.deep, sample=self.sample, receive_into=self.receive_into,
                result=self.totals, deadline=self.deadline, left_out=self.left_out,
                datasets=(), bad=self.bad[store], listing=listing)

    def unfinished(self) -> None:
        """Report what unfinished puts left under the job's prefix in each store (one
        listing of them per store, ``audit.objects.unfinished_findings``); a store that
        cannot list them (an S3 credential without s3:ListBucketMultipartUploads) is a
        warning, the rest of the audit stands."""
        prefix = dataset_prefix(self.host, self.root)
        now = self.ctx.clock.now()
        for store, backend in self.backends.items():
            try:
                uploads = backend.unfinished_uploads(prefix)
            except StoreError as exc:
                self.found[store].append(Finding(
                    Severity.WARNING, "objects", f"the unfinished uploads under {prefix} in"
                    f" store {store} could not be listed: {exc}", "give the store's profile"
                    " s3:ListBucketMultipartUploads and s3:ListMultipartUploadParts",
                    store=store))
                continue
            self.found[store] += unfinished_findings(
                [u for u in uploads
                 if (dataset := stream_dataset(u.key, self.host)) is None or self.mine(dataset)],
                host=self.host, store=store, now=now,
                stale_after=dt.timedelta(days=STALE_UPLOAD_DAYS))

    def exports(self) -> None:
        """On each write-once store (``Backend.keeps_versions``): the versions of the job's
        catalog export generations, every machine's (one version listing of the exports per
        store), tampering named (``audit.objects.export_version_findings``; this machine's
        generations by the versions its mark records, others by their first; a generation of
        its own above the one its mark trusts, ``foreign_generation_findings``), and the lock
        of the generation this machine's mark trusts extended where due
        (``catalog.export.StoreGuard.extend_lock``). A store error is a warning."""
        now = self.ctx.clock.now()
        for store, backend in self.backends.items():
            if not backend.keeps_versions:
                continue
            guard = StoreGuard(backend, store, self.ctx.state_dir, job=self.name)
            mark = guard.mark()
            try:
                listed = job_generations(backend.list_versions(EXPORT_PREFIX), self.name)
            except StoreError as exc:
                self.found[store].append(Finding(
                    Severity.WARNING, "objects", f"the versions of the catalog exports in"
                    f" store {store} could not be listed: {exc}", "give the store's profile"
                    " s3:ListBucketVersions", store=store))
                continue
            self.found[store] += export_version_findings(
                pin(listed, {} if mark is None else mark.versions), store=store)
            if mark is not None and guard.key is not None:
                self.found[store] += foreign_generation_findings(
                    listed, guard.key, mark.generation, store=store)
            try:
                guard.extend_lock(now)
            except StoreError as exc:
                self.found[store].append(Finding(
                    Severity.WARNING, "objects", f"the Object Lock of catalog export"
                    f" {mark.key if mark else guard.key} in store {store} could not be"
                    f" extended: {exc}", "check the store's credential may"
                    " s3:PutObjectRetention; the next audit or archive tries again before the"
                    " lock lapses", store=store))

    def result(self, notes: list[Finding]) -> AuditResult:
        """The job's result: every finding sorted (``sort_findings``, stable: in the order
        one batch over the whole job gives them), coverage by store, host and dataset."""
        result = self.totals
        findings = self.graph + notes + [f for found in self.found.values() for f in found]
        result.findings = sort_findings(dataclasses.replace(f, job=self.name) for f in findings)
        result.bad = [sid for bad in self.bad.values() for sid in bad]
        result.coverage.sort(key=_coverage_order)
        return result


def _coverage_order(cov: Coverage) -> tuple[str, str, str]:
    return cov.store, cov.host, cov.dataset


def _with_chains(findings: list[Finding], chain: dict[int, int]) -> list[Finding]:
    """``findings`` naming a stream but no chain, given the id of the full their stream's
    chain starts at (``_chain_heads``)."""
    return [f if f.chain is not None or f.stream is None or f.stream not in chain
            else dataclasses.replace(f, chain=chain[f.stream]) for f in findings]


def _drop_stale_volume_findings(backend: Backend, findings: list[Finding],
                                volumes: dict[int, list[VolumeRow]]) -> list[Finding]:
    """``findings`` without the errors of volumes the listing missed or showed another size
    of, but which the store has now as catalogued (one ``stat`` each): the listing may be
    older than the catalog read (an archive running beside the audit writes its objects
    first and its row last), and a volume error marks its stream bad.

    Raises:
        StoreError: a ``stat`` failed other than by the object being absent.
    """
    rows = {v.key: v for each in volumes.values() for v in each}
    kept = []
    for finding in findings:
        if (finding.severity is Severity.ERROR and finding.key in rows
                and volume_index(finding.key) is not None):
            row = rows[finding.key]
            try:
                if stat_recorded(backend, row.key, row.version_id).size == row.stored_bytes:
                    continue
            except ObjectNotFound:
                pass
        kept.append(finding)
    return kept


def _rolled(ctx: Context, backend: Backend, catalog: Catalog, job: JobConfig, store: str,
            streams: Sequence[StreamRow], volumes: dict[int, list[VolumeRow]],
            datasets: Sequence[int] | None) -> list[Finding]:
    """Extend the Object Lock of job ``job``'s streams' volumes (of the batch's datasets,
    ``datasets``) that retention still wants where it is due (``archive.rolling_lock``); a
    warning naming the versions whose extension failed."""
    rolled = roll_locks(backend, catalog, job, streams, volumes, ctx.clock.now(),
                        concurrency=ctx.config.stores[store].upload_concurrency,
                        datasets=datasets)
    if not rolled.failed:
        return []
    return [Finding(Severity.WARNING, "objects", f"the Object Lock of {len(rolled.failed)}"
                    f" version(s) in store {store} could not be extended:"
                    f" {first_three(rolled.failed)}", "check the store's credential may"
                    " s3:PutObjectRetention; the next audit or archive tries again before the"
                    " locks lapse", store=store)]


def _by_version(backend: Backend, host: str, streams: Sequence[StreamRow],
                volumes: dict[int, list[VolumeRow]], listing: dict[str, ObjectInfo]
                ) -> tuple[dict[str, ObjectInfo], dict[str, str], list[Finding]]:
    """On a write-once store (``Backend.keeps_versions``): ``listing`` with the objects of
    ``streams`` as zbak wrote them (``objects.versions.as_written``, one version listing per
    dataset directory), so an overwrite or a delete marker does not make a volume look
    lost; key -> that version id, for the manifest reads; and the findings naming the
    tampering and the versions the catalog does not know
    (``audit.objects.version_findings``).

    Raises:
        StoreError: the version listing failed.
    """
    directories = {dataset_prefix(host, s.dataset) for s in streams}
    outermost = sorted(d for d in directories if not under_any(d[:-1], directories))
    merged, pinned = as_written(backend, listing, outermost, {s.object_prefix for s in streams},
                                recorded_versions(volumes))
    return merged, pinned.versions, version_findings(pinned, owners(streams, volumes))


def _stray_manifest(backend: Backend, prefix: str, leaves: set[str]) -> Manifest | None:
    """The manifest of a stray stream directory (primary, else its copy), None when neither
    is there or readable (the stream is then unrestorable: nothing can describe it)."""
    if MANIFEST not in leaves and MANIFEST_COPY not in leaves:
        return None
    try:
        return read_with_copy(backend, prefix + MANIFEST, Manifest.from_json, StreamCorrupt).value
    except (StreamCorrupt, ObjectNotFound, NeedsThaw, StoreError) as exc:
        log.warning("cannot read the manifest of %s: %s", prefix, exc)
        return None


def _chain_heads(streams: Sequence[ChainStream]) -> dict[int, int]:
    """Stream id -> id of the full its chain starts at (streams whose parents lead to no
    full are left out), following each parent link once."""
    by_id = {s.id: s for s in streams}
    head: dict[int, int | None] = {}
    for start in streams:
        path: list[ChainStream] = []
        cur: ChainStream | None = start
        while cur is not None and cur.id not in head and len(path) <= len(by_id):
            path.append(cur)
            cur = (None if cur.kind == "full" or cur.parent_id is None
                   else by_id.get(cur.parent_id))
        top = head.get(cur.id) if cur is not None else (
            path[-1].id if path and path[-1].kind == "full" else None)
        for s in path:
            head[s.id] = top
    return {sid: full for sid, full in head.items() if full is not None}


def _audit_store(ctx: Context, backend: Backend, name: str, job: JobConfig, host: str, root: str,
                 store: str, *, deep: bool, sample: float | None, receive_into: str | None,
                 result: AuditResult, deadline: Deadline, listing: dict[str, ObjectInfo],
                 left_out: Collection[str], datasets: Sequence[int] | None,
                 bad: list[int]) -> list[Finding]:
    """The objects level (and with ``deep`` the deep level) of the job's streams in one
    store: of the datasets of ids ``datasets`` (None: every dataset of the job; empty: no
    catalogued dataset, only ``listing``'s strays), against ``listing``. Adds the streams
    marked bad to ``bad``, the counts and coverage to ``result``; returns the findings."""
    catalog = ctx.catalog()
    scope: dict[str, Any] = dict(host=host, below=root, store=store, datasets=datasets)
    reads = datasets is None or len(datasets) > 0
    every = catalog.bulk_streams(**scope) if reads else []
    covered = covers(job, left_out)
    mine = [s for s in every if covered(s.dataset)]
    volumes = catalog.bulk_volumes(**scope) if reads else {}
    carried = catalog.bulk_carried(**scope) if reads else {}
    # --deep reads every manifest again, as it reads the volumes.
    stamps = catalog.manifest_stamps(**scope) if reads and not deep else {}
    now = ctx.clock.now()
    versions: dict[str, str] | None = None
    tampering: list[Finding] = []
    if backend.keeps_versions and every:
        listing, versions, tampering = _by_version(backend, host, every, volumes, listing)
    checked = audit_objects(backend, mine, volumes, carried, listing, known_streams=every,
                            concurrency=ctx.config.stores[store].upload_concurrency,
                            stamps=stamps, now=now, versions=versions)
    findings = _drop_stale_volume_findings(backend, checked.findings, volumes)
    result.manifests_read += checked.read
    result.manifests_trusted += checked.trusted
    if checked.wrong:
        catalog.forget_manifest_stamps(checked.wrong)  # --deep reads them without stamps
    if checked.seen:
        catalog.stamp_manifests(checked.seen, now)
    # A volume missing or of the wrong size makes its stream unrestorable: marked bad, so
    # restores stop before it and the next archive starts a new full; the reason names
    # every such volume (up to three) with its key.
    unreadable: dict[int, list[str]] = {}
    for f in findings:
        if (f.severity is Severity.ERROR and f.stream is not None and f.key is not None
                and volume_index(f.key) is not None):
            unreadable.setdefault(f.stream, []).append(f.problem)
    by_id = {s.id: s for s in mine}
    marked = [stream_id for stream_id, problems in unreadable.items()
              if mark_bad(catalog, by_id[stream_id], first_three(problems), ctx.clock.now(),
                          job=name, action="audit")]
    bad += marked
    findings += _rolled(ctx, backend, catalog, job, store, mine, volumes, datasets)
    # Tampering marks nothing bad: zbak's versions are still there and read.
    findings = tampering + findings
    mine = [dataclasses.replace(s, state="bad") if s.id in marked else s for s in mine]
    strays = [stray(host, dataset, store, prefix, leaves, _stray_manifest(backend, prefix, leaves))
              for prefix, (dataset, leaves) in strays_of(
                  listing, {s.object_prefix for s in every}, host, store).items()
              if covered(dataset)]
    del listing  # the largest structure of a large audit, no longer needed
    running = ctx.lock_holder(lock_key(job))
    known = catalog.known_snapshots(host=host, below=root, datasets=datasets) if reads else {}
    found = coverage(mine, carried, strays, known,
                     archive_running=running is not None and running.action == "archive")
    result.coverage += found
    # A stray directory the coverage calls unrestorable is reported there, with advice that
    # works, instead of as a leftover that `catalog rebuild --merge` would add (it cannot).
    accounted = {prefix for cov in found for prefix in cov.dead}
    findings = [f for f in findings if not (f.stream is None and f.key in accounted)]
    findings += coverage_findings(found, job=result.job)
    if not deep:
        return findings
    # Reading the streams found unreadable above would only repeat it.
    chosen = [s for s in choose(mine, sample) if s.id not in unreadable]
    # A sealed store without an identity stops the deep level here (exit 2), before any
    # read: levels 1 and 2 need none.
    codec_of = ctx.reading_codecs(store)
    for chain in sorted({s.compression for s in chosen}):
        codec_of(chain)
    scratch = _scratch(ctx, receive_into) if receive_into else None
    outcome: DeepResult = DeepAudit(backend, catalog, volumes, carried, ctx.clock.now,
                                    ctx.config.restore, deadline, job=name,
                                    codec_of=codec_of).run(chosen, mine, scratch)
    result.verified += outcome.verified
    bad += outcome.bad
    result.received += outcome.received
    result.waiting += outcome.waiting
    result.skipped += outcome.skipped
    if outcome.skipped:
        findings.append(Finding(
            Severity.INFO, "deep", f"--max-duration ran out: {outcome.skipped} stream(s) in store"
            f" {store} were not read this run", "run the audit again: it continues with the"
            " least recently verified streams", store=store))
    if outcome.ready_by is not None:
        result.ready_by = max(result.ready_by or outcome.ready_by, outcome.ready_by)
    if outcome.waiting:
        when = f" after {outcome.ready_by:%Y-%m-%d %H:%M}Z" if outcome.ready_by else " later"
        findings.append(Finding(
            Severity.INFO, "deep", f"{outcome.waiting} cold volume(s) in store {store} are"
            " thawing; their streams were not read", f"run the same audit again{when}: it"
            " continues with the streams not verified yet", store=store))
    return findings + outcome.findings


STALE_UPLOAD_DAYS = 7.0
"""Default age after which ``zbak audit --repair`` aborts an unfinished upload (days)."""


@dataclasses.dataclass
class RepairResult:
    """What ``zbak audit --repair`` did for one job.

    Attributes:
        job: the job's name.
        aborted: per store, the unfinished uploads aborted (what ``abort_stale_uploads``
            returned: S3 ``KEY (upload id)`` or temporary file names).
        finished: ids of condemned streams (a prune that stopped) whose objects and rows
            were deleted.
        errors: per store, what stopped the repair there (the other stores still ran).
    """

    job: str
    aborted: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    finished: list[int] = dataclasses.field(default_factory=list)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)


def repair_job(ctx: Context, name: str, job: JobConfig, *,
               stale_upload_age: float = STALE_UPLOAD_DAYS * 86400) -> RepairResult:
    """The safe repairs of ``zbak audit --repair`` for one job, in each store it uses.

    Only two things, neither of which can lose a restorable snapshot:

    1. unfinished uploads older than ``stale_upload_age`` seconds are aborted
       (``Backend.abort_stale_uploads``: abandoned S3 multipart uploads, which S3 bills and
       never shows in a listing; stray temporary files of a ``file://`` store; z3
       ``s3_mp_cleanup.py``, docs/reliability.md#r15-multipart-edge-cases);
    2. streams left ``condemned`` by a prune that stopped are finished as prune does: their
       objects, then their rows, leaf first (``pruning.chain_delete.delete_stream``).

    Held under the job's dataset lock, like prune, and the job's audit lock (no plain audit
    of the job reads while it deletes).

    Raises:
        Locked: another run holds the job's dataset lock (exit 3).
        CatalogError: listing the catalog's streams failed (store failures go in the result).
    """
    from zrepl_py.pruning.chain_delete import delete_stream

    source = job.source
    catalog = ctx.catalog()
    result = RepairResult(name)
    with ctx.lock(f"audit {lock_key(job)}", "audit --repair"), \
            ctx.lock(lock_key(job), "audit --repair"):
        covered = covers(job)
        streams = [s for s in catalog.streams(host=source.host) if covered(s.dataset)]
        stores = sorted({s.store for s in streams} | ({job.archive.store} if job.archive else set()))
        for store in stores:
            if store not in ctx.config.stores:
                result.errors[store] = f"not under [stores] in {ctx.config_path}: not repaired"
                continue
            try:
                backend = ctx.store(store)
                result.aborted[store] = list(backend.abort_stale_uploads(stale_upload_age))
                condemned = sorted((s for s in streams if s.store == store
                                    and s.state == "condemned"),
                                   key=lambda s: (s.to_createtxg, s.id), reverse=True)
                for stream in condemned:
                    delete_stream(backend, catalog, stream)
                    result.finished.append(stream.id)
            except ZbakError as exc:
                log.error("job %s: repairing store %s stopped: %s", name, store, exc)
                result.errors[store] = str(exc)
    return result
