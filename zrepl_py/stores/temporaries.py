"""The temporary files of puts in a directory store (``file://``, ``sftp://``): one naming rule
for both, so each finds, hides and removes the other's leftovers alike.

A put of ``DIR/NAME`` writes ``DIR/.NAME.partial-XXXXXXXX`` (a dot first: hidden from ``ls``;
``XXXXXXXX`` of ``[a-z0-9_]``, as ``tempfile.mkstemp`` names them), then renames it over
``DIR/NAME``. A process killed mid-put leaves it (docs/decisions.md#leftover-uploads-of-interrupted-archives).
"""

from __future__ import annotations

import re
import secrets
import string

MARK = ".partial-"
"""What stands between the key's name and the random part."""
_PARTS = re.compile(r"^\.(?P<name>.+)\.partial-[a-z0-9_]+$")
_RANDOM = string.ascii_lowercase + string.digits


def temporary_name(name: str) -> str:
    """A fresh temporary name for the object ``name`` (the key's last segment):
    ``.NAME.partial-`` and 8 random characters of ``[a-z0-9]``."""
    return f".{name}{MARK}{''.join(secrets.choice(_RANDOM) for _ in range(8))}"


def lead(name: str) -> str:
    """How every temporary name of the object ``name`` starts: ``.NAME.partial-``."""
    return f".{name}{MARK}"


def meant_for(entry: str) -> str | None:
    """The object name a temporary file ``entry`` was written for, or None when ``entry`` is
    no temporary name (``.vol.partial-abc123`` -> ``vol``)."""
    match = _PARTS.match(entry)
    return match["name"] if match else None
