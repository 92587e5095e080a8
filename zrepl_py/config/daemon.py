"""``[daemon]``: how ``zbak daemon`` schedules the actions of every job, and logs."""

from __future__ import annotations

import datetime as dt
import re
from typing import Literal

from pydantic import field_validator

from zrepl_py.values.fields import CronSchedule, Duration, Table

DaemonAction = Literal["snapshot", "replicate", "archive", "prune", "audit", "drill"]
"""The actions with hooks (``[jobs.NAME.hooks.ACTION]``)."""
ScheduledAction = Literal["snapshot", "replicate", "archive", "copy", "prune", "audit", "drill"]
DAEMON_ACTIONS: tuple[ScheduledAction, ...] = ("snapshot", "replicate", "archive", "copy", "prune",
                                              "audit", "drill")
"""What ``zbak daemon`` schedules, in the order it runs a job's actions that are due together
(``copy`` once per ``[jobs.NAME.copy.STORE]`` with a ``schedule``)."""


class DaemonConfig(Table):
    """``[daemon]``: how ``zbak daemon`` schedules and logs (``zrepl_py.daemon``).

    Every job gets one trigger per action: ``snapshot``, ``replicate``, ``archive`` and
    ``drill`` from the job's ``schedule`` keys (an action whose section is missing or whose
    schedule is unset is not scheduled), ``copy`` from each ``[jobs.NAME.copy.STORE]
    schedule`` (one trigger per copy store, running ``zbak copy NAME --to STORE``); ``prune`` and ``audit`` from ``prune_schedule`` and
    ``audit_schedule`` here, for every job (unset: not scheduled). Schedules are five-field
    crontab lines in UTC. ``every`` replaces an action's cron schedule for every job by a
    fixed interval (``{ snapshot = "5s", replicate = "10s" }``): for demos and tests;
    interval runs fall on whole multiples of the interval counted from 2000-01-01T00:00Z,
    so a restart does not shift them.

    A run missed while the daemon was down (its next-run time is kept in the catalog
    database) runs once at start-up, however many were missed (coalesced), unless it is
    more than ``misfire_grace_time`` late (unset: always caught up).
    """

    name: str | None = None
    """Names this daemon's schedule table (``zbak_schedule_<name>``) in a catalog several
    daemons share (a PostgreSQL fleet): each daemon needs its own. Unset: ``zbak_schedule``."""
    prune_schedule: CronSchedule | None = "0 4 * * *"
    audit_schedule: CronSchedule | None = "0 5 * * 0"
    every: dict[ScheduledAction, Duration] = {}
    misfire_grace_time: Duration | None = None
    """How late a missed run may still start; unset: any missed run is caught up once."""
    stop_timeout: Duration = dt.timedelta(seconds=30)
    """On SIGTERM, how long running actions get to stop (they are sent SIGTERM at once and
    stop their transfers) before they are killed."""
    log_format: Literal["human", "json"] = "human"
    """``json``: one JSON object per line (time, level, logger, message, job, action)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z0-9_]{1,40}", value):
            raise ValueError("use lower-case letters, digits and '_' (max 40): it names a table")
        return value

    @field_validator("every")
    @classmethod
    def _every(cls, value: dict[ScheduledAction, dt.timedelta]
               ) -> dict[ScheduledAction, dt.timedelta]:
        for action, interval in value.items():
            if interval < dt.timedelta(seconds=1):
                raise ValueError(f"every.{action}: an interval must be at least 1 second")
        return value
