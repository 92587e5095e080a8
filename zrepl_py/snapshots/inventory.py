"""A job's datasets and snapshots as ZFS lists them now, mirrored into the catalog.

One ``zfs get`` per job tree (never one command per snapshot), plus one ``zfs get`` of the
select property (and ``written``, when asked) with their sources where the job needs them;
the datasets the job works on are chosen by ``snapshots.selection``. The catalog's snapshot
rows of those datasets are brought in line (new ones added, vanished ones tombstoned) on
every listing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING

from zrepl_py.catalog.rows import SnapshotFact
from zrepl_py.checks.preflight import Check
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.schema import replica_datasets
from zrepl_py.snapshots.selection import Selection, select_datasets
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.model import DatasetInfo, PropertyValue, Tree
from zrepl_py.zfs.names import DatasetName

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.invocation.context import Context


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The job's tree as listed, the datasets the job covers (the selection's), the
    selection itself (what was left out and why), each covered dataset's ``written`` bytes
    when they were asked for and this ZFS has them (else empty), and the clones of its
    snapshots found anywhere in the pool (``{snapshot: [clone, ...]}``)."""

    tree: Tree
    datasets: tuple[DatasetInfo, ...]
    clones: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    selection: Selection | None = None
    written: Mapping[DatasetName, int] = dataclasses.field(default_factory=dict)

    @property
    def left_out(self) -> tuple[str, ...]:
        """Names of the listed datasets the selection left out (``Selection.skipped``)."""
        return self.selection.left_out if self.selection else ()


def list_selection(
    zfs: Zfs, job: JobConfig, replicas: Mapping[DatasetName, str], *, written: bool = False
) -> tuple[Tree, Selection, dict[DatasetName, int]]:
    """List the job's tree and choose its datasets (``snapshots.selection``), touching no
    catalog.

    Commands: the tree listing (``Zfs.tree``); with ``job.select`` or ``written``, one
    ``zfs get`` of the property and/or ``written`` with their sources
    (``Zfs.dataset_properties``); for a value inherited from above the root, one more
    ``zfs get`` of where it is set (its source says whether it was received).

    Args:
        zfs: client for the job's source host.
        job: the job (dataset, recursive, exclude, select).
        replicas: ``config.schema.replica_datasets`` of the job's source host.
        written: also read each dataset's ``written`` (only where
            ``zfs.capabilities.written``; else the returned map is empty).

    Returns:
        ``(tree, selection, {dataset: written bytes})``.

    Raises:
        DatasetNotFound: the job's dataset does not exist.
        ZfsError: a listing failed.
    """
    source = job.source
    tree = zfs.tree(source.dataset, recursive=job.recursive)
    props = [job.select.property] if job.select is not None else []
    if written and zfs.capabilities.written:
        props.append("written")
    listed = zfs.dataset_properties(source.dataset, props, recursive=job.recursive) if props else {}
    values: dict[DatasetName, PropertyValue] = {}
    setpoints: dict[str, str] = {}
    if job.select is not None:
        prop = job.select.property
        values = {name: got[prop] for name, got in listed.items() if prop in got}
        for origin in sorted({v.inherited_from for v in values.values()
                              if v.inherited_from and v.inherited_from not in values}):
            above = zfs.dataset_properties(origin, [prop], recursive=False)
            setpoints[origin] = above.get(DatasetName(origin), {}).get(
                prop, PropertyValue("-", "-")).source
    selection = select_datasets([d.name for d in tree.datasets], source.dataset,
                                exclude=job.exclude, select=job.select, values=values,
                                setpoints=setpoints, replicas=replicas)
    sizes = {name: int(got["written"].value) for name, got in listed.items()
             if "written" in got and got["written"].value.isdigit()}
    return tree, selection, sizes


def take_inventory(
    zfs: Zfs,
    catalog: Catalog,
    job: JobConfig,
    now: dt.datetime,
    *,
    replicas: Mapping[DatasetName, str],
    with_clones: bool = False,
    written: bool = False,
) -> Inventory:
    """List and select the job's datasets (``list_selection``) and sync the catalog's
    snapshot rows of the selected ones.

    With ``with_clones`` (pruning needs it) also list the clones of the pool, one more
    command: a clone can live anywhere in its origin's pool.

    Args:
        zfs: client for the job's source host.
        catalog: the catalog to update.
        job: the job (source dataset, recursive, exclude, select).
        now: aware UTC time used for first-seen and tombstone stamps.
        replicas: ``config.schema.replica_datasets`` of the job's source host.
        with_clones: fill ``Inventory.clones`` (else it is empty).
        written: fill ``Inventory.written`` where this ZFS has the property.

    Raises:
        DatasetNotFound: the job's dataset does not exist.
        ZfsError, CatalogError: listing or recording failed.
    """
    source = job.source
    tree, selection, sizes = list_selection(zfs, job, replicas, written=written)
    chosen = set(selection.selected)
    covered = tuple(d for d in tree.datasets if d.name in chosen)
    for dataset in covered:
        facts = [
            SnapshotFact(name=s.short, guid=s.guid, createtxg=s.createtxg, creation=s.creation)
            for s in tree.snapshots(dataset.name)
        ]
        catalog.sync_snapshots(source.host, str(dataset.name), facts, now)
    clones = {}
    if with_clones:
        clones = {str(snap): tuple(map(str, found))
                  for snap, found in zfs.clones(source.dataset.pool).items()}
    return Inventory(tree=tree, datasets=covered, clones=clones, selection=selection,
                     written={name: sizes[name] for name in chosen if name in sizes})


def left_out_now(zfs: Zfs, job: JobConfig, replicas: Mapping[DatasetName, str]) -> tuple[str, ...]:
    """Names of the datasets below the job's root that its selection leaves out now (one
    listing, ``list_selection``, no catalog): what a view built from the catalog by name
    (audit, status) leaves out to see the same datasets as the job's runs.

    Raises:
        DatasetNotFound, ZfsError, HostUnreachable: the source could not be listed.
    """
    return list_selection(zfs, job, replicas)[1].left_out


def selection_check(ctx: Context, name: str, job: JobConfig, zfs: Zfs) -> Check | None:
    """``zbak init``'s row for a job with ``[select]`` or ``min_change``
    (``checks.preflight.SourceCheck``): how many datasets it selects now, failing when none
    (a mistyped value would back up nothing), and whether the host can apply
    ``min_change``; None for other jobs.

    Raises:
        ZbakError: the source could not be listed.
    """
    if job.select is None and not job.snapshot.min_change:
        return None
    _, selection, _ = list_selection(zfs, job, replica_datasets(ctx.config, job.source.host))
    detail = (f"selects {len(selection.selected)} dataset(s), leaves out "
              f"{len(selection.skipped)} (zbak list datasets {name} shows which and why)")
    if job.snapshot.min_change and not zfs.capabilities.written:
        detail += ("; min_change cannot be applied: this ZFS has no 'written' property, so"
                   " every selected dataset is snapshotted")
    return Check(f"job {name}: selection", bool(selection.selected), detail)
