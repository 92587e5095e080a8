"""``zbak status`` facts per job, from the catalog and the config alone (no host is dialled)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from apscheduler.triggers.cron import CronTrigger

from zrepl_py.catalog.repository import Catalog, CursorRow, RunRow, SnapshotRow
from zrepl_py.config.schema import JobConfig


@dataclasses.dataclass(frozen=True)
class TargetStatus:
    """One replication target: its cursor and how far it lags the newest source snapshot."""

    target: str
    cursor: str | None
    cursor_time: dt.datetime | None
    lag_seconds: float | None
    lag_snapshots: int | None


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """One job's state: snapshots, last runs per action, targets, next scheduled runs (UTC)."""

    job: str
    source: str
    snapshots: int
    newest: str | None
    newest_time: dt.datetime | None
    last_runs: list[RunRow]
    targets: list[TargetStatus]
    next_runs: dict[str, dt.datetime | None]


def _next_fire(schedule: str | None, now: dt.datetime) -> dt.datetime | None:
    if schedule is None:
        return None
    return CronTrigger.from_crontab(schedule, timezone="UTC").get_next_fire_time(None, now)


def _target_status(target: str, cursor: CursorRow | None, root_snaps: list[SnapshotRow]) -> TargetStatus:
    if cursor is None:
        return TargetStatus(target, None, None, None, None)
    newer = [s for s in root_snaps if s.createtxg > cursor.createtxg]
    base = next((s for s in root_snaps if s.guid == cursor.guid), None)
    lag = None
    if base is not None and root_snaps:
        lag = max(0.0, (root_snaps[-1].creation - base.creation).total_seconds())
    return TargetStatus(target, cursor.snapshot_name, base.creation if base else None, lag, len(newer))


def job_status(catalog: Catalog, name: str, job: JobConfig, now: dt.datetime) -> JobStatus:
    """Summarise one job from the catalog; ``now`` (aware UTC) anchors next-run times."""
    source = job.source
    snaps = catalog.snapshots(host=source.host, below=str(source.dataset))
    root_snaps = [s for s in snaps if s.dataset == str(source.dataset)]
    newest = root_snaps[-1] if root_snaps else None
    cursors = {c.target: c for c in catalog.cursors(name) if c.source_dataset == str(source.dataset)}
    targets = [_target_status(t, cursors.get(t), root_snaps)
               for t in (job.replicate.targets if job.replicate else [])]
    schedules = {"snapshot": job.snapshot.schedule}
    if job.replicate:
        schedules["replicate"] = job.replicate.schedule
    if job.archive:
        schedules["archive"] = job.archive.schedule
    return JobStatus(
        job=name,
        source=str(source),
        snapshots=len(snaps),
        newest=newest.name if newest else None,
        newest_time=newest.creation if newest else None,
        last_runs=catalog.last_runs(name),
        targets=targets,
        next_runs={action: _next_fire(s, now) for action, s in schedules.items()},
    )
