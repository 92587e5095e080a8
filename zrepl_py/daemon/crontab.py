"""The daemon's trigger for crontab(5) schedules: APScheduler 3 fires a job when cron(8) would
(the schedule's meaning is ``values.cron``'s, the one parser of validation, daemon and status).
"""

from __future__ import annotations

import datetime as dt

from apscheduler.triggers.base import BaseTrigger

from zrepl_py.values.cron import first_at_or_after, parse_crontab


class CrontabTrigger(BaseTrigger):  # type: ignore[misc]  # APScheduler 3 has no types: Any
    """An APScheduler 3 trigger that fires when crontab(5) would run ``line`` (UTC).

    Pickled into the daemon's job store (``daemon.store``) as the line alone.

    Args:
        line: a schedule ``parse_crontab`` accepts.

    Raises:
        ValueError: ``line`` is not a crontab(5) schedule.
    """

    def __init__(self, line: str):
        self.line = line
        parse_crontab(line)

    def get_next_fire_time(self, previous_fire_time: dt.datetime | None,
                           now: dt.datetime) -> dt.datetime | None:
        """The first fire time after ``previous_fire_time``, or at or after ``now`` when
        there was none; APScheduler 3's ``CronTrigger`` rule, so a clock set back does not
        skip a run."""
        if previous_fire_time is None:
            return first_at_or_after(self.line, now)
        start = min(now, previous_fire_time + dt.timedelta(microseconds=1))
        if start == previous_fire_time:
            start += dt.timedelta(microseconds=1)
        return first_at_or_after(self.line, start)

    def __getstate__(self) -> dict[str, str]:
        return {"line": self.line}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.line = state["line"]

    def __str__(self) -> str:
        return f"crontab[{self.line}]"

    def __repr__(self) -> str:
        return f"<CrontabTrigger {self.line!r}>"


def crontab_trigger(line: str) -> CrontabTrigger:
    """The trigger of ``line`` (see ``CrontabTrigger``).

    Raises:
        ValueError: ``line`` is not a crontab(5) schedule.
    """
    return CrontabTrigger(line)
