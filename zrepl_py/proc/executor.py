"""The Executor contract: run one command from an argv list, locally or on a host.

Contract for every implementation (LocalExecutor, SSHExecutor, test wrappers):
- ``argv`` is a list of str; no shell ever sees it locally. The SSH executor is the only
  place an argv becomes a string (``shlex.join``), so each element arrives byte-identical.
- ``run`` returns a ``Completed`` whatever the exit status when ``check=False``; with
  ``check=True`` (the default) a non-zero exit raises ``CommandFailed`` carrying argv,
  exit code, stderr and host. Callers map it to narrower errors (zfs/errors.py).
- ``run`` never raises for output on stderr alone.
- Connection problems raise ``HostUnreachable`` or ``HostKeyMismatch``, never CommandFailed.
- A timeout kills the command and raises ``CommandFailed`` with ``returncode=None``.
- Secrets are never passed in argv (docs/style.md#secrets-are-a-type); executors log every argv at
  DEBUG.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

COMMAND_NOT_FOUND = 127
"""Exit status of a shell (and of LocalExecutor) for a missing command: e.g. no zfs on a host."""


@dataclasses.dataclass(frozen=True)
class Completed:
    """The result of a finished command: exit status and captured output (bytes)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        """Standard output decoded as UTF-8 (ZFS names may be any UTF-8)."""
        return self.stdout.decode("utf-8", errors="surrogateescape")

    @property
    def error_text(self) -> str:
        """Standard error decoded and stripped, for messages."""
        return self.stderr.decode("utf-8", errors="replace").strip()


class Executor(Protocol):
    """Runs commands on one host; see the module docstring for the error contract."""

    host: str
    """A label for messages and logs: ``"local"`` or the config's host name."""

    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> Completed:
        """Run ``argv`` to completion, feeding ``input`` on stdin; timeout in seconds."""
        ...
