"""Source-snapshot pruning for one job: gather facts, plan (pure), destroy one by one.

Safety comes in layers: the planner keeps foreign, held, cloned, protected and newest
snapshots; destroys are plain ``zfs destroy DATASET@SNAP`` (never ``-r``/``-R``), so ZFS
itself refuses a snapshot that gained a hold or a clone after planning; such a refusal is
reported as skipped, not as a failure.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Sequence

from zrepl_py.catalog.chains import current_chain
from zrepl_py.catalog.rows import CursorRow, StreamRow
from zrepl_py.config.jobs import JobConfig
from zrepl_py.errors import (
    DatasetBusy,
    DatasetNotFound,
    KeptByFloor,
    SnapshotHasClones,
    SnapshotHeld,
    ZfsError,
)
from zrepl_py.pruning.snapshot_plan import Candidate, PrunePlan, plan_prune
from zrepl_py.snapshots.inventory import Inventory
from zrepl_py.snapshots.naming import is_own
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.errors import floor_reasons
from zrepl_py.zfs.names import SnapshotName

log = logging.getLogger(__name__)


def replication_protections(
    inventory: Inventory, job_name: str, job: JobConfig, cursors: list[CursorRow]
) -> dict[str, list[str]]:
    """Reasons that forbid destroying a source snapshot, from the replica cursors (pure).

    - every cursor's snapshot on the job's host is a replication base (the next incremental
      starts there), whichever job recorded it;
    - for each of this job's targets, every snapshot newer than that target's cursor (all of
      them, when it was never replicated) is not yet replicated (zrepl's KeepNotReplicated),
      except those the target's ``snapshot_filter`` leaves out: they are never sent there.

    Returns:
        ``{"DATASET@SNAP": [reason, ...]}``.
    """
    host = job.source.host
    protections: dict[str, list[str]] = {}
    for cursor in cursors:
        if cursor.source_host == host:
            protections.setdefault(f"{cursor.source_dataset}@{cursor.snapshot_name}", []).append(
                f"replication base of {cursor.job} -> {cursor.target}"
            )
    if job.replicate is None:
        return protections
    mine = {(c.target, c.source_dataset): c for c in cursors if c.job == job_name}
    # Cursors name targets as ``str(Endpoint)`` (``local:pool/x``), the config may say ``pool/x``.
    targets = [(str(e), job.replicate.filter_for(e)) for e in job.replicate.endpoints()]
    for dataset in inventory.datasets:
        for target, admits in targets:
            last = mine.get((target, str(dataset.name)))
            floor = last.createtxg if last else -1
            why = f"not yet replicated to {target}" + ("" if last else " (never replicated)")
            for snap in inventory.tree.snapshots(dataset.name):
                if snap.createtxg > floor and admits.admits(snap.short):
                    protections.setdefault(str(snap.name), []).append(why)
    return protections


def archive_protections(inventory: Inventory, streams: Sequence[StreamRow]) -> dict[str, list[str]]:
    """Reasons that forbid destroying a source snapshot, from the archive chains (pure).

    For each dataset of the inventory and each store holding streams of it, the tip of the
    current chain (``archive.planner.current_chain``: the snapshot the next incremental
    starts from) is an archive base, found by guid. The archive hold
    (``zbak:<job>:archive:<store>``) protects it too; this keeps it even when the hold was
    released by hand.

    Args:
        inventory: the job's listing.
        streams: the catalog's streams of the job's host (any dataset, store and state).

    Returns:
        ``{"DATASET@SNAP": ["archive base (store NAME)", ...]}``.
    """
    by_key: dict[tuple[str, str], list[StreamRow]] = {}
    for s in streams:
        by_key.setdefault((s.dataset, s.store), []).append(s)
    protections: dict[str, list[str]] = {}
    for info in inventory.datasets:
        by_guid = {s.guid: s for s in inventory.tree.snapshots(info.name)}
        for (dataset, store), rows in sorted(by_key.items()):
            if dataset != str(info.name):
                continue
            chain = current_chain(rows)
            snap = by_guid.get(chain[-1].to_guid) if chain else None
            if snap is not None:
                protections.setdefault(str(snap.name), []).append(f"archive base (store {store})")
    return protections


def stale_archive_tips(inventory: Inventory, streams: Sequence[StreamRow]) -> dict[str, list[str]]:
    """Source snapshots still carrying an archive hold they no longer need (pure).

    ``zbak archive`` holds each chain's tip (``zbak:<job>:archive:<store>``) and moves the
    hold along the chain, but a new full starts a new chain and the old chain's tip keeps
    its hold although no incremental will ever start there again. Those tips (with a hold
    count, and not the current tip of any store) are returned so prune can release the
    hold and retention can then decide.

    Returns:
        ``{"DATASET@SNAP": [store, ...]}``.
    """
    by_key: dict[tuple[str, str], list[StreamRow]] = {}
    for s in streams:
        if s.state != "condemned":
            by_key.setdefault((s.dataset, s.store), []).append(s)
    stale: dict[str, list[str]] = {}
    for info in inventory.datasets:
        by_guid = {s.guid: s for s in inventory.tree.snapshots(info.name)}
        current: set[int] = set()
        old: list[tuple[int, str]] = []
        for (dataset, store), rows in sorted(by_key.items()):
            if dataset != str(info.name):
                continue
            chain = current_chain(rows)
            if chain:
                current.add(chain[-1].to_guid)
            members = {s.id for s in chain}
            parents = {s.parent_id for s in rows}
            old += [(s.to_guid, store) for s in rows if s.id not in members and s.id not in parents]
        for guid, store in old:
            snap = by_guid.get(guid)
            if snap is not None and snap.userrefs > 0 and guid not in current:
                stale.setdefault(str(snap.name), []).append(store)
    return stale


def plan_source_prune(
    inventory: Inventory,
    job: JobConfig,
    protections: dict[str, list[str]],
    now: dt.datetime,
) -> dict[str, PrunePlan]:
    """Plan retention for every dataset the job covers (pure over the listed facts).

    Returns:
        ``{dataset name: PrunePlan}`` in tree order.
    """
    prefix = job.snapshot.prefix
    plans: dict[str, PrunePlan] = {}
    for dataset in inventory.datasets:
        candidates = [
            Candidate(
                name=str(s.name),
                createtxg=s.createtxg,
                guid=s.guid,
                created=s.creation,
                own=is_own(prefix, s.short),
                userrefs=s.userrefs,
                clones=inventory.clones.get(str(s.name), ()),
                protections=tuple(protections.get(str(s.name), ())),
            )
            for s in inventory.tree.snapshots(dataset.name)
        ]
        plans[str(dataset.name)] = plan_prune(candidates, job.snapshot.retention, now)
    return plans


@dataclasses.dataclass
class PruneOutcome:
    """What executing a plan did: destroyed names, skipped (name, why), failed (name, error),
    and kept by the floor of the host's ``zbak serve`` (name, its reasons)."""

    destroyed: list[str] = dataclasses.field(default_factory=list)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    kept_by_floor: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def execute_source_prune(zfs: Zfs, plans: dict[str, PrunePlan]) -> PruneOutcome:
    """Destroy every snapshot the plans condemn, oldest first, one plain destroy each.

    A snapshot ZFS refuses because it is held, cloned or busy is skipped with the reason;
    one the floor of the host's ``zbak serve`` keeps is kept, with serve's reasons (the
    host's choice, not a failure: ``docs/design.md#security``); one that vanished meanwhile
    counts as destroyed; other errors are collected as failures and the rest still run.
    """
    outcome = PruneOutcome()
    for plan in plans.values():
        for decision in plan.to_destroy:
            name = decision.candidate.name
            try:
                zfs.destroy_snapshot(SnapshotName(name))
            except DatasetNotFound:
                outcome.destroyed.append(name)
            except KeptByFloor as exc:
                log.info("kept %s: the floor of the host's zbak serve keeps it: %s", name,
                         floor_reasons(exc))
                outcome.kept_by_floor.append((name, floor_reasons(exc)))
            except (SnapshotHeld, SnapshotHasClones, DatasetBusy) as exc:
                log.warning("kept %s: ZFS refused to destroy it: %s", name, exc.stderr)
                outcome.skipped.append((name, exc.stderr))
            except ZfsError as exc:
                log.error("destroying %s failed: %s", name, exc)
                outcome.failed.append((name, str(exc)))
            else:
                log.info("destroyed %s (%s)", name, "; ".join(decision.reasons))
                outcome.destroyed.append(name)
    return outcome
