"""Replicate a job's dataset to a directory target with the rsync fallback, snapshot by snapshot.

Every source snapshot newer than the target's cursor (and not already a tree there) becomes
one point-in-time tree, oldest first (createtxg order), so the target holds the same history
as the source; the cursor moves after each finished tree, so an interrupted run resumes with
the next snapshot. See ``replication/rsync.py`` for the directory layout.
"""

from __future__ import annotations

import dataclasses

from zrepl_py.config.schema import Endpoint, JobConfig
from zrepl_py.context import Context
from zrepl_py.locking import dataset_lock
from zrepl_py.replication.rsync import last_synced, replicate_snapshot_rsync
from zrepl_py.replication.stages import Side
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
    ctx: Context,
    job_name: str,
    job: JobConfig,
    target: Endpoint,
    inventory: Inventory,
    src: Zfs,
    target_side: Side,
    dry_run: bool,
    cursor_key: str | None = None,
) -> DirectoryOutcome:
    """Copy each pending snapshot of the job's dataset into ``target.directory``.

    ``cursor_key`` names the target in the catalog (default ``str(target)``); the method
    ``auto`` fallback passes the configured dataset target it stands in for.

    Raises:
        RsyncFailed, RsyncNotFound: rsync failed (no tree and no cursor recorded for it).
        HostUnreachable, HostKeyMismatch, ZfsError: the target or source could not be used.
    """
    assert target.directory is not None
    dataset = job.source.dataset
    catalog = ctx.catalog()
    executor = ctx.executors().get(target.host)
    key = cursor_key or str(target)
    with dataset_lock(ctx.state_dir, f"target {target}", "replicate"):
        present = set(last_synced(executor, target.directory))
        cursor = next((c for c in catalog.cursors(job_name)
                       if c.target == key and c.source_dataset == str(dataset)), None)
        floor = cursor.createtxg if cursor else -1
        pending = [s for s in inventory.tree.snapshots(dataset)
                   if s.createtxg > floor and s.short not in present]
        outcome = DirectoryOutcome([s.short for s in pending])
        if dry_run:
            return outcome
        for snap in pending:
            result = replicate_snapshot_rsync(
                src, snap.name, target, target_side.config, executor,
                known_hosts_default=target_side.known_hosts_default,
                bandwidth_limit=job.replicate.bandwidth_limit if job.replicate else None,
            )
            outcome.bytes += result.bytes_sent or 0
            outcome.warnings.extend(result.warnings)
            catalog.set_cursor(job_name, key, job.source.host, str(dataset),
                               target.directory, "rsync", snap.short, snap.guid, snap.createtxg,
                               ctx.clock.now())
    return outcome
