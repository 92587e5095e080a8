"""Names and marks of a drill's scratch datasets (PURE): what the forced command's policy
checks without loading the zfs client (``drill.scratch`` creates and sweeps them)."""

from __future__ import annotations

import re

PREFIX = "zbak-drill-"
"""Name prefix of a scratch dataset, directly below its parent."""
MARK = "zbak:drill"
"""The user property naming the drill process that created a scratch: ``NODE:PID:START``."""
_NAME = re.compile(r"zbak-drill-[0-9a-f]{8}")


def is_scratch(name: str) -> bool:
    """True when ``name``'s last component is a scratch name (``zbak-drill-<8 hex>``)."""
    return _NAME.fullmatch(name.rsplit("/", 1)[-1]) is not None


def within(name: str) -> str | None:
    """The scratch dataset ``name`` (a dataset or snapshot) is at or below, or None."""
    parts = name.split("@", 1)[0].split("/")
    for index in range(1, len(parts)):  # a pool is never a scratch
        if _NAME.fullmatch(parts[index]):
            return "/".join(parts[:index + 1])
    return None
