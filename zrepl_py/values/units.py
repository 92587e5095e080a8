"""Config value types: durations, byte sizes and cron schedules, parsed once at load.

Durations take seconds (int) or ``<number><unit>`` with units s, m, h, d, w, y
(``90m``, ``36h``, ``30d``); a year is 365 days. Sizes take bytes (int) or
``<number><unit>`` with SI (K, M, G, T = 1000^n) or IEC (KiB, MiB, GiB, TiB = 1024^n) units.
Cron schedules are crontab(5) lines checked with the one parser (``values.cron``) the daemon and status use.

Upper bounds (docs/decisions.md#bad-input-is-one-line-and-its-exit-code: a 400-digit value must be a
config error, not an OverflowError): a duration at most ``MAX_DURATION`` (100 years), a size at most
``MAX_SIZE`` (1 EiB, far beyond any pool or S3 object: S3 caps an object at 5 TiB).

Plain functions and constants, no pydantic: ``zbak audit`` takes its bounds from here without
loading the schema. The schema wraps the parsers as pydantic types (``Duration``, ``ByteSize``,
``CronSchedule``).
"""

from __future__ import annotations

import datetime as dt
import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdwy])\s*$")
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_FACTORS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
MAX_DURATION = dt.timedelta(days=100 * 365)
"""The longest duration any key takes."""
MAX_SIZE = 1024**6
"""The largest byte size any key takes (1 EiB)."""


def _bounded_duration(seconds: float) -> dt.timedelta:
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError("a duration can be at most 100 years")
    return dt.timedelta(seconds=seconds)


def _bounded_size(size: float) -> int:
    if size > MAX_SIZE:
        raise ValueError("a size can be at most 1 EiB")
    return int(size)


def parse_duration(value: object) -> dt.timedelta:
    """Parse a duration (see module doc) into a timedelta.

    Raises:
        ValueError: with a message pydantic attaches to the key path.
    """
    if isinstance(value, dt.timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("expected a duration like '36h' or '30d'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return _bounded_duration(value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:  # float() of 400 digits is inf, which the bound refuses
            return _bounded_duration(float(match[1]) * _DURATION_SECONDS[match[2]])
    raise ValueError(f"expected a duration like '36h' or '30d', got {value!r}")


def parse_moment(value: str, now: dt.datetime) -> dt.datetime:
    """A point in time given as ISO 8601 (``2026-11-20T03:00:00Z``; UTC when it names no
    offset; ``datetime.fromisoformat``) or as a duration before ``now`` (``2d``: see
    :func:`parse_duration`), as an aware UTC datetime.

    Raises:
        ValueError: neither form, naming both.
    """
    try:
        moment = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        try:
            return now - parse_duration(value)
        except ValueError:
            raise ValueError("expected an ISO 8601 time like '2026-11-20T03:00:00Z' or a"
                             f" duration before now like '2d', got {value!r}") from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


def parse_size(value: object) -> int:
    """Parse a byte size (see module doc) into an int number of bytes.

    Raises:
        ValueError: with a message pydantic attaches to the key path.
    """
    if isinstance(value, bool):
        raise ValueError("expected a size like '512MiB' or '1G'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return _bounded_size(value)
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            unit = (match[2] or "").upper()
            base = unit[:1] if unit not in ("", "B") else unit
            factor = _SIZE_FACTORS[base]
            if "I" in unit:
                factor = 1024 ** ("KMGTP".index(base) + 1)
            return _bounded_size(float(match[1]) * factor)
    raise ValueError(f"expected a size like '512MiB' or '1G', got {value!r}")


def parse_cron(value: object) -> str:
    """Check a crontab(5) schedule (UTC) with the parser the daemon uses and return it
    unchanged: five fields (0 and 7 are Sunday) or a nickname such as ``@daily``.

    Raises:
        ValueError: when ``values.cron.parse_crontab`` rejects it.
    """
    from zrepl_py.values.cron import parse_crontab

    if not isinstance(value, str):
        raise ValueError("expected a crontab line like '0 2 * * *' or '@daily'")
    try:
        parse_crontab(value)
    except ValueError as exc:
        raise ValueError(f"invalid cron schedule {value!r}: {exc}") from None
    return value
