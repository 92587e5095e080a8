"""zbak's own holds on a job's source snapshots: which are current, which are stale, and
releasing the stale ones (``zbak holds list|release-stale``;
docs/reliability.md#r23-interrupted-initial-replication-leaves-no-unbounded-holds, zrepl #288/#826).

zbak holds a snapshot with ``zbak:<job>:<target>`` while it is the replication base of that
target (``zfs.protect``) and with ``zbak:<job>:archive:<store>`` while it is the tip
of the job's current archive chain in that store. A hold placed after the receive succeeded
and the old one released right after, so a failed run leaves none and a run killed between
the two steps leaves two per (job, target, dataset) at most. A hold is **stale** when:

* its job is no longer in the config, its target is no longer one of the job's targets, or
  its store is no longer the job's archive store; or
* it sits on a snapshot that is not the owner's current base: the cursor the catalog
  records for (job, target, dataset), or the tip of the newest chain of (dataset, store).

A current base is never released. Tags of other software, and of other configured jobs
(their ``release-stale`` handles those), are listed as foreign and never released.

Where ``zfs holds`` works (OpenZFS) the tags are read. zfs-fuse cannot list them (its
``zfs holds`` fails): only the ``userrefs`` count is known, so the candidate tags are the ones
zbak can name from the config and the catalog (cursors, stores of archived streams), and
releasing a candidate that is not there answers "no such tag" (``HoldNotFound``), which is
skipped. A hold of a job or target the catalog has forgotten cannot be named there.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

from zrepl_py.catalog.chains import current_chain
from zrepl_py.catalog.rows import CursorRow, StreamRow
from zrepl_py.config.jobs import JobConfig
from zrepl_py.errors import DatasetNotFound, HoldNotFound, InvalidName, Unsupported, ZfsError
from zrepl_py.snapshots.selection import is_excluded
from zrepl_py.values.names import is_config_name
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import SnapshotName, check_hold_tag

log = logging.getLogger(__name__)

CURRENT, STALE, FOREIGN, UNKNOWN = "current", "stale", "foreign", "unknown"


@dataclasses.dataclass(frozen=True)
class Held:
    """A source snapshot with at least one user hold.

    Attributes:
        snapshot: ``DATASET@SNAP``.
        guid: its guid.
        userrefs: how many holds it carries (``userrefs`` property).
        tags: the hold tags when ``zfs holds`` could list them, else None (zfs-fuse).
    """

    snapshot: str
    guid: int
    userrefs: int
    tags: tuple[str, ...] | None

    @property
    def dataset(self) -> str:
        """The dataset part of ``snapshot``."""
        return self.snapshot.split("@", 1)[0]


@dataclasses.dataclass(frozen=True)
class HoldRow:
    """One hold (or, on zfs-fuse, one candidate hold) and what zbak makes of it.

    Attributes:
        snapshot: ``DATASET@SNAP``.
        tag: the hold tag (``"?"`` for holds zfs-fuse cannot name).
        status: ``current`` (a base: kept), ``stale`` (released by ``release-stale``),
            ``foreign`` (not this job's: never released) or ``unknown`` (zfs-fuse: holds
            that no tag zbak can name accounts for).
        reason: why, in words.
        listed: False for a candidate on zfs-fuse (it may not be there).
    """

    snapshot: str
    tag: str
    status: str
    reason: str
    listed: bool = True


def _owners(job_name: str, jobs: Mapping[str, JobConfig]) -> tuple[set[str], str | None]:
    """The configured replication targets and archive store of ``job_name`` (empty when the
    job is not configured)."""
    job = jobs.get(job_name)
    if job is None:
        return set(), None
    targets = {str(e) for e in job.replicate.endpoints()} if job.replicate else set()
    return targets, job.archive.store if job.archive else None


def _split(tag: str) -> tuple[str, str] | None:
    """``zbak:<job>:<owner>`` -> (job, owner); None for a tag zbak cannot have made: another
    prefix, a job part that is no config name, or characters ``check_hold_tag`` refuses
    (another program's ``zbak:go<tab>ne:x`` is foreign, never released)."""
    parts = tag.split(":", 2)
    if len(parts) != 3 or parts[0] != "zbak" or not is_config_name(parts[1]) or not parts[2]:
        return None
    try:
        check_hold_tag(tag)
    except InvalidName:
        return None
    return parts[1], parts[2]


def current_bases(dataset: str, host: str, jobs: Mapping[str, JobConfig],
                  cursors: Sequence[CursorRow], streams: Sequence[StreamRow],
                  guids: Mapping[int, str]) -> dict[str, str]:
    """``{tag: "DATASET@SNAP"}``: where each configured owner's hold belongs now (pure).

    Args:
        dataset / host: the source dataset.
        jobs: the configured jobs.
        cursors: every replica cursor of the catalog.
        streams: the catalog's streams of ``host``.
        guids: the dataset's snapshots by guid (to find an archive tip).
    """
    current: dict[str, str] = {}
    for c in cursors:
        if c.source_host != host or c.source_dataset != dataset:
            continue
        targets, _ = _owners(c.job, jobs)
        if c.target in targets:
            current[f"zbak:{c.job}:{c.target}"] = f"{dataset}@{c.snapshot_name}"
    by_store: dict[str, list[StreamRow]] = {}
    for s in streams:
        if s.dataset == dataset and s.host == host:
            by_store.setdefault(s.store, []).append(s)
    for name in jobs:
        _, store = _owners(name, jobs)
        chain = current_chain(by_store.get(store, [])) if store else []
        if chain and chain[-1].to_guid in guids:
            current[f"zbak:{name}:archive:{store}"] = guids[chain[-1].to_guid]
    return current


def candidate_tags(job_name: str, dataset: str, host: str, jobs: Mapping[str, JobConfig],
                   cursors: Sequence[CursorRow], streams: Sequence[StreamRow]) -> set[str]:
    """The tags this job's ``release-stale`` may find on ``dataset`` where holds cannot be
    listed: its configured targets and store, its cursors' targets, the stores holding
    streams of the dataset; and the cursor tags of jobs no longer configured (pure)."""
    targets, store = _owners(job_name, jobs)
    tags = {f"zbak:{job_name}:{t}" for t in targets}
    stores = {s.store for s in streams if s.dataset == dataset and s.host == host}
    tags |= {f"zbak:{job_name}:archive:{s}" for s in stores | ({store} if store else set())}
    for c in cursors:
        if c.source_host == host and c.source_dataset == dataset and (
                c.job == job_name or c.job not in jobs):
            tags.add(f"zbak:{c.job}:{c.target}")
    return tags


def _why_stale(tag_job: str, owner: str, jobs: Mapping[str, JobConfig], snapshot: str,
               current: Mapping[str, str], tag: str) -> str:
    if tag_job not in jobs:
        return f"job {tag_job} is no longer in the config"
    targets, store = _owners(tag_job, jobs)
    if owner.startswith("archive:"):
        if owner[len("archive:"):] != store:
            return f"store {owner[len('archive:'):]} is not job {tag_job}'s archive store any more"
    elif owner not in targets:
        return f"{owner} is not a target of job {tag_job} any more"
    if tag in current:
        return f"not the current base (that is @{current[tag].split('@', 1)[1]})"
    return "no current base is recorded for it"


def classify(job_name: str, held: Sequence[Held], host: str, jobs: Mapping[str, JobConfig],
             cursors: Sequence[CursorRow], streams: Sequence[StreamRow],
             guids: Mapping[str, Mapping[int, str]]) -> list[HoldRow]:
    """Every hold on the job's held snapshots, with its status and reason (pure).

    Args:
        job_name: the job whose holds are judged (tags ``zbak:<job_name>:...``, and those of
            jobs no longer configured).
        held: the snapshots with ``userrefs > 0``.
        host: the job's source host.
        jobs: the configured jobs.
        cursors / streams: the catalog's cursors and the host's streams.
        guids: per dataset, its snapshots by guid.

    Returns:
        Rows in snapshot order; a ``current`` row is never ``stale``.
    """
    rows: list[HoldRow] = []
    for snap in held:
        current = current_bases(snap.dataset, host, jobs, cursors, streams,
                                guids.get(snap.dataset, {}))
        here = {tag for tag, where in current.items() if where == snap.snapshot}
        listed = snap.tags is not None
        tags = snap.tags if snap.tags is not None else sorted(
            here | candidate_tags(job_name, snap.dataset, host, jobs, cursors, streams))
        named = 0
        for tag in tags:
            parts = _split(tag)
            if tag in here:
                rows.append(HoldRow(snap.snapshot, tag, CURRENT, "the owner's current base",
                                    listed))
                named += 1
                continue
            if parts is None or (parts[0] != job_name and parts[0] in jobs):
                rows.append(HoldRow(snap.snapshot, tag, FOREIGN,
                                    "not a hold of this job: never released here", listed))
                continue
            rows.append(HoldRow(snap.snapshot, tag, STALE,
                                _why_stale(parts[0], parts[1], jobs, snap.snapshot, current, tag),
                                listed))
        if not listed and snap.userrefs > named:
            rows.append(HoldRow(
                snap.snapshot, "?", UNKNOWN,
                f"{snap.userrefs} hold(s), {named} of them current bases; this zfs cannot list"
                " hold tags (zfs holds), so the others are only known by the candidates above",
                False))
    return rows


def held_snapshots(zfs: Zfs, job: JobConfig) -> tuple[list[Held], dict[str, dict[int, str]]]:
    """List the job's datasets (one ``zfs get``) and the tags of its held snapshots (one
    ``zfs holds``, where it works).

    Returns:
        ``(held, guids)``: the snapshots with ``userrefs > 0``, and per dataset its
        snapshots by guid.

    Raises:
        ZfsError, HostUnreachable: the listing failed.
    """
    root = job.source.dataset
    tree = zfs.tree(root, recursive=job.recursive)
    guids: dict[str, dict[int, str]] = {}
    snaps = []
    for info in tree.datasets:
        if is_excluded(info.name, root, job.exclude):
            continue
        mine = tree.snapshots(info.name)
        guids[str(info.name)] = {s.guid: str(s.name) for s in mine}
        snaps += [s for s in mine if s.userrefs > 0]
    try:
        tags: dict[SnapshotName, list[str]] | None = zfs.holds([s.name for s in snaps])
    except Unsupported:
        tags = None
    held = [Held(str(s.name), s.guid, s.userrefs,
                 tuple(tags.get(s.name, ())) if tags is not None else None) for s in snaps]
    return held, guids


@dataclasses.dataclass(frozen=True)
class Released:
    """One stale hold ``release-stale`` acted on: ``done`` False on a dry run or when it
    failed (``error``)."""

    row: HoldRow
    done: bool
    error: str | None = None


def release_stale(zfs: Zfs, rows: Sequence[HoldRow], *, dry_run: bool) -> list[Released]:
    """Release every ``stale`` row's hold (``zfs release TAG SNAP``), one by one.

    A candidate that turns out not to be there (``HoldNotFound``, zfs-fuse) or a snapshot
    destroyed meanwhile is left out of the result; on a dry run every stale row that was
    listed is returned (candidates are probed by nothing, so they are returned too).
    Other failures are reported in the result and the others still run.
    """
    out: list[Released] = []
    for row in rows:
        if row.status != STALE:
            continue
        if dry_run:
            out.append(Released(row, False))
            continue
        try:
            zfs.release(SnapshotName(row.snapshot), row.tag)
        except (HoldNotFound, DatasetNotFound):
            continue
        except ZfsError as exc:
            log.error("could not release hold %s on %s: %s", row.tag, row.snapshot, exc)
            out.append(Released(row, False, str(exc)))
            continue
        log.info("released stale hold %s on %s: %s", row.tag, row.snapshot, row.reason)
        out.append(Released(row, True))
    return out
