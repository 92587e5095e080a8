"""Secret: a string that never shows itself in repr, str, logs or exceptions
(docs/style.md#secrets-are-a-type)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from zrepl_py.runtime.reading import SECRET_LIMIT, open_to_others, read_regular

log = logging.getLogger(__name__)


class Secret:
    """Holds a secret value; ``str()``/``repr()`` print ``<redacted>``.

    Load with ``Secret.from_env`` or ``Secret.from_file``; the config accepts
    ``{ env = "NAME" }`` or ``{ file = "/path" }``, never the value inline or from argv.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        """Return the value; call only where it is handed to a library, never to a log."""
        return self._value

    def __repr__(self) -> str:
        return "Secret(<redacted>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    @classmethod
    def from_env(cls, name: str) -> Secret:
        """Read the secret from environment variable ``name``.

        Raises:
            KeyError: when the variable is not set.
        """
        return cls(os.environ[name])

    @classmethod
    def from_file(cls, path: str | Path) -> Secret:
        """Read the secret from a file (trailing newline stripped).

        Raises:
            OSError: when the file cannot be read, is not a regular file or is larger than
                ``reading.SECRET_LIMIT`` (64 KiB).
            UnicodeDecodeError: it is not UTF-8.
        """
        mode = open_to_others(path)
        if mode is not None:
            log.warning("secret file %s is readable by every user (mode %04o): chmod 600 it",
                        path, mode)
        return cls(read_regular(path, SECRET_LIMIT).decode().rstrip("\n"))
