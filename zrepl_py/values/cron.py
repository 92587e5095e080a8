"""crontab(5) schedules in UTC: the one parser behind config validation, the daemon's
triggers and the next runs ``zbak status`` shows.

The meaning of a line is cronsim's, a library written to match Debian's cron(8) (Vixie cron):
0 and 7 are Sunday; names (``sun``, ``jan``) in any case; when day of month and day of week
are both restricted a line fires when EITHER matches ("0 0 1 * 1" is the 1st and every
Monday), unless one of them starts with ``*`` (then both must match, as cron(8) does).
APScheduler 3's ``CronTrigger.from_crontab`` is not used: it numbers days from Monday = 0,
refuses 7 and needs both day fields to match.

zbak adds only what cronsim leaves out or goes beyond: the ``@hourly`` ... ``@yearly``
nicknames of crontab(5), and a refusal of the non-crontab(5) extensions cronsim also reads
(a seconds field, ``L``, ``W``, ``#``), so a schedule means what it would mean to cron.
"""

from __future__ import annotations

import datetime as dt
import re

UTC = dt.UTC
NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""crontab(5) "instead of the first five fields, one of eight special strings may appear";
``@reboot``, the eighth, is no schedule."""
_ITEM = re.compile(r"(\*|\d+|[a-z]{3})(-(\d+|[a-z]{3}))?(/\d+)?", re.IGNORECASE)
"""One item of a field's comma list in crontab(5): ``*``, a number or a three-letter name, an
optional ``-`` range end, an optional ``/`` step. Whether a value fits its field is cronsim's
to say."""
_FIELDS = ("minute", "hour", "day of month", "month", "day of week")


def parse_crontab(line: str) -> str:
    """Check a crontab(5) schedule and return its five fields (a nickname expanded).

    Args:
        line: five fields (``"30 2 * * 7"``) or a nickname (``"@daily"``).

    Returns:
        the five fields, single-spaced.

    Raises:
        ValueError: the line is not a crontab(5) schedule; the message says which field.
    """
    from cronsim import CronSim, CronSimError

    text = line.strip()
    if text.lower() == "@reboot":
        raise ValueError("@reboot is not a schedule (zbak daemon runs missed runs at start)")
    if text.startswith("@"):
        if text.lower() not in NICKNAMES:
            raise ValueError(f"unknown nickname {text!r} (one of {', '.join(NICKNAMES)})")
        text = NICKNAMES[text.lower()]
    fields = text.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 fields (minute hour day-of-month month day-of-week) "
                         f"or a nickname such as @daily, got {len(fields)}")
    for name, field in zip(_FIELDS, fields, strict=True):
        if not all(_ITEM.fullmatch(item) for item in field.split(",")):
            raise ValueError(f"bad {name} field {field!r}")
    try:
        CronSim(" ".join(fields), dt.datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ValueError(str(exc).lower().replace("-", " ")) from None
    return " ".join(fields)


def first_at_or_after(line: str, start: dt.datetime) -> dt.datetime | None:
    """The first time at or after ``start`` (aware) when crontab(5) would run ``line``, in
    UTC; None when there is none in the next 50 years (cronsim's horizon), e.g. Feb 30.

    Raises:
        ValueError: ``line`` is not a crontab(5) schedule (``parse_crontab``).
    """
    from cronsim import CronSim

    fields = parse_crontab(line)
    start = start.astimezone(UTC)
    # CronSim answers the first match strictly after a whole second.
    base = start.replace(microsecond=0) if start.microsecond else start - dt.timedelta(seconds=1)
    try:
        return next(CronSim(fields, base))
    except StopIteration:
        return None


def longest_gap(line: str, start: dt.datetime, runs: int = 8) -> dt.timedelta | None:
    """The longest time between two consecutive runs of ``line`` among its next ``runs``
    runs at or after ``start`` (aware): a weekday schedule's weekend, a monthly one's longest
    month; None when it runs fewer than twice in cronsim's horizon.

    Raises:
        ValueError: ``line`` is not a crontab(5) schedule (``parse_crontab``).
    """
    first = first_at_or_after(line, start)
    fires = [] if first is None else [first]
    while fires and len(fires) < runs:
        following = first_at_or_after(line, fires[-1] + dt.timedelta(seconds=1))
        if following is None:
            break
        fires.append(following)
    return max((b - a for a, b in zip(fires, fires[1:], strict=False)), default=None)
