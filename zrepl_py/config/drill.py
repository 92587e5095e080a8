"""``[jobs.NAME.drill]``: when the daemon drills the job's restores, and whether a drill may
thaw cold objects (``zrepl_py.drill``, docs/drills.md)."""

from __future__ import annotations

from pydantic import StrictBool

from zrepl_py.values.fields import CronSchedule, Table


class DrillConfig(Table):
    """``[jobs.NAME.drill]``: the restore drill of one job (``zbak drill``).

    ``schedule`` is the daemon's crontab line (UTC; unset: only manual drills). ``thaw``: a
    store whose newest restorable snapshot lies in GLACIER or DEEP_ARCHIVE objects is
    drilled only when true (the drill then requests the thaw and exits 75 until the objects
    are readable); when false such a store is skipped and the drill says what thawing would
    take and cost.
    """

    schedule: CronSchedule | None = "0 6 * * 0"
    thaw: StrictBool = False
