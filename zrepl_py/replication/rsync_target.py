"""Replicate a job's dataset to a directory target with the rsync fallback, snapshot by snapshot.

Every source snapshot newer than the target's cursor (and not already a tree there, and
admitted by the target's ``snapshot_filter``) becomes
one point-in-time tree, oldest first (createtxg order), so the target holds the same history
as the source; the cursor moves after each finished tree, so an interrupted run resumes with
the next snapshot. See ``replication/rsync.py`` for the directory layout.

``fallback_directory`` says where method ``auto`` puts a dataset whose stream the target's
ZFS rejected: where that dataset would be mounted on the target; ``no_zfs_fallback`` where
it puts a job whose target host has no zfs at all (``zbak replicate`` and ``zbak init``
decide alike).
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from zrepl_py.config.hosts import Endpoint
from zrepl_py.config.jobs import JobConfig
from zrepl_py.errors import StreamUnsupported
from zrepl_py.observe.transfers import Slot
from zrepl_py.replication.rsync import (
    CURRENT,
    PARTIAL,
    SNAPSHOTS,
    last_synced,
    replicate_snapshot_rsync,
)
from zrepl_py.transport.stages import Side
from zrepl_py.values.timetable import Timetable
from zrepl_py.zfs.names import DatasetName

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.clock import Clock
    from zrepl_py.proc.executor import Executor
    from zrepl_py.snapshots.inventory import Inventory
    from zrepl_py.zfs.client import Zfs


@dataclasses.dataclass
class DirectoryOutcome:
    """Snapshots copied (short names, in order), bytes rsync reported sent, and warnings."""

    snapshots: list[str]
    bytes: int = 0
    warnings: list[str] = dataclasses.field(default_factory=list)


def replicate_to_directory(
    *,
    catalog: Catalog,
    clock: Clock,
    state_dir: Path,
    executor: Executor,
    job_name: str,
    job: JobConfig,
    target: Endpoint,
    inventory: Inventory,
    src: Zfs,
    target_side: Side,
    dry_run: bool,
    cursor_key: str | None = None,
    dataset: DatasetName | None = None,
) -> DirectoryOutcome:
    """Copy each pending snapshot of the job's dataset into ``target.directory``, run by
    ``executor`` (the target host's), under the target's lock the caller holds.

    ``cursor_key`` names the target in the catalog (default ``str(target)``); the method
    ``auto`` fallback passes the configured dataset target it stands in for. ``dataset`` is
    the source dataset to copy (default the job's; a child of a recursive job when its
    stream was rejected).

    Raises:
        RsyncFailed, RsyncNotFound: rsync failed (no tree and no cursor recorded for it).
        HostUnreachable, HostKeyMismatch, ZfsError: the target or source could not be used.
    """
    assert target.directory is not None
    dataset = dataset or job.source.dataset
    key = cursor_key or str(target)
    present = set(last_synced(executor, target.directory))
    cursor = next((c for c in catalog.cursors(job_name)
                   if c.target == key and c.source_dataset == str(dataset)), None)
    floor = cursor.createtxg if cursor else -1
    admits = job.replicate.filter_for(key) if job.replicate is not None else None
    pending = [s for s in inventory.tree.snapshots(dataset)
               if s.createtxg > floor and s.short not in present
               and (admits is None or admits.admits(s.short))]
    outcome = DirectoryOutcome([s.short for s in pending])
    if dry_run:
        return outcome
    limit = job.replicate.bandwidth_limit if job.replicate is not None else Timetable()
    for snap in pending:
        # rsync's bytes are known only at its end: zbak status shows what and since when
        with Slot(state_dir, "replicate", job_name, key).publisher(
                dataset=str(dataset), to_snapshot=snap.short, measured=False,
                limit=lambda: limit.at(clock.now()).limit):
            result = replicate_snapshot_rsync(
                src, snap.name, target, target_side.config, executor,
                known_hosts_default=target_side.known_hosts_default,
                bandwidth_limit=limit, control_dir=target_side.control_dir,
                clock=clock,
            )
        outcome.bytes += result.bytes_sent or 0
        outcome.warnings.extend(result.warnings)
        catalog.set_cursor(job_name, key, job.source.host, str(dataset),
                           target.directory, "rsync", snap.short, snap.guid, snap.createtxg,
                           clock.now())
    return outcome


def fallback_directory(
    dst: Zfs, target_ds: DatasetName, known: Iterable[DatasetName], error: StreamUnsupported
) -> str:
    """Return the directory on the target host where ``target_ds`` would be mounted.

    The nearest existing ancestor dataset (``known`` ones first, else asked with ``zfs
    get``) must be mounted at a real path; the directory is that mountpoint plus the rest of
    the name, as ZFS would inherit it (zfsprops(7) ``mountpoint``). Nothing is created here.

    Raises:
        StreamUnsupported: ``error`` itself, with the reason appended, when there is no such
            place: ``target_ds`` exists already (a ZFS replica that took earlier streams: no
            second, rsync copy beside it), the ancestor is not mounted or has
            ``mountpoint=none``/``legacy``, or a name on the way is ``snapshots``,
            ``current`` or ``partial`` (it would land inside a parent's rsync layout).
    """
    known = set(known)
    parts = target_ds.split("/")
    why = None
    if target_ds in known or dst.exists(str(target_ds)):
        why = f"{target_ds} exists there as a ZFS dataset"
    else:
        for depth in range(len(parts) - 1, 0, -1):
            ancestor = DatasetName("/".join(parts[:depth]))
            if ancestor in known or depth == 1 or dst.exists(str(ancestor)):
                break
        rest = parts[depth:]
        props = dst.get_properties(str(ancestor), ["mountpoint", "mounted"])
        mountpoint = props.get("mountpoint", "")
        if props.get("mounted") != "yes" or not mountpoint.startswith("/"):
            why = f"{ancestor} is not mounted (mountpoint {mountpoint or '-'})"
        elif any(part in (SNAPSHOTS, CURRENT, PARTIAL) for part in rest):
            why = f"{target_ds} would land inside a parent's rsync layout ({'/'.join(rest)})"
        else:
            return posixpath.join(mountpoint, *rest)
    error.args = (f"{error.args[0]}; no rsync fallback: {why}",)
    raise error
