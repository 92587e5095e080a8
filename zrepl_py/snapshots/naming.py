"""zbak's own snapshot names: ``PREFIX_YYYYMMDDTHHMMSSZ``, always UTC (docs/design.md#snapshots).

The timestamp in a name is a label for people and the marker that a snapshot is zbak's own;
it never decides order. Ordering uses ``createtxg``
(docs/style.md#utc-everywhere-and-order-by-createtxg, docs/reliability.md#r32-clock-goes-backwards):
a clock that steps back makes names that sort out of creation order. Two names made in the same UTC
second are equal; the snapshot taker reports that as ``DatasetExists``.
"""

from __future__ import annotations

import datetime as dt
import re

from zrepl_py.clock import UTC
from zrepl_py.zfs.names import check_short_name

# ASCII digits only: ``\d`` would also accept other Unicode digits.
_STAMP = re.compile(r"([0-9]{4})([0-9]{2})([0-9]{2})T([0-9]{2})([0-9]{2})([0-9]{2})Z")


def format_short_name(prefix: str, at: dt.datetime) -> str:
    """Return the short snapshot name (the part after ``@``) for ``at``.

    Args:
        prefix: the job's snapshot prefix, e.g. ``"zbak"`` (a valid ZFS short name).
        at: an aware datetime in any zone; it is converted to UTC and cut to whole seconds.

    Returns:
        ``PREFIX_YYYYMMDDTHHMMSSZ``, e.g. ``zbak_20261025T013000Z``.

    Raises:
        ValueError: ``at`` is naive (its zone is unknown, so its UTC instant is too).
        InvalidName: ``prefix`` is not a valid ZFS short name.
    """
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"snapshot time {at.isoformat()} is naive; pass an aware datetime")
    check_short_name(prefix, "snapshot prefix")
    u = at.astimezone(UTC)
    # Explicit widths: strftime("%Y") does not zero-pad years below 1000 on glibc.
    return (
        f"{prefix}_{u.year:04d}{u.month:02d}{u.day:02d}"
        f"T{u.hour:02d}{u.minute:02d}{u.second:02d}Z"
    )


def parse_short_name(prefix: str, short: str) -> dt.datetime | None:
    """Return the UTC time encoded in one of zbak's own short names, else None.

    Args:
        prefix: the job's snapshot prefix; only names with exactly this prefix are zbak's.
        short: the part after ``@`` of any snapshot on the dataset.

    Returns:
        An aware UTC datetime for ``PREFIX_YYYYMMDDTHHMMSSZ`` with a real calendar time;
        None for anything else: user snapshots, other prefixes (also ones that merely start
        with ``prefix``), ``PREFIX_garbage``, impossible dates such as month 13.
        Never raises for any string input.
    """
    head = f"{prefix}_"
    if not short.startswith(head):
        return None
    match = _STAMP.fullmatch(short, len(head))
    if match is None:
        return None
    try:
        year, month, day, hour, minute, second = (int(g) for g in match.groups())
        return dt.datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None


def is_own(prefix: str, short: str) -> bool:
    """True when ``short`` is a name zbak made with ``prefix`` (see ``parse_short_name``)."""
    return parse_short_name(prefix, short) is not None
