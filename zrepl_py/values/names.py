"""Names of hosts, stores and jobs in the config (PURE, import-light: ``zbak serve`` checks
a value with it without loading the config schema)."""

from __future__ import annotations

import re

_CONFIG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def is_config_name(value: str) -> bool:
    """True when ``value`` can name a host, store or job in the config (1-64 of
    ``A-Za-z0-9_.-``, a letter or digit first; the whole string, so no trailing newline)."""
    return _CONFIG_NAME.fullmatch(value) is not None
