"""``zbak audit`` for one job: the three levels over the job's datasets, recorded as a run.

1. graph: the catalog rows of the job's datasets (``audit.load``, one query per table), its
   replica cursors (each ZFS target dataset listed once, to see the cursor's snapshot is
   there) and, when the job has ``[archive]``, the archive's progress (``audit.graph``);
2. objects: per store holding the job's streams, one listing of the job's dataset prefix
   (the job's own store's made in a thread while the catalog is read), the manifests read
   and compared unless an earlier read of the same, unchanged object agreed
   (``audit.objects``, whose stamps ``catalog.stamps`` keeps); a stream with a volume
   missing or of the wrong size is marked ``bad`` (``archive.damage.mark_bad``, an alert
   event);
3. with ``deep``: the chosen streams re-read and checked, verified or marked bad, and with
   ``receive_into`` their chains test-received (``audit.deep``).

A plain audit only reads the store (in the catalog it writes its run, the manifest stamps
and the streams it marks bad), so it does not take the job's dataset lock: it runs beside
``zbak archive``, ``replicate`` and ``snapshot`` (a long archive does not make the weekly
audit exit 3, issue 15). What a running archive is writing is not yet in the catalog (the
catalog row comes after the manifest, ``archive.writer``): its partial upload shows as
information. It does not run beside what deletes: when ``zbak prune`` or ``zbak audit
--repair`` holds the dataset lock, the audit stops with ``Locked`` (exit 3), and two audits
of one job do not overlap (their own lock, ``audit HOST:DATASET``). ``--repair``
(``repair_job``) takes the dataset lock itself, exclusive as before.
The run is recorded with action ``audit``: ``ok`` when nothing is wrong, ``failed`` with a
summary when a warning or error was found, ``partial`` when cold volumes are still thawing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Collection

from zrepl_py.archive.damage import mark_bad
from zrepl_py.audit.deep import Deadline, DeepAudit, DeepResult, ScratchPool, choose
from zrepl_py.audit.findings import Finding, Severity
from zrepl_py.audit.graph import TargetListing, audit_graph, sort_findings
from zrepl_py.audit.load import load_graph_input
from zrepl_py.audit.objects import audit_objects
from zrepl_py.audit.restorable import Coverage, coverage, coverage_findings, stray, strays_of
from zrepl_py.catalog.rows import VolumeRow
from zrepl_py.config.schema import LOCAL_HOST, JobConfig, parse_endpoint, replica_datasets
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
from zrepl_py.locking import dataset_lock, holder
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY, dataset_prefix, volume_index
from zrepl_py.objects.manifest import Manifest
from zrepl_py.objects.sealed import read_with_copy
from zrepl_py.observe.runlog import recorded_run
from zrepl_py.replication.stages import Side
from zrepl_py.runtime.prefetch import Prefetch
from zrepl_py.snapshots.inventory import left_out_now
from zrepl_py.snapshots.selection import covers
from zrepl_py.stores.base import ObjectInfo
from zrepl_py.zfs.names import DatasetName

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


def _targets(ctx: Context, cursors) -> dict[tuple[str, str], TargetListing]:
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


def _scratch(ctx: Context, receive_into: str) -> ScratchPool:
    host, sep, pool = receive_into.partition(":")
    if not sep:
        host, pool = LOCAL_HOST, receive_into
    if host != LOCAL_HOST and host not in ctx.config.hosts:
        raise UsageError(f"--receive-into {receive_into}: host {host!r} is not under [hosts]"
                         f" in {ctx.config_path}")
    name = DatasetName(pool)
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
    with dataset_lock(ctx.state_dir, f"audit {lock_key(job)}", "audit"):
        _refuse_beside_deleters(ctx, job)
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


def _refuse_beside_deleters(ctx: Context, job: JobConfig) -> None:
    """Raise ``Locked`` when a ``DELETERS`` run holds the job's dataset lock."""
    found = holder(ctx.state_dir, lock_key(job))
    if found is not None and found.action in DELETERS:
        raise Locked(f"{lock_key(job)} is locked by {found.describe()}, which deletes what the"
                     " audit would read; nothing done. Run the audit again when it is finished.")


def _recorded_audit(ctx: Context, catalog, name: str, job: JobConfig, *, deep: bool,
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


def _audit(ctx: Context, name: str, job: JobConfig, host: str, root: str, *, deep: bool,
           sample: float | None, receive_into: str | None, deadline: Deadline) -> AuditResult:
    catalog = ctx.catalog()
    prefix = dataset_prefix(host, root)
    # The job's store is listed in a thread while the catalog is read: the listing waits on
    # the store (system calls or HTTP) most of the time (issue 20).
    ahead = []
    if job.archive is not None and job.archive.store in ctx.config.stores:
        backend = ctx.store(job.archive.store)
        ahead.append((job.archive.store, lambda: _listing(backend, prefix)))
    listings = Prefetch(ahead)
    try:
        cursors = catalog.cursors(job=name)
        archives = [(name, job.archive.store)] if job.archive is not None else []
        data = load_graph_input(catalog, host=host, below=root, archives=archives,
                                cursors=cursors, targets=_targets(ctx, cursors))
        return _audit_loaded(ctx, name, job, host, root, data, listings, deep=deep,
                             sample=sample, receive_into=receive_into, deadline=deadline)
    finally:
        listings.close()


def _listing(backend, prefix: str) -> dict[str, ObjectInfo]:
    """Every object under ``prefix`` in ``backend`` by key (one listing)."""
    return {info.key: info for info in backend.list(prefix)}


def _audit_loaded(ctx: Context, name: str, job: JobConfig, host: str, root: str, data,
                  listings: Prefetch, *, deep: bool, sample: float | None,
                  receive_into: str | None, deadline: Deadline) -> AuditResult:
    prefix = dataset_prefix(host, root)
    left_out, notes = _left_out(ctx, job)
    mine = covers(job, left_out)
    covered = [s for s in data.streams if mine(s.dataset)]
    data = dataclasses.replace(
        data, streams=covered,
        archives=[a for a in data.archives if mine(a.dataset)])
    findings = audit_graph(data) + notes
    result = AuditResult(name, [], streams=len(covered))
    stores = sorted({s.store for s in covered} | ({job.archive.store} if job.archive else set()))
    for store in stores:
        if store not in ctx.config.stores:
            findings.append(Finding(
                Severity.WARNING, "objects", f"store {store} holds streams of job {name} but is"
                f" not under [stores] in {ctx.config_path}: its objects were not checked",
                f"add [stores.{store}] back to the config", store=store))
            continue
        backend = ctx.store(store)
        # Not kept here: _audit_store drops the listing once done with it (memory).
        findings += _audit_store(ctx, backend, name, job, host, root, store, deep=deep,
                                 sample=sample, receive_into=receive_into, result=result,
                                 deadline=deadline, left_out=left_out,
                                 listing=listings.take(store, lambda: _listing(backend, prefix)))
    chain = _chain_heads(covered)
    result.findings = sort_findings(
        dataclasses.replace(f, job=name, chain=f.chain if f.chain is not None or f.stream is None
                            else chain.get(f.stream))
        for f in findings)
    return result


def _drop_stale_volume_findings(backend, findings: list[Finding],
                                volumes: dict[int, list[VolumeRow]]) -> list[Finding]:
    """``findings`` without the errors of volumes the listing missed or showed another size
    of, but which the store has now as catalogued (one ``stat`` each): the listing may be
    older than the catalog read (an archive running beside the audit writes its objects
    first and its row last), and a volume error marks its stream bad.

    Raises:
        StoreError: a ``stat`` failed other than by the object being absent.
    """
    sizes = {v.key: v.stored_bytes for rows in volumes.values() for v in rows}
    kept = []
    for finding in findings:
        if (finding.severity is Severity.ERROR and finding.key in sizes
                and volume_index(finding.key) is not None):
            try:
                if backend.stat(finding.key).size == sizes[finding.key]:
                    continue
            except ObjectNotFound:
                pass
        kept.append(finding)
    return kept


def _stray_manifest(backend, prefix: str, leaves: set[str]) -> Manifest | None:
    """The manifest of a stray stream directory (primary, else its copy), None when neither
    is there or readable (the stream is then unrestorable: nothing can describe it)."""
    if MANIFEST not in leaves and MANIFEST_COPY not in leaves:
        return None
    try:
        return read_with_copy(backend, prefix + MANIFEST, Manifest.from_json, StreamCorrupt).value
    except (StreamCorrupt, ObjectNotFound, NeedsThaw, StoreError) as exc:
        log.warning("cannot read the manifest of %s: %s", prefix, exc)
        return None


def _chain_heads(streams) -> dict[int, int]:
    """Stream id -> id of the full its chain starts at (streams whose parents lead to no
    full are left out), following each parent link once."""
    by_id = {s.id: s for s in streams}
    head: dict[int, int | None] = {}
    for start in streams:
        path, cur = [], start
        while cur is not None and cur.id not in head and len(path) <= len(by_id):
            path.append(cur)
            cur = None if cur.kind == "full" else by_id.get(cur.parent_id)
        top = head.get(cur.id) if cur is not None else (
            path[-1].id if path and path[-1].kind == "full" else None)
        for s in path:
            head[s.id] = top
    return {sid: full for sid, full in head.items() if full is not None}


def _audit_store(ctx: Context, backend, name: str, job: JobConfig, host: str, root: str,
                 store: str, *, deep: bool, sample: float | None, receive_into: str | None,
                 result: AuditResult, deadline: Deadline, listing: dict[str, ObjectInfo],
                 left_out: Collection[str]) -> list[Finding]:
    catalog = ctx.catalog()
    every = catalog.bulk_streams(host=host, below=root, store=store)
    covered = covers(job, left_out)
    mine = [s for s in every if covered(s.dataset)]
    volumes = catalog.bulk_volumes(host=host, below=root, store=store)
    carried = catalog.bulk_carried(host=host, below=root, store=store)
    # --deep reads every manifest again, as it reads the volumes.
    stamps = {} if deep else catalog.manifest_stamps(host=host, below=root, store=store)
    now = ctx.clock.now()
    checked = audit_objects(backend, mine, volumes, carried, listing, known_streams=every,
                            concurrency=ctx.config.stores[store].upload_concurrency,
                            stamps=stamps, now=now)
    findings = _drop_stale_volume_findings(backend, checked.findings, volumes)
    result.manifests_read += checked.read
    result.manifests_trusted += checked.trusted
    if checked.wrong:
        catalog.forget_manifest_stamps(checked.wrong)  # --deep reads them without stamps
    if checked.seen:
        catalog.stamp_manifests(checked.seen, now)
    # A volume missing or of the wrong size makes its stream unrestorable: marked bad (issue
    # 15), so restores stop before it and the next archive starts a new full.
    unreadable = {f.stream: f.problem for f in findings if f.severity is Severity.ERROR
                  and f.key is not None and volume_index(f.key) is not None}
    by_id = {s.id: s for s in mine}
    marked = [stream_id for stream_id, problem in unreadable.items()
              if mark_bad(catalog, by_id[stream_id], problem, ctx.clock.now(), job=name,
                          action="audit")]
    result.bad += marked
    mine = [dataclasses.replace(s, state="bad") if s.id in marked else s for s in mine]
    strays = [stray(host, dataset, store, prefix, leaves, _stray_manifest(backend, prefix, leaves))
              for prefix, (dataset, leaves) in strays_of(
                  listing, {s.object_prefix for s in every}, host, store).items()
              if covered(dataset)]
    del listing  # the largest structure of a large audit, no longer needed
    running = holder(ctx.state_dir, lock_key(job))
    found = coverage(mine, carried, strays,
                     catalog.known_snapshots(host=host, below=root),
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
    scratch = _scratch(ctx, receive_into) if receive_into else None
    outcome: DeepResult = DeepAudit(backend, catalog, volumes, carried, ctx.clock.now,
                                    ctx.config.restore, deadline, job=name).run(chosen, mine,
                                                                                scratch)
    result.verified += outcome.verified
    result.bad += outcome.bad
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
       ``s3_mp_cleanup.py``, RELIABILITY 15);
    2. streams left ``condemned`` by a prune that stopped are finished as prune does: their
       objects, then their rows, leaf first (``pruning.chain_delete.delete_stream``).

    Held under the job's dataset lock, like prune, and the job's audit lock (no plain audit
    of the job reads while it deletes).

    Raises:
        Locked: another run holds the job's dataset lock (exit 3).
        CatalogError: listing the catalog's streams failed (store failures go in the result).
    """
    from zrepl_py.pruning.chain_delete import delete_stream  # noqa: PLC0415

    source = job.source
    catalog = ctx.catalog()
    result = RepairResult(name)
    with dataset_lock(ctx.state_dir, f"audit {lock_key(job)}", "audit --repair"), \
            dataset_lock(ctx.state_dir, lock_key(job), "audit --repair"):
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
