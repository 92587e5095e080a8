"""Staleness: actions that have not succeeded for longer than ``[alerts] stale_after`` allows.

Checked from the catalog alone (``check_staleness``), so the daemon can call it on its own
timer and still shout when jobs stop being scheduled, hang, or never get to record a run.
Only actions the daemon schedules for a job count (``daemon.plan.plan_entries``: the job's
schedules, ``[daemon] prune_schedule``/``audit_schedule``). What "the last success" means per
action:

* ``replicate``: per target of the job (``runs.target`` is the target string);
* ``archive``: per store, the newest ok archive run of any dataset (targets ``STORE:DATASET``);
* ``copy``: per store with a scheduled copy (daemon action ``copy:STORE``), the newest ok copy
  run to it (targets ``STORE:DATASET``, docs/copies.md#the-copy-schedule);
* ``drill``: per source, the newest drill that ended ok (``Catalog.last_drill_successes``;
  a skipped or pending drill is a run that ended ok, not a drill that restored anything),
  over the sources whose newest drill was not skipped by design (a cold store without
  ``thaw``, a sealed store without an identity); before any drill, the job as a whole;
* any other action: the newest ok run of the job, whatever its target.

An action that never succeeded counts from ``since`` (the daemon's start); without ``since``
it is not reported (a fresh install is not stale).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.schema import Config
from zrepl_py.observe.events import Event, emit

if TYPE_CHECKING:  # annotations only: the alerts package loads before the catalog's SQLAlchemy
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.catalog.rows import RunRow


def _when(run: RunRow) -> dt.datetime:
    return run.ended_at or run.started_at


def _fmt(value: dt.datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%MZ")


def _hours(delta: dt.timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours:.0f}h" if hours >= 10 else f"{hours:.1f}h"


def stale_events(catalog: Catalog, config: Config, now: dt.datetime, *,
                 since: dt.datetime | None = None) -> list[Event]:
    """The ``stale`` events due now (pure reading of the catalog; emits nothing).

    Args:
        now: aware UTC.
        since: aware UTC start of watching, for actions that never succeeded (see module doc).

    Raises:
        CatalogError: the catalog cannot be read.
    """
    from zrepl_py.daemon.plan import base_action, plan_entries

    found: list[Event] = []
    limits = config.alerts.stale_after
    entries = plan_entries(config)
    scheduled = {(e.job, base_action(e.action)) for e in entries}
    copies = {(e.job, e.action.partition(":")[2]) for e in entries if base_action(e.action) == "copy"}
    successes: dict[str, dict[tuple[str, str | None], RunRow]] = {}
    for name, job in config.jobs.items():
        for action, limit in limits.items():
            if (name, action) not in scheduled:
                continue
            if action == "drill":
                last_by_key = _last_drills(catalog, name)
            else:
                if action not in successes:
                    successes[action] = catalog.last_successes(action)
                runs = {t: r for (j, t), r in successes[action].items() if j == name}
                last_by_key = _last_by_key(job, action, runs,
                                           [store for j, store in copies if j == name])
            for target, last in last_by_key.items():
                event = _judge(name, action, target, last, limit, now, since)
                if event is not None:
                    found.append(event)
    return found


def _last_drills(catalog: Catalog, job: str) -> dict[str | None, dt.datetime | None]:
    """Per source not skipped by design, when its newest ok drill ended (see the module doc)."""
    newest = catalog.last_drills(job)
    if not newest:
        return {None: None}
    drilled = [d.source for d in newest if d.result != "skipped"]
    ok = {d.source: d.ended_at for d in catalog.last_drill_successes(job)}
    return {source: ok.get(source) for source in drilled}


def _last_by_key(job: JobConfig, action: str, runs: dict[str | None, RunRow],
                 copy_stores: list[str]) -> dict[str | None, dt.datetime | None]:
    # A scheduled replicate or archive action means the job has that section.
    if action == "replicate" and job.replicate is not None:
        return {t: (_when(runs[t]) if t in runs else None) for t in job.replicate.targets}
    if action == "archive" and job.archive is not None:
        return {job.archive.store: _newest_in(job.archive.store, runs)}
    if action == "copy":
        return {store: _newest_in(store, runs) for store in sorted(copy_stores)}
    return {None: max((_when(r) for r in runs.values()), default=None)}


def _newest_in(store: str, runs: dict[str | None, RunRow]) -> dt.datetime | None:
    """When the newest of ``runs`` to ``store`` (target ``STORE`` or ``STORE:DATASET``) ended."""
    times = [_when(r) for t, r in runs.items() if t == store or (t or "").startswith(f"{store}:")]
    return max(times, default=None)


def _judge(job: str, action: str, target: str | None, last: dt.datetime | None,
           limit: dt.timedelta, now: dt.datetime, since: dt.datetime | None) -> Event | None:
    where = (f" to {target}" if action == "replicate" else f" from {target}" if action == "drill"
             and target else f" to store {target}" if target else "")
    if last is None:
        if since is None or now - since <= limit:
            return None
        message = (f"{action} of job {job}{where} has not succeeded since zbak started watching "
                   f"at {_fmt(since)} ({_hours(now - since)} ago; stale_after {_hours(limit)})")
    elif now - last > limit:
        message = (f"no successful {action} of job {job}{where} since {_fmt(last)} "
                   f"({_hours(now - last)} ago; stale_after {_hours(limit)})")
    else:
        return None
    return Event("stale", job, action, target, message, now)


def check_staleness(catalog: Catalog, config: Config, now: dt.datetime, *,
                    since: dt.datetime | None = None) -> list[Event]:
    """Emit (``zrepl_py.observe.events.emit``) every stale event due now and return them.

    The daemon calls this on its own timer (every few minutes); repeats are held back by the
    alert dispatcher (``[alerts] repeat_after``), not here.

    Raises:
        CatalogError: the catalog cannot be read.
    """
    found = stale_events(catalog, config, now, since=since)
    for event in found:
        emit(event)
    return found
