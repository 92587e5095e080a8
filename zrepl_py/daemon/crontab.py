"""crontab(5) lines as APScheduler 3 triggers, with crontab's own meaning (UTC)."""

from __future__ import annotations

from apscheduler.triggers.cron import CronTrigger

_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _weekday(text: str) -> int:
    if text in _WEEKDAYS:
        return _WEEKDAYS.index(text)
    if text.isdigit() and 0 <= int(text) <= 7:
        return int(text)
    raise ValueError(f"bad day of week {text!r} (0-7 or sun-sat)")


def _crontab_weekdays(field: str) -> str:
    """A crontab day-of-week field (0 or 7 = Sunday, crontab(5)) as APScheduler weekday
    names: APScheduler 3 counts 0 as Monday (CronTrigger.from_crontab's warning, issue 286)."""
    if field == "*":
        return "*"
    days: set[int] = set()
    for item in field.lower().split(","):
        part, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if part == "*":
            first, last = 0, 6
        elif "-" in part:
            low, high = part.split("-", 1)
            first, last = _weekday(low), _weekday(high)
        else:
            first = last = _weekday(part)
            if step_text:
                last = 6
        if step < 1 or first > last:
            raise ValueError(f"bad day-of-week item {item!r}")
        days.update(d % 7 for d in range(first, last + 1, step))
    if len(days) == 7:
        return "*"
    return ",".join(_WEEKDAYS[d] for d in sorted(days))


def crontab_trigger(line: str):
    """An APScheduler 3 trigger that fires when crontab(5) would run ``line`` (UTC).

    Two differences from ``CronTrigger.from_crontab`` are mended: day-of-week numbers follow
    crontab (0 and 7 are Sunday, APScheduler 3 takes 0 for Monday), and when both day of
    month and day of week are restricted the line fires when EITHER matches (crontab(5):
    "0 0 1 * 1" is the 1st and every Monday), where one CronTrigger needs both.

    Raises:
        ValueError: not five fields, or a field APScheduler rejects.
    """
    from apscheduler.triggers.combining import OrTrigger

    fields = line.split()
    if len(fields) != 5:
        raise ValueError(f"wrong number of fields in {line!r}; expected 5")
    minute, hour, day, month, weekday = fields
    weekdays = _crontab_weekdays(weekday)
    common = {"minute": minute, "hour": hour, "month": month, "timezone": "UTC"}
    if day != "*" and weekday != "*":
        return OrTrigger([CronTrigger(day=day, **common),
                          CronTrigger(day_of_week=weekdays, **common)])
    return CronTrigger(day=day, day_of_week=weekdays, **common)
