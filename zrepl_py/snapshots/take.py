"""Take a job's snapshot now: ``PREFIX_YYYYMMDDTHHMMSSZ``, atomic across the tree when possible."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from zrepl_py.config.schema import JobConfig
from zrepl_py.errors import DatasetExists
from zrepl_py.snapshots.naming import format_short_name
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName, SnapshotName

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Taken:
    """The snapshot name taken (short part) and whether one command took it everywhere."""

    short: str
    atomic: bool


def take_snapshot(zfs: Zfs, job: JobConfig, covered: list[DatasetName], now: dt.datetime) -> Taken:
    """Snapshot every dataset the job covers under one name.

    Without excludes a recursive job uses ``zfs snapshot -r`` (atomic across the tree, per
    zfs-snapshot(8)). With excludes, the covered datasets are snapshotted in one atomic
    multi-name ``zfs snapshot`` where the host supports it, else one at a time (logged as
    not atomic: old ZFS like zfs-fuse takes one name per call).

    Args:
        zfs: client for the job's source host (capabilities probed).
        job: the job.
        covered: for a recursive job with excludes, the datasets to snapshot (root first,
            excludes removed); otherwise only the root is used.
        now: aware UTC time the name is made from.

    Raises:
        DatasetExists: a snapshot of that name exists (two runs in the same second).
        ZfsError: the snapshot command failed.
    """
    root = job.source.dataset
    short = format_short_name(job.snapshot.prefix, now)
    names = [SnapshotName.of(d, short) for d in covered]
    try:
        if not job.recursive:
            zfs.snapshot(SnapshotName.of(root, short))
            return Taken(short, True)
        if not job.exclude:
            zfs.snapshot(SnapshotName.of(root, short), recursive=True)
            return Taken(short, True)
        if zfs.capabilities is not None and zfs.capabilities.multi_snapshot:
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
