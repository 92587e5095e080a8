"""``zbak status --check``: the health of the jobs as one Nagios-style exit code and line.

Read from the catalog and the config only (no host dialled), after ending the runs of dead
processes (``runlog.sweep_interrupted``), so it can run every minute from a monitoring
system (Nagios, Icinga, Zabbix, a systemd ``OnFailure=``). The exit code follows the Nagios
plugin API (https://nagios-plugins.org/doc/guidelines.html#AEN78): 0 OK, 1 WARNING,
2 CRITICAL, 3 UNKNOWN. What counts (``judge``, pure):

* CRITICAL: the newest run of a job's action (per target) ended ``failed`` or
  ``interrupted`` — an audit that found problems ends ``failed``, and so does a hook
  (action ``hook``); an action stale past ``[alerts] stale_after`` (``alerts.staleness``:
  no success for longer, only actions the daemon schedules, only after a first success).
* WARNING: the newest run ended ``partial`` (some targets, datasets or snapshots failed;
  an audit still waiting for thawed volumes); a copy lags past its ``max_lag``
  (``copying.lag``: the oldest stream its store lacks waited longer; a backup that still
  exists in the store copied from, so not CRITICAL, docs/copies.md#how-far-a-copy-lags).
* UNKNOWN: the check itself could not be made (config invalid, catalog unreachable or not
  migrated; see ``zbak status --check`` in cli).

Restores are left out: a restore that failed is the admin's to retry, not a backup that
stopped working. Runs still ``running`` are fine.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from zrepl_py.catalog.rows import RunRow
from zrepl_py.observe.events import Event
from zrepl_py.observe.progress import format_size, format_span

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.clock import Clock
    from zrepl_py.config.schema import Config
    from zrepl_py.copying.lag import CopyLag


class Health(enum.IntEnum):
    """A Nagios plugin's exit codes."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong: how bad, and one line saying what (job, action, target, when, why)."""

    health: Health
    job: str
    action: str
    target: str | None
    message: str


_BAD = {"failed": Health.CRITICAL, "interrupted": Health.CRITICAL, "partial": Health.WARNING}
IGNORED_ACTIONS = frozenset({"restore"})
MESSAGE_CHARS = 300
"""A run's error is cut to this many characters in a problem's line."""


def _what(run: RunRow) -> str:
    where = f" to {run.target}" if run.action == "replicate" else (
        f" ({run.target})" if run.target else "")
    return f"{run.action} of job {run.job}{where}"


def _lagging(job: str, lag: CopyLag) -> Problem:
    assert lag.oldest_missing is not None and lag.max_lag is not None  # lagging: both set
    since = lag.oldest_missing.strftime("%Y-%m-%d %H:%MZ")
    return Problem(Health.WARNING, job, "copy", lag.store,
                   f"copy of job {job} to store {lag.store} lags {format_span(lag.lag_seconds)}"
                   f" (max_lag {format_span(lag.max_lag)}): {lag.streams} stream(s),"
                   f" {format_size(lag.bytes)} of store {lag.source} not copied, the oldest"
                   f" since {since}")


def judge(runs: Iterable[RunRow], stale: Iterable[Event],
          lags: Iterable[tuple[str, CopyLag]] = ()) -> list[Problem]:
    """The problems among the newest runs, the stale events and the copy lags, worst first
    (pure).

    Args:
        runs: the newest run of each (job, action, target) (``Catalog.last_runs``).
        stale: ``stale`` events (``alerts.staleness.stale_events``).
        lags: ``(job, lag)`` of each copy (``copying.lag.copy_lags``).
    """
    found = []
    for run in runs:
        health = _BAD.get(run.result)
        if health is None or run.action in IGNORED_ACTIONS:
            continue
        when = (run.ended_at or run.started_at).strftime("%Y-%m-%d %H:%MZ")
        error = (run.error or "no detail")[:MESSAGE_CHARS]
        found.append(Problem(health, run.job, run.action, run.target,
                             f"{_what(run)} {run.result} at {when}: {error}"))
    found += [Problem(Health.CRITICAL, e.job or "", e.action or "", e.target,
                      f"stale: {e.message}") for e in stale]
    found += [_lagging(job, lag) for job, lag in lags if lag.lagging]
    return sorted(found, key=lambda p: (-p.health, p.job, p.action, p.target or ""))


def overall(problems: Sequence[Problem]) -> Health:
    """The worst health among ``problems`` (OK without any)."""
    return max((p.health for p in problems), default=Health.OK)


def summary(problems: Sequence[Problem], jobs: int) -> str:
    """The status line: ``ZBAK OK - 3 job(s), no problem`` or ``ZBAK CRITICAL - 2 critical,
    1 warning: <the worst problem>``."""
    health = overall(problems)
    if not problems:
        return f"ZBAK OK - {jobs} job(s), no problem"
    counts = [f"{sum(1 for p in problems if p.health is h)} {h.name.lower()}"
              for h in (Health.CRITICAL, Health.WARNING) if any(p.health is h for p in problems)]
    return f"ZBAK {health.name} - {', '.join(counts)}: {problems[0].message}"


def check(catalog: Catalog, config: Config, clock: Clock, jobs: Sequence[str]) -> list[Problem]:
    """The problems of ``jobs`` (config names) now: their newest runs, stale actions and
    lagging copies.

    Raises:
        CatalogError: the catalog cannot be read.
    """
    from zrepl_py.alerts.staleness import stale_events
    from zrepl_py.observe.runlog import sweep_interrupted

    sweep_interrupted(catalog, clock)
    wanted, now = set(jobs), clock.now()
    runs = [r for r in catalog.last_runs() if r.job in wanted]
    stale = [e for e in stale_events(catalog, config, now) if e.job in wanted]
    lags: list[tuple[str, CopyLag]] = []
    if any(config.jobs[job].copies for job in jobs):  # the retention planners: only then
        from zrepl_py.copying.lag import copy_lags

        lags = [(job, lag) for job in jobs for lag in copy_lags(catalog, config.jobs[job], now)]
    return judge(runs, stale, lags)


def as_dict(problems: Sequence[Problem], jobs: int) -> dict[str, Any]:
    """The check as JSON: ``status`` (name), ``code``, ``summary`` and the ``problems``."""
    health = overall(problems)
    return {"status": health.name, "code": int(health), "summary": summary(problems, jobs),
            "problems": [{"status": p.health.name, "job": p.job, "action": p.action,
                          "target": p.target, "message": p.message} for p in problems]}


def unknown(reason: str) -> dict[str, Any]:
    """The check as JSON (``as_dict``'s shape) when it cannot be made, ``reason`` saying why."""
    return {"status": Health.UNKNOWN.name, "code": int(Health.UNKNOWN),
            "summary": f"ZBAK UNKNOWN - {reason}", "problems": []}
