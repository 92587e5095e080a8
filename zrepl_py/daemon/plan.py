"""Which action of which job the daemon runs when: one ``Entry`` per (job, action) (pure).

Cron lines come from ``[jobs.NAME.snapshot|replicate|archive|drill] schedule``, ``[jobs.NAME.
copy.STORE] schedule`` (action ``copy:STORE``, one per copy store) and ``[daemon]
prune_schedule`` / ``audit_schedule``; ``[daemon] every`` replaces an action's cron line by a
fixed interval for every job (see ``DaemonConfig``). Entries are compared across restarts by
``Entry.name``, which spells the schedule: a changed schedule replaces the stored job (its
next run is computed afresh), an unchanged one keeps the stored next-run time, which is how
a run missed while the daemon was down is found.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Protocol

from zrepl_py.config.daemon import DAEMON_ACTIONS
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.schema import Config


class Trigger(Protocol):
    """What zbak asks of an APScheduler 3 trigger (``CrontabTrigger``, ``IntervalTrigger``)."""

    def get_next_fire_time(self, previous_fire_time: dt.datetime | None,
                           now: dt.datetime) -> dt.datetime | None: ...

UTC = dt.UTC
INTERVAL_ORIGIN = dt.datetime(2000, 1, 1, tzinfo=UTC)
"""Interval runs fall on whole multiples of the interval from this instant, so a restart
keeps their phase and the stored job still matches."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One scheduled action of one job.

    Attributes:
        job: the ``[jobs.NAME]`` key.
        action: one of ``DAEMON_ACTIONS``, or ``copy:STORE`` for the copy to store STORE
            (``copy_action``; job and store names hold no ``:``).
        cron: a five-field crontab line (UTC), or None when ``every`` is set.
        every: seconds between runs, or None for a cron schedule.
    """

    job: str
    action: str
    cron: str | None = None
    every: float | None = None

    @property
    def id(self) -> str:
        """The job store id, ``JOB:ACTION`` (job names hold no ``:``)."""
        return f"{self.job}:{self.action}"

    @property
    def schedule(self) -> str:
        """``cron 0 2 * * *`` or ``every 5s``."""
        return f"cron {self.cron}" if self.cron is not None else f"every {self.every:g}s"

    @property
    def name(self) -> str:
        """``JOB ACTION (SCHEDULE)``: what the job store keeps to recognise an unchanged entry."""
        return f"{self.job} {self.action} ({self.schedule})"

    @property
    def order(self) -> int:
        """Rank among a job's actions due together: snapshot first, audit last."""
        return DAEMON_ACTIONS.index(base_action(self.action))


def copy_action(store: str) -> str:
    """The daemon's action name of the copy to ``store``: ``copy:STORE``."""
    return f"copy:{store}"


def base_action(action: str) -> str:
    """The command an action runs (``copy`` for ``copy:STORE``), one of ``DAEMON_ACTIONS``."""
    return action.partition(":")[0]


def action_command(action: str, job: str) -> list[str]:
    """The ``zbak`` arguments of one run: ``ACTION JOB``; ``copy JOB --to STORE`` for
    ``copy:STORE``."""
    base, _, store = action.partition(":")
    return [base, job, "--to", store] if store else [action, job]


def split_id(job_id: str) -> tuple[str, str]:
    """``(job, action)`` of an ``Entry.id`` (``JOB:ACTION``; the action may hold a ``:``)."""
    job, _, action = job_id.partition(":")
    return job, action


def _cron(config: Config, job: JobConfig, action: str) -> str | None:
    if action == "snapshot":
        return job.snapshot.schedule
    if action == "replicate":
        return job.replicate.schedule if job.replicate is not None else None
    if action == "archive":
        return job.archive.schedule if job.archive is not None else None
    if action == "drill":
        return job.drill.schedule if job.drill is not None else None
    if action == "prune":
        return config.daemon.prune_schedule
    return config.daemon.audit_schedule


def _has_section(job: JobConfig, action: str) -> bool:
    if action == "replicate":
        return job.replicate is not None
    if action == "archive":
        return job.archive is not None
    if action == "drill":
        return job.drill is not None
    return True


def plan_entries(config: Config) -> list[Entry]:
    """Every (job, action) the daemon schedules, in config order, actions in DAEMON_ACTIONS order.

    Args:
        config: the validated config.
    """
    entries = []
    for name, job in config.jobs.items():
        for action in DAEMON_ACTIONS:
            if action == "copy":
                crons = [(copy_action(store), copy.schedule)
                         for store, copy in job.copies.items()]
            elif _has_section(job, action):
                crons = [(action, _cron(config, job, action))]
            else:
                continue
            every = config.daemon.every.get(action)
            for run, cron in crons:
                if cron is None:
                    continue
                if every is not None:
                    entries.append(Entry(name, run, every=every.total_seconds()))
                else:
                    entries.append(Entry(name, run, cron=cron))
    return entries


def make_trigger(entry: Entry) -> Trigger:
    """The APScheduler trigger of ``entry``: a crontab line with crontab(5)'s meaning
    (``daemon.crontab``, UTC) or an ``IntervalTrigger`` anchored at ``INTERVAL_ORIGIN``."""
    if entry.cron is not None:
        from zrepl_py.daemon.crontab import crontab_trigger

        return crontab_trigger(entry.cron)
    # imported here: APScheduler's interval module (with tzlocal) costs `zbak status` 0.04 s
    from apscheduler.triggers.interval import IntervalTrigger

    assert entry.every is not None
    trigger: Trigger = IntervalTrigger(seconds=entry.every, start_date=INTERVAL_ORIGIN,
                                       timezone=UTC)
    return trigger


def missed_runs(trigger: Trigger, since: dt.datetime, now: dt.datetime, limit: int = 1000) -> int:
    """How many fire times of ``trigger`` lie in ``[since, now]`` (at most ``limit``)."""
    count = 0
    fire: dt.datetime | None = since
    while fire is not None and fire <= now and count < limit:
        count += 1
        # (previous, now): both APScheduler 3 triggers answer the first fire time after it.
        fire = trigger.get_next_fire_time(fire, fire + dt.timedelta(microseconds=1))
    return count
