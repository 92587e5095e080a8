"""Take a job's snapshot now: ``PREFIX_YYYYMMDDTHHMMSSZ``, atomic across the tree when possible.

``plan_snapshot`` (PURE) decides which selected datasets get the snapshot and with which
command; ``take_snapshot`` runs it. How a dataset skipped by ``min_change`` fits the
atomic snapshot (docs/decisions.md#unchanged-datasets-skip-their-snapshot-atomically): the datasets
that changed are snapshotted together in ONE multi-name ``zfs snapshot A@x B@y ...``, which OpenZFS
creates atomically in one transaction group (zfs-snapshot(8), ``lzc_snapshot``), the same guarantee
as ``zfs snapshot -r``; ``-r`` itself is used only when every dataset of the tree takes the
snapshot. A ZFS without multi-name snapshots (zfs-fuse) takes one per command, logged as not
atomic; it has no ``written`` property either, so there ``min_change`` never skips anything.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Mapping, Sequence

from zrepl_py.errors import DatasetExists
from zrepl_py.snapshots.naming import format_short_name, is_own
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.model import Tree
from zrepl_py.zfs.names import DatasetName, SnapshotName

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Taken:
    """The snapshot name taken (short part) and whether one command took it everywhere."""

    short: str
    atomic: bool


@dataclasses.dataclass(frozen=True)
class SnapshotPlan:
    """What ``take_snapshot`` does.

    Attributes:
        datasets: the datasets to snapshot, tree order (parents first); may be empty.
        recursive: one ``zfs snapshot -r ROOT@NAME`` takes exactly ``datasets`` (the whole
            tree); False: the names are given one by one (one command where supported).
        unchanged: selected datasets left without a new snapshot by ``min_change``, each
            with the reason (bytes written since which snapshot).
    """

    datasets: tuple[DatasetName, ...]
    recursive: bool
    unchanged: tuple[tuple[DatasetName, str], ...] = ()


def plan_snapshot(
    tree: Tree,
    selected: Sequence[DatasetName],
    *,
    recursive: bool,
    prefix: str,
    min_change: int = 0,
    written: Mapping[DatasetName, int] | None = None,
    whole_tree: bool = True,
) -> SnapshotPlan:
    """Decide which of the ``selected`` datasets get the job's snapshot (pure).

    A selected dataset is left unchanged when ``min_change`` is set, its newest snapshot is
    one of the job's own (``prefix``) and fewer than ``min_change`` bytes were written since
    (``written``, zfsprops(7): bytes written since the previous snapshot). Only then is
    ``written`` the change since the job's last snapshot; after another tool's (or another
    prefix's) newer snapshot, or without any snapshot, the dataset is snapshotted, so
    skipping never leaves a change out of the job's own history.

    Args:
        tree: the job's tree as listed before the snapshot (all datasets, any selection).
        selected: the datasets the job covers (``Inventory.datasets`` names).
        recursive: the job is recursive.
        prefix: the job's snapshot prefix.
        min_change: ``[jobs.NAME.snapshot] min_change`` in bytes; 0 skips nothing.
        written: each dataset's ``written`` bytes, read after ``zpool sync``; None when they
            could not be read (then nothing is skipped).
        whole_tree: False when a ``zfs snapshot -r`` of the root could reach beyond
            ``selected`` even if every listed dataset is selected (a replica target of
            another job lies below the root and may be created meanwhile).
    """
    chosen: list[DatasetName] = []
    unchanged: list[tuple[DatasetName, str]] = []
    for name in selected:
        snaps = tree.snapshots(name)
        size = written.get(name) if written is not None else None
        if (min_change and size is not None and snaps and is_own(prefix, snaps[-1].short)
                and size < min_change):
            unchanged.append((name, f"{size} bytes written since @{snaps[-1].short}, under "
                                    f"min_change {min_change}"))
        else:
            chosen.append(name)
    everything = [info.name for info in tree.datasets]
    return SnapshotPlan(tuple(chosen), recursive and whole_tree and chosen == everything,
                        tuple(unchanged))


def take_snapshot(zfs: Zfs, root: DatasetName, prefix: str, plan: SnapshotPlan,
                  now: dt.datetime) -> Taken:
    """Snapshot the plan's datasets under one name made from ``prefix`` and ``now``.

    ``zfs snapshot -r`` when the plan is recursive (atomic across the tree, per
    zfs-snapshot(8)); one name alone; several names in one atomic multi-name ``zfs
    snapshot`` where the host supports it, else one at a time (logged as not atomic: old
    ZFS like zfs-fuse takes one name per call). An empty plan runs nothing.

    Args:
        zfs: client for the job's source host (capabilities probed).
        root: the job's dataset (names the snapshot in messages and for ``-r``).
        prefix: the job's snapshot prefix.
        plan: from ``plan_snapshot``.
        now: aware UTC time the name is made from.

    Raises:
        DatasetExists: a snapshot of that name exists (two runs in the same second).
        ZfsError: the snapshot command failed.
    """
    short = format_short_name(prefix, now)
    names = [SnapshotName.of(d, short) for d in plan.datasets]
    try:
        if plan.recursive:
            zfs.snapshot(SnapshotName.of(root, short), recursive=True)
            return Taken(short, True)
        if len(names) <= 1:
            for name in names:
                zfs.snapshot(name)
            return Taken(short, True)
        if zfs.capabilities.multi_snapshot:
            zfs.snapshot_many(names)
            return Taken(short, True)
        log.warning("%s: this ZFS takes one snapshot per command; %s is not atomic across "
                    "the %d datasets", root, short, len(names))
        for name in names:
            zfs.snapshot(name)
        return Taken(short, False)
    except DatasetExists as exc:
        raise DatasetExists(
            exc.argv, exc.returncode,
            f"snapshot {root}@{short} exists already (another run this second?); "
            f"run again in a second", exc.host,
        ) from None
