"""How a bandwidth limit in force is shown by ``zbak replicate --dry-run`` and ``zbak status``
(``values.timetable.InForce``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zrepl_py.values.timetable import InForce


def limit_text(found: InForce) -> str:
    """``10 MB/s until 2026-12-01 18:00Z (window "mon-fri 08:00-18:00")``, ``off until ...
    (default)``, or ``10 MB/s`` for a limit that never changes."""
    text = found.describe()
    if found.until is None and found.window is None:
        return text
    return text + (f' (window "{found.window}")' if found.window else " (default)")


def limit_json(found: InForce) -> dict[str, Any]:
    """``{"limit": bytes/s or null, "window": key or null, "until": ISO 8601 UTC or null}``."""
    return {"limit": found.limit, "window": found.window,
            "until": found.until.isoformat() if found.until else None}
