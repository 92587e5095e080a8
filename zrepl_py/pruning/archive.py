"""Archive retention for one job: per dataset, check the store, plan whole chains, delete.

Per dataset of the job (the catalog's streams below the job's dataset, excludes left out,
including datasets since destroyed on the source, and leaving out datasets the job's
selection leaves out now: another job's datasets under a shared root, ``select``) in the
job's store: the pure planner
(``pruning.chain_plan``) decides; when the plan deletes something, a listing of the store
finds streams with missing objects (``pruning.chain_delete.find_damaged``; one listing of
the job's tree and one read of its volume rows for every dataset,
docs/decisions.md#catalog-commands-stay-fast-at-100000-streams) and the plan is made again knowing
them; unless it is a dry run ``pruning.chain_delete`` executes, re-checking each chain that releases
a deleted one first (``pruning.recheck``; the plan counts the objects it will check); a dataset with
a damaged stream is refused whole (``StoreInconsistent``, nothing deleted), and so is one whose
releasing chain fails the re-check (``ReleaserMismatch``). A dataset whose store or catalog fails is
reported and the others still run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Generic, TypeVar, cast

from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import StreamRow, VolumeRow
from zrepl_py.config.archive import ArchiveConfig
from zrepl_py.config.jobs import JobConfig
from zrepl_py.errors import StoreInconsistent, UsageError, ZbakError
from zrepl_py.objects.layout import dataset_prefix
from zrepl_py.pruning.chain_delete import ChainPruneOutcome, execute_chain_prune, find_damaged
from zrepl_py.pruning.chain_plan import ChainPlan, ChainRetention, plan_chain_retention
from zrepl_py.pruning.recheck import planned_objects
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
    """Archive retention of one job in its store, dataset by dataset."""

    store: str
    datasets: list[DatasetChains] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def failed(self) -> bool:
        """True when the store could not be opened or any dataset failed."""
        return bool(self.error) or any(d.failed for d in self.datasets)


def chain_retention(cfg: ArchiveConfig, *, accept_early_delete_fee: bool) -> ChainRetention:
    """The planner's policy from ``[jobs.NAME.archive]`` and the command-line flag."""
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


class StoreCheck:
    """What the damage check reads (``chain_delete.find_damaged``), each on first need and
    once, a failure included (one failed listing of the job's tree is not retried for
    every dataset): a listing of ``prefix`` (``{key: stored bytes}``) and the catalog's
    volume rows of the streams in scope (``read_volumes()``: ``{stream id: rows}``)."""

    def __init__(self, backend: Backend, prefix: str,
                 read_volumes: Callable[[], Mapping[int, Sequence[VolumeRow]]]):
        self._listing = _Once(lambda: backend.sizes(prefix))
        self._volumes = _Once(read_volumes)

    @property
    def listing(self) -> Mapping[str, int]:
        """The listing (raises ``StoreError``)."""
        return self._listing.get()

    @property
    def volumes(self) -> Mapping[int, Sequence[VolumeRow]]:
        """The volume rows (raises ``CatalogError``)."""
        return self._volumes.get()


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


def prune_dataset_chains(
    backend: Backend,
    catalog: Catalog,
    dataset: str,
    streams: Sequence[StreamRow],
    policy: ChainRetention,
    now: dt.datetime,
    *,
    dry_run: bool,
    check: StoreCheck,
) -> DatasetChains:
    """Plan, check and (unless ``dry_run``) execute retention for one dataset's ``streams``
    (all of one store). Store and catalog errors are reported in the result.

    The plan is made first; only when it deletes or finishes something is the store
    checked for damaged streams (``check``: the listing and volume rows it reads once for
    the job's tree) and the plan made again with what is damaged: a
    damaged stream only ever keeps more, so a plan that deletes nothing needs no check
    (a prune of 100,000 streams then lists nothing; ``zbak audit`` checks every
    object).
    """
    result = DatasetChains(dataset, None)
    try:
        result.plan = plan_chain_retention(streams, policy, now)
        if result.plan.to_delete or result.plan.unfinished:
            result.damaged = find_damaged(check.listing, check.volumes, streams)
            if result.damaged:
                result.plan = plan_chain_retention(streams, policy, now, damaged=result.damaged)
            result.recheck_planned = {chain[0].id: planned_objects(check.volumes, chain)
                                      for chain in result.plan.releasers}
    except ZbakError as exc:
        log.error("checking the chains of %s in store %s failed: %s", dataset, backend.name, exc)
        result.error = str(exc)
        return result
    for stream_id, what in result.damaged.items():
        log.warning("stream %d of %s in store %s is damaged (%s): its chain is left alone;"
                    " run zbak audit", stream_id, dataset, backend.name, what)
    if result.plan.refused:
        # docs/reliability.md#r19-prune-refuses-on-an-inconsistent-store: an inconsistent store is
        # an error of the run, dry or not.
        result.error = str(StoreInconsistent(f"{dataset} in store {backend.name}:"
                                             f" {result.plan.refused}"))
        log.error("prune refused: %s", result.error)
        return result
    if not dry_run:
        result.outcome = execute_chain_prune(result.plan, backend, catalog, now=now)
    return result


def prune_archive(
    backend: Backend,
    catalog: Catalog,
    job: JobConfig,
    streams: Sequence[StreamRow],
    now: dt.datetime,
    *,
    dry_run: bool,
    accept_early_delete_fee: bool,
    left_out: Collection[str] = (),
) -> ArchivePruneResult:
    """Apply the job's archive retention to every dataset it has streams of in ``backend``
    (``job_streams``; ``left_out`` as there).

    Args:
        streams: the catalog's streams of the job's host at or below its dataset, any
            store (``Catalog.bulk_streams``).

    Raises:
        UsageError: the job has no ``[archive]`` section.
    """
    cfg = job.archive
    if cfg is None:
        raise UsageError("this job has no [archive] section")
    policy = chain_retention(cfg, accept_early_delete_fee=accept_early_delete_fee)
    result = ArchivePruneResult(cfg.store)
    source = job.source
    root = str(source.dataset)
    # One listing of the job's tree and one read of its volume rows serve every dataset
    # that needs the check (one per dataset cost 218 s for 100,000 streams).
    check = StoreCheck(backend, dataset_prefix(source.host, root), lambda: catalog.bulk_volumes(
        host=source.host, below=root, store=cfg.store))
    for dataset, rows in job_streams(job, streams, cfg.store, left_out=left_out).items():
        result.datasets.append(prune_dataset_chains(backend, catalog, dataset, rows, policy,
                                                    now, dry_run=dry_run, check=check))
    return result
