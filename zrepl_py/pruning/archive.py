"""Chain retention for one job in each of its stores: per dataset, plan every store's whole
chains together, check the stores, delete.

The stores are the job's archive store and each ``[jobs.NAME.copy.STORE]`` store
(``job_stores``; a copy without ``retention`` is not pruned but holds copies). Per dataset of
the job (the catalog's streams below the job's dataset, excludes left out, including datasets
since destroyed on the source, and leaving out datasets the job's selection leaves out now:
another job's datasets under a shared root, ``select``): the pure planner
(``pruning.chain_plan``) decides for each pruned store; when a plan deletes something, a
listing of each store finds streams with missing objects (``pruning.chain_delete.find_damaged``;
one listing of the job's tree and one read of its volume rows per store for every dataset,
docs/decisions.md#catalog-commands-stay-fast-at-100000-streams) and the plans are made again
knowing them; then no store deletes the last sound copy of a stream another store's retention
wants (``pruning.last_copy``, docs/decisions.md#retention-across-stores). Unless it is a dry
run ``pruning.chain_delete`` executes each store's plan, re-checking each chain that releases a
deleted one first (``pruning.recheck``; the plan counts the objects it will check); a dataset
with a damaged stream is refused whole in that store (``StoreInconsistent``, nothing deleted),
and so is one whose releasing chain fails the re-check (``ReleaserMismatch``). A dataset whose
store or catalog fails is reported and the others still run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Generic, TypeVar, cast

from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import ManifestLock, StreamRow, VolumeRow, recorded_versions
from zrepl_py.config.archive import ChainRetentionConfig
from zrepl_py.config.jobs import JobConfig
from zrepl_py.errors import StoreError, StoreInconsistent, ZbakError
from zrepl_py.objects.layout import dataset_prefix
from zrepl_py.objects.versions import pin
from zrepl_py.pruning.chain_delete import ChainPruneOutcome, execute_chain_prune, find_damaged
from zrepl_py.pruning.chain_plan import (
    ChainPlan,
    ChainRetention,
    locked_until,
    plan_chain_retention,
)
from zrepl_py.pruning.last_copy import StorePlan, keep_last_copies, wanted_prefixes
from zrepl_py.pruning.recheck import planned_objects
from zrepl_py.pruning.unknown_versions import UnknownVersions
from zrepl_py.snapshots.selection import covers
from zrepl_py.stores.base import Backend

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclasses.dataclass
class DatasetChains:
    """One dataset's chains in the store: the plan, the streams found damaged
    (``{stream id: what}``), the objects to re-check per releasing chain (``{full stream
    id: objects}``), what executing did (None on a dry run), or the error."""

    dataset: str
    plan: ChainPlan | None
    damaged: dict[int, str] = dataclasses.field(default_factory=dict)
    recheck_planned: dict[int, int] = dataclasses.field(default_factory=dict)
    outcome: ChainPruneOutcome | None = None
    error: str | None = None

    @property
    def problem(self) -> str | None:
        """The error planning or executing stopped on, else None."""
        return self.error or (self.outcome.error if self.outcome is not None else None)

    @property
    def failed(self) -> bool:
        """True when planning or executing stopped on an error."""
        return bool(self.problem)


@dataclasses.dataclass
class ArchivePruneResult:
    """Archive retention of one job in its store, dataset by dataset, and on a store that
    keeps versions the versions of its keys the catalog does not know (``versions``;
    ``pruning.unknown_versions``; None elsewhere or when not reached)."""

    store: str
    datasets: list[DatasetChains] = dataclasses.field(default_factory=list)
    error: str | None = None
    versions: UnknownVersions | None = None

    @property
    def failed(self) -> bool:
        """True when the store could not be opened, any dataset failed, or deleting the
        unknown versions stopped."""
        return (bool(self.error) or any(d.failed for d in self.datasets)
                or bool(self.versions and self.versions.error))


def chain_retention(cfg: ChainRetentionConfig, *,
                    accept_early_delete_fee: bool) -> ChainRetention:
    """The planner's policy from ``[jobs.NAME.archive]`` (or a copy's ``retention``) and the
    command-line flag."""
    return ChainRetention(cfg.keep_chains, cfg.max_age, cfg.min_storage_durations(),
                          accept_early_delete_fee, cfg.reverify_after)


def job_streams(job: JobConfig, streams: Sequence[StreamRow], store: str, *,
                left_out: Collection[str] = ()) -> dict[str, list[StreamRow]]:
    """The streams of ``store`` that belong to the job's datasets, by dataset name: the
    job's dataset, and with ``recursive`` its descendants that are not excluded, nor in
    ``left_out`` (datasets the job's selection left out in this run's listing,
    ``Selection.skipped``; a dataset no longer listed, destroyed, still counts)."""
    host = job.source.host
    covered = covers(job, left_out)
    found: dict[str, list[StreamRow]] = {}
    for s in streams:
        if s.store == store and s.host == host and covered(s.dataset):
            found.setdefault(s.dataset, []).append(s)
    return found


def in_store(job: JobConfig, streams: Sequence[StreamRow], store: str) -> list[StreamRow]:
    """The job's streams among ``streams`` that are in ``store``, in chain order per dataset,
    the datasets by name (:func:`job_streams`, flattened)."""
    by_dataset = job_streams(job, streams, store)
    return [s for dataset in sorted(by_dataset) for s in by_dataset[dataset]]


def store_streams(catalog: Catalog, job: JobConfig, store: str) -> list[StreamRow]:
    """:func:`in_store` of the catalog's streams of the job's tree in ``store`` (one read):
    what a store's catalog export lists, and what a copy compares.

    Raises:
        CatalogError: the catalog cannot be read.
    """
    source = job.source
    return in_store(job, catalog.bulk_streams(host=source.host, below=str(source.dataset),
                                              store=store), store)


class StoreCheck:
    """What the damage check reads (``chain_delete.find_damaged``), each on first need and
    once, a failure included (one failed listing of the job's tree is not retried for
    every dataset): a listing of ``prefix`` (``{key: stored bytes}``), the catalog's
    volume rows of the streams in scope (``read_volumes()``: ``{stream id: rows}``) and, for
    the lock wait on a store that keeps versions, their recorded manifest locks
    (``read_manifests(stream ids)``: ``Catalog.manifest_locks``; none without it).

    On a store that keeps versions (Object Lock) the listing shows zbak's own version of
    each key (``objects.versions.pin`` of one version listing of ``prefix``), as ``zbak
    audit`` reads it: an intruder's overwrite or delete marker does not make a stream
    damaged (docs/security.md#prune-on-a-lock-store)."""

    def __init__(self, backend: Backend, prefix: str,
                 read_volumes: Callable[[], Mapping[int, Sequence[VolumeRow]]],
                 read_manifests: Callable[[Iterable[int]], Sequence[ManifestLock]] | None = None):
        self._volumes = _Once(read_volumes)
        self._listing = _Once(lambda: self._sizes(backend, prefix))
        self._manifests = _Once(lambda: [] if read_manifests is None
                                else read_manifests(self.volumes))

    def _sizes(self, backend: Backend, prefix: str) -> dict[str, int]:
        if not backend.keeps_versions:
            return backend.sizes(prefix)
        pinned = pin(backend.list_versions(prefix), recorded_versions(self.volumes))
        return {key: info.size for key, info in pinned.listing.items()}

    @property
    def listing(self) -> Mapping[str, int]:
        """The listing (raises ``StoreError``)."""
        return self._listing.get()

    @property
    def volumes(self) -> Mapping[int, Sequence[VolumeRow]]:
        """The volume rows (raises ``CatalogError``)."""
        return self._volumes.get()

    @property
    def manifests(self) -> Sequence[ManifestLock]:
        """The manifest locks of the streams with volume rows (raises ``CatalogError``)."""
        return self._manifests.get()


class _Once(Generic[T]):
    """``read()`` on the first ``get`` only; later calls return its value or raise its
    ZbakError again."""

    def __init__(self, read: Callable[[], T]):
        self._read: Callable[[], T] | None = read
        self._value: T | None = None
        self._error: ZbakError | None = None

    def get(self) -> T:
        if self._read is not None:
            try:
                self._value = self._read()
            except ZbakError as exc:
                self._error = exc
            self._read = None  # (another exception leaves it to be tried again)
        if self._error is not None:
            raise self._error
        return cast(T, self._value)  # set by the read that raised no error


@dataclasses.dataclass
class StoreScope:
    """One store of a job's prune: its name, its backend (None: it could not be opened, so
    none of its copies counts as sound), its retention (None: it is not pruned, only holds
    copies) and the damage check of the job's tree in it (None with no backend)."""

    name: str
    backend: Backend | None
    policy: ChainRetention | None
    check: StoreCheck | None


def plan_dataset_chains(
    scopes: Sequence[StoreScope],
    dataset: str,
    streams: Mapping[str, Sequence[StreamRow]],
    now: dt.datetime,
) -> dict[str, DatasetChains]:
    """Plan retention for one dataset in every pruned store of ``scopes`` (the job's order:
    the archive store first), store and catalog errors reported in the results.

    Each pruned store's own plan is made first; only when one of them deletes or finishes
    something are the stores checked for damaged streams (``check``: the listing and volume
    rows read once for the job's tree) and the plans made again with what is damaged: a
    damaged stream only ever keeps more, so a plan that deletes nothing needs no check (a
    prune of 100,000 streams then lists nothing; ``zbak audit`` checks every object). On a
    store with Object Lock the plan is also made knowing each stream's latest lock
    (``chain_plan.locked_until`` of the volume rows): a locked chain waits. Then
    no store deletes the last sound copy of a stream some store's retention wants
    (``pruning.last_copy``; a store whose check failed holds no sound copy).

    Args:
        streams: the dataset's streams by store name (the stores of ``scopes``).

    Returns:
        ``{store: DatasetChains}`` for each pruned store that holds streams of the dataset.
    """
    pruned = [p for p in scopes if p.policy is not None and streams.get(p.name)]
    results = {p.name: DatasetChains(dataset, None) for p in pruned}
    damaged: dict[str, dict[int, str]] = {}
    try:
        plans = {p.name: plan_chain_retention(streams[p.name], p.policy, now)
                 for p in pruned if p.policy is not None}
        if any(plan.to_delete or plan.unfinished for plan in plans.values()):
            for scope in scopes:
                damaged[scope.name], error = _damaged(scope, streams.get(scope.name, ()))
                if error is not None and scope.name in plans:
                    del plans[scope.name]  # this store is not pruned now; see its error
                    results[scope.name].error = error
                elif scope.policy is not None and scope.name in plans:
                    locked = _locked(scope, streams[scope.name])
                    if damaged[scope.name] or locked:
                        plans[scope.name] = plan_chain_retention(
                            streams[scope.name], scope.policy, now, damaged=damaged[scope.name],
                            locked=locked)
        kept = _across_stores([(p.name, p.policy) for p in scopes], streams, plans, damaged,
                              now)
    except ZbakError as exc:
        log.error("checking the chains of %s failed: %s", dataset, exc)
        for result in results.values():
            result.error = str(exc)
        return results
    for scope in pruned:
        result = results[scope.name]
        if scope.name in kept:
            result.plan, result.damaged = kept[scope.name], damaged.get(scope.name, {})
            _finish_plan(scope, result)
    return results


def _across_stores(stores: Sequence[tuple[str, ChainRetention | None]],
                   streams: Mapping[str, Sequence[StreamRow]], plans: Mapping[str, ChainPlan],
                   damaged: Mapping[str, Mapping[int, str]],
                   now: dt.datetime) -> Mapping[str, ChainPlan]:
    """``plans`` (one per pruned store, of one dataset) changed so that no store deletes the
    last sound copy of a stream some store's retention wants (``pruning.last_copy``), over
    each store's ``streams`` and ``damaged`` ones; with one store, ``plans`` as they are (its
    own plan keeps all its retention wants). ``stores``: ``(name, retention or None)`` in the
    job's order (pure)."""
    if len(stores) <= 1:
        return plans
    every = [s for name, _ in stores for s in streams.get(name, ())]
    wanted = {name: wanted_prefixes(policy, every, now) for name, policy in stores}
    return keep_last_copies([StorePlan(name, plans.get(name), damaged.get(name, {}))
                             for name, _ in stores], every, wanted)


def _damaged(scope: StoreScope, streams: Sequence[StreamRow]) -> tuple[dict[int, str], str | None]:
    """``find_damaged`` of ``streams`` in the scope's store, and None; when the store could
    not be opened or listed (``StoreError``), every stream (no copy there counts as sound)
    and why.

    Raises:
        CatalogError: the volume rows could not be read.
    """
    if not streams:
        return {}, None
    error = None
    if scope.check is None:
        error = "the store could not be opened"
    else:
        try:
            return find_damaged(scope.check.listing, scope.check.volumes, streams), None
        except StoreError as exc:
            log.error("listing store %s failed: %s", scope.name, exc)
            error = str(exc)
    return dict.fromkeys((s.id for s in streams), error), error


def _locked(scope: StoreScope, streams: Sequence[StreamRow]) -> dict[int, dt.datetime]:
    """``chain_plan.locked_until`` of ``streams`` in the scope's store when it keeps versions
    (Object Lock), else nothing.

    Raises:
        CatalogError: the volume rows could not be read.
    """
    if scope.backend is None or scope.check is None or not scope.backend.keeps_versions:
        return {}
    return locked_until(scope.check.volumes, streams, scope.check.manifests)


def _finish_plan(scope: StoreScope, result: DatasetChains) -> None:
    """Log the damaged streams, count the objects of each releasing chain to re-check, and
    turn a refused plan into the result's error."""
    assert result.plan is not None and scope.check is not None
    for stream_id, what in result.damaged.items():
        log.warning("stream %d of %s in store %s is damaged (%s): its chain is left alone;"
                    " run zbak audit", stream_id, result.dataset, scope.name, what)
    try:
        result.recheck_planned = {chain[0].id: planned_objects(scope.check.volumes, chain)
                                  for chain in result.plan.releasers}
    except ZbakError as exc:
        log.error("reading the volumes of %s in store %s failed: %s", result.dataset,
                  scope.name, exc)
        result.error = str(exc)
        return
    if result.plan.refused:
        # docs/reliability.md#r19-prune-refuses-on-an-inconsistent-store: an inconsistent store
        # is an error of the run, dry or not.
        result.error = str(StoreInconsistent(f"{result.dataset} in store {scope.name}:"
                                             f" {result.plan.refused}"))
        log.error("prune refused: %s", result.error)


def execute_dataset_chains(result: DatasetChains, backend: Backend, catalog: Catalog,
                           now: dt.datetime,
                           stores: Mapping[str, Backend] | None = None) -> None:
    """Carry out a planned result of :func:`plan_dataset_chains` (nothing when it has an
    error); what executing did goes in ``result.outcome``. ``stores``: the backends of the
    job's stores by name, for the re-check of the copies a delete relies on (a copy in a
    store not given counts as gone, ``pruning.chain_delete``)."""
    if result.plan is not None and result.error is None:
        result.outcome = execute_chain_prune(result.plan, backend, catalog, now=now,
                                             stores=stores)


def job_stores(job: JobConfig, *, accept_early_delete_fee: bool
               ) -> list[tuple[str, ChainRetention | None]]:
    """The stores a prune of ``job`` looks at, in order: the archive store, then each store
    of ``[jobs.NAME.copy.STORE]``; each with its retention (None: a copy without
    ``retention``, kept whole)."""
    found: dict[str, ChainRetention | None] = {}
    if job.archive is not None:
        found[job.archive.store] = chain_retention(
            job.archive, accept_early_delete_fee=accept_early_delete_fee)
    for store, copy in job.copies.items():
        found.setdefault(store, None if copy.retention is None else chain_retention(
            copy.retention, accept_early_delete_fee=accept_early_delete_fee))
    return list(found.items())


def released_streams(job: JobConfig, streams: Sequence[StreamRow], store: str,
                     now: dt.datetime) -> frozenset[int]:
    """Ids of the job's streams in ``store`` whose chain the job's retention releases at
    ``now``: what ``zbak prune`` would delete but for their Object Lock (each store's
    ``plan_chain_retention``, then ``keep_last_copies`` across the job's stores, nothing
    taken as damaged: a damaged stream only keeps more). The rolling lock stops extending
    them, so their locks lapse and prune can delete them (docs/security.md#prune-on-a-lock-store);
    a chain retention still wants, or the last sound copy of a stream another store wants,
    is never among them (pure).

    Args:
        streams: the catalog's streams of the job's host at or below its dataset, every
            store (``Catalog.bulk_streams``).
        store: the store whose locks are rolled.
        now: aware UTC.
    """
    stores = job_stores(job, accept_early_delete_fee=False)
    if dict(stores).get(store) is None:
        return frozenset()  # a store without retention keeps every chain
    by_store = {name: job_streams(job, streams, name) for name, _ in stores}
    released: set[int] = set()
    for dataset in by_store[store]:
        found = {name: by_store[name].get(dataset, []) for name, _ in stores}
        plans = _across_stores(stores, found, {
            name: plan_chain_retention(found[name], policy, now)
            for name, policy in stores if policy is not None and found[name]}, {}, now)
        released.update(d.stream.id for chain in plans[store].to_delete for d in chain.streams)
    return frozenset(released)


def plan_stores(
    scopes: Sequence[StoreScope],
    job: JobConfig,
    streams: Sequence[StreamRow],
    now: dt.datetime,
    *,
    left_out: Collection[str] = (),
) -> dict[str, ArchivePruneResult]:
    """Plan the retention of every pruned store of ``scopes`` for every dataset of the job
    (``job_streams``; ``left_out`` as there), dataset by dataset (``plan_dataset_chains``).

    Args:
        streams: the catalog's streams of the job's host at or below its dataset, any
            store (``Catalog.bulk_streams``).

    Returns:
        ``{store: result}`` for each pruned store, datasets planned and not executed.
    """
    by_store = {p.name: job_streams(job, streams, p.name, left_out=left_out) for p in scopes}
    results = {p.name: ArchivePruneResult(p.name) for p in scopes if p.policy is not None}
    datasets = sorted({d for found in by_store.values() for d in found})
    for dataset in datasets:
        planned = plan_dataset_chains(
            scopes, dataset, {p.name: by_store[p.name].get(dataset, []) for p in scopes}, now)
        for name, result in planned.items():
            results[name].datasets.append(result)
    return results


def store_check(backend: Backend, catalog: Catalog, job: JobConfig, store: str) -> StoreCheck:
    """The damage check of the job's tree in ``store``: one listing of the tree and one read
    of its volume rows serve every dataset that needs it (one per dataset cost 218 s for
    100,000 streams)."""
    source = job.source
    root = str(source.dataset)
    return StoreCheck(backend, dataset_prefix(source.host, root), lambda: catalog.bulk_volumes(
        host=source.host, below=root, store=store), catalog.manifest_locks)
