"""A job's datasets and snapshots as ZFS lists them now, mirrored into the catalog.

One ``zfs get`` per job tree (never one command per snapshot); the catalog's snapshot rows
are brought in line (new ones added, vanished ones tombstoned) on every listing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Mapping, Sequence

from zrepl_py.catalog.rows import SnapshotFact
from zrepl_py.config.schema import JobConfig
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.model import DatasetInfo, Tree
from zrepl_py.zfs.names import DatasetName

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog


def is_excluded(dataset: DatasetName, root: DatasetName, exclude: Sequence[str]) -> bool:
    """True when ``dataset`` or one of its ancestors below ``root`` (a job's dataset) is in
    ``exclude`` (the job's ``exclude``: entries relative to ``root``, ``scratch`` or
    ``vm/tmp``, or absolute, ``tank/data/scratch``). ``root`` itself is never excluded.
    """
    if dataset == root:
        return False
    relative = dataset.relative_to(root)
    for entry in exclude:
        rel = DatasetName(entry).relative_to(root) if entry.startswith(f"{root}/") else entry
        if relative == rel or relative.startswith(rel + "/"):
            return True
    return False


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The job's tree as listed, the datasets the job covers (excludes removed), and the
    clones of its snapshots found anywhere in the pool (``{snapshot: [clone, ...]}``)."""

    tree: Tree
    datasets: tuple[DatasetInfo, ...]
    clones: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def take_inventory(
    zfs: Zfs, catalog: Catalog, job: JobConfig, now: dt.datetime, *, with_clones: bool = False
) -> Inventory:
    """List the job's tree (one command) and sync the catalog's snapshot rows.

    With ``with_clones`` (pruning needs it) also list the clones of the pool, a second
    command: a clone can live anywhere in its origin's pool.

    Args:
        zfs: client for the job's source host.
        catalog: the catalog to update.
        job: the job (source dataset, recursive, exclude).
        now: aware UTC time used for first-seen and tombstone stamps.
        with_clones: fill ``Inventory.clones`` (else it is empty).

    Raises:
        DatasetNotFound: the job's dataset does not exist.
        ZfsError, CatalogError: listing or recording failed.
    """
    source = job.source
    tree = zfs.tree(source.dataset, recursive=job.recursive)
    covered = tuple(d for d in tree.datasets
                    if not is_excluded(d.name, source.dataset, job.exclude))
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
    return Inventory(tree=tree, datasets=covered, clones=clones)
