"""``bandwidth_limit`` as a timetable: the limit in force at a time, and when it next changes.

A limit is a size per second (``"10M"``), ``"off"`` (no limit), or a table of weekly windows
in UTC, like every schedule of zbak (docs/design.md#config-toml: cron lines and timetables
follow one time-zone rule, UTC, so there is no daylight-saving gap or repeat)::

    bandwidth_limit = { "mon-fri 08:00-18:00" = "10M", "sat,sun 10:00-16:00" = "50M",
                        default = "off" }

A window is ``DAYS HH:MM-HH:MM`` or ``HH:MM-HH:MM`` (every day). ``DAYS`` is a comma list of
days (``mon`` ... ``sun``) and ranges (``mon-fri``; ``fri-mon`` wraps over the weekend). The
window starts on each of its days at the first time and ends at the second, which may be
``24:00``; an end earlier than the start crosses midnight into the next day (``fri 22:00-06:00``
ends Saturday 06:00, ``sun 22:00-06:00`` Monday 06:00: the week wraps). A window is half-open:
it holds from its start, inclusive, to its end, exclusive. ``default`` (``"off"`` when left
out) holds outside every window. Two windows that share a minute are an error (which limit
would hold there is not obvious), naming both
(docs/decisions.md#bandwidth-limits-follow-a-weekly-timetable-in-utc).

Pure: no clock is read here; the callers pass aware datetimes
(docs/style.md#planners-are-pure-and-drivers-are-thin).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping

from zrepl_py.values.units import parse_size

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
"""Day names, Monday first (``datetime.weekday()`` order)."""
OFF = "off"
"""The word for "no limit"."""
DEFAULT = "default"
"""The key of the limit outside every window."""
_MINUTES_PER_DAY = 24 * 60
WEEK = 7 * _MINUTES_PER_DAY
"""Minutes in a week: the timetable's cycle."""
_WINDOW = re.compile(r"^\s*(?:(?P<days>[a-z,\- ]+?)\s+)?(?P<start>\d{1,2}:\d{2})\s*-\s*"
                     r"(?P<end>\d{1,2}:\d{2})\s*$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Window:
    """One window of a timetable.

    Attributes:
        key: the window as written in the config (``"mon-fri 08:00-18:00"``).
        spans: its minutes of the week, as half-open ``(start, end)`` pairs with
            ``0 <= start < end <= WEEK``, minute 0 being Monday 00:00 UTC; a window that
            crosses the week's end is two spans.
        limit: bytes per second while it holds; None for ``"off"``.
    """

    key: str
    spans: tuple[tuple[int, int], ...]
    limit: int | None


@dataclasses.dataclass(frozen=True)
class InForce:
    """The limit at one moment.

    Attributes:
        limit: bytes per second; None for no limit.
        window: the key of the window that holds, None for ``default``.
        until: when the limit next changes (aware UTC); None when it never does.
    """

    limit: int | None
    window: str | None
    until: dt.datetime | None

    def describe(self) -> str:
        """``10 MB/s until 2026-12-01 18:00Z (window "mon-fri 08:00-18:00")``, ``off until
        ... (default)``, or ``10 MB/s`` for a limit that never changes: what ``zbak status``
        and ``replicate --dry-run`` print (decimal units: the ones the config's ``10M``
        means)."""
        text = rate_text(self.limit)
        if self.until is not None:
            text += f" until {self.until:%Y-%m-%d %H:%MZ}"
        if self.window is not None:
            return text + f' (window "{self.window}")'
        return text + (" (default)" if self.until is not None else "")

    def as_dict(self) -> dict[str, object]:
        """``{"limit": bytes/s or None, "window": key or None, "until": datetime or None}``
        (``--json``)."""
        return {"limit": self.limit, "window": self.window, "until": self.until}


def rate_text(limit: int | None) -> str:
    """A limit as shown: ``10 MB/s`` (decimal units, the ones the config's ``10M`` means,
    three digits), ``off`` for None."""
    if limit is None:
        return OFF
    for unit, factor in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if limit >= factor:
            return f"{limit / factor:.3g} {unit}/s"
    return f"{limit} B/s"


@dataclasses.dataclass(frozen=True)
class Timetable:
    """A bandwidth limit over the week (see the module doc).

    Attributes:
        windows: the windows, in the order written.
        default: bytes per second outside every window; None for no limit.
    """

    windows: tuple[Window, ...] = ()
    default: int | None = None

    @property
    def limited(self) -> bool:
        """True when some moment of the week has a limit (a transfer needs a limiter)."""
        return self.default is not None or any(w.limit is not None for w in self.windows)

    @property
    def constant(self) -> bool:
        """True when the limit never changes."""
        return not self.windows

    def at(self, when: dt.datetime) -> InForce:
        """The limit in force at ``when`` and when it next changes.

        Args:
            when: an aware datetime (any zone; read in UTC).

        Raises:
            ValueError: ``when`` is naive.
        """
        if when.tzinfo is None:
            raise ValueError("a timetable is read at an aware time (UTC)")
        when = when.astimezone(dt.UTC)
        minute = when.weekday() * _MINUTES_PER_DAY + when.hour * 60 + when.minute
        window = self._window_at(minute)
        limit = window.limit if window is not None else self.default
        # The week's boundaries after this minute, in order; the first whose limit differs.
        week_start = (when - dt.timedelta(days=when.weekday())).replace(
            hour=0, minute=0, second=0, microsecond=0)
        for offset in self._boundaries_after(minute):
            other = self._window_at(offset % WEEK)
            if (other.limit if other is not None else self.default) != limit:
                return InForce(limit, window.key if window else None,
                               week_start + dt.timedelta(minutes=offset))
        return InForce(limit, window.key if window else None, None)

    def _window_at(self, minute: int) -> Window | None:
        for window in self.windows:
            if any(start <= minute < end for start, end in window.spans):
                return window
        return None

    def _boundaries_after(self, minute: int) -> list[int]:
        """Every span start and end after ``minute``, over the next week (so up to
        ``minute + WEEK``), ascending, in minutes from this week's Monday 00:00."""
        edges = {edge for w in self.windows for span in w.spans for edge in span}
        found = {e for e in edges if e > minute} | {e + WEEK for e in edges if e + WEEK > minute
                                                     and e + WEEK <= minute + WEEK}
        return sorted(found)

    def __str__(self) -> str:
        if not self.windows:
            return OFF if self.default is None else str(self.default)
        parts = [f'"{w.key}" = {_value_text(w.limit)}' for w in self.windows]
        parts.append(f"default = {_value_text(self.default)}")
        return "{ " + ", ".join(parts) + " }"


def _value_text(limit: int | None) -> str:
    return f'"{OFF}"' if limit is None else str(limit)


def _limit(value: object, key: str) -> int | None:
    """A window's or the default's value: a size per second, or ``"off"``."""
    if isinstance(value, str) and value.strip().lower() == OFF:
        return None
    try:
        size = parse_size(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}, or \"off\"") from None
    if size == 0:
        raise ValueError(f"{key}: 0 bytes/s would stop every transfer; write \"off\" for no"
                         " limit")
    return size


def _clock(text: str, key: str, *, end: bool) -> int:
    hours, minutes = (int(part) for part in text.split(":"))
    if minutes > 59 or hours > 24 or (hours == 24 and (minutes or not end)):
        raise ValueError(f"window {key!r}: {text} is not a time of day"
                         f" (00:00 to {'24:00' if end else '23:59'})")
    return hours * 60 + minutes


def _days(text: str | None, key: str) -> list[int]:
    if text is None:
        return list(range(7))
    found: list[int] = []
    for item in text.replace(" ", "").lower().split(","):
        first, dash, last = item.partition("-")
        if first not in DAYS or (dash and last not in DAYS):
            raise ValueError(f"window {key!r}: {item!r} is not a day or a range of days"
                             f" ({', '.join(DAYS)}; e.g. mon-fri)")
        start = DAYS.index(first)
        stop = DAYS.index(last) if dash else start
        found += [(start + i) % 7 for i in range((stop - start) % 7 + 1)]
    return found


def parse_window(key: str) -> tuple[tuple[int, int], ...]:
    """The spans of the window written ``key`` (see ``Window.spans``), sorted.

    Raises:
        ValueError: not ``[DAYS] HH:MM-HH:MM``, an unknown day, a time out of range, or a
            window whose start and end are equal (write ``00:00-24:00`` for a whole day).
    """
    match = _WINDOW.match(key)
    if match is None:
        raise ValueError(f"window {key!r}: expected \"[DAYS] HH:MM-HH:MM\" such as"
                         " \"mon-fri 08:00-18:00\" (UTC)")
    start = _clock(match["start"], key, end=False)
    end = _clock(match["end"], key, end=True)
    if start == end:
        raise ValueError(f"window {key!r} is empty: start and end are both {match['start']}"
                         " (a whole day is 00:00-24:00)")
    length = end - start if end > start else end + _MINUTES_PER_DAY - start
    spans: set[tuple[int, int]] = set()
    for day in set(_days(match["days"], key)):
        first = day * _MINUTES_PER_DAY + start
        last = first + length
        if last <= WEEK:
            spans.add((first, last))
        else:  # crosses Sunday midnight: the rest is at the start of the week
            spans.update({(first, WEEK), (0, last - WEEK)})
    return tuple(sorted(spans))


def _overlap(a: Window, b: Window) -> str | None:
    for a_start, a_end in a.spans:
        for b_start, b_end in b.spans:
            start, end = max(a_start, b_start), min(a_end, b_end)
            if start < end:
                return _when(start)
    return None


def _when(minute: int) -> str:
    day, rest = divmod(minute, _MINUTES_PER_DAY)
    return f"{DAYS[day]} {rest // 60:02d}:{rest % 60:02d}"


def parse_timetable(value: object) -> Timetable:
    """Parse a ``bandwidth_limit``: a size per second, ``"off"``, or a table of windows.

    A plain size of 0 means no limit, as it always did; inside a table, 0 is refused (write
    ``"off"``).

    Raises:
        ValueError: the message names the window or value at fault, and both windows of an
            overlap with the first minute they share.
    """
    if isinstance(value, Timetable):
        return value
    if isinstance(value, str) and value.strip().lower() == OFF:
        return Timetable()
    if not isinstance(value, Mapping):
        size = parse_size(value)
        return Timetable((), size or None)
    default = None
    windows: list[Window] = []
    for key, limit in value.items():
        if not isinstance(key, str):
            raise ValueError(f"window {key!r}: expected a string")
        if key == DEFAULT:
            default = _limit(limit, DEFAULT)
            continue
        window = Window(key, parse_window(key), _limit(limit, f"window {key!r}"))
        for earlier in windows:
            shared = _overlap(earlier, window)
            if shared is not None:
                raise ValueError(f"windows {earlier.key!r} and {key!r} overlap (both hold on"
                                 f" {shared} UTC): a moment can have one limit only")
        windows.append(window)
    return Timetable(tuple(windows), default)
