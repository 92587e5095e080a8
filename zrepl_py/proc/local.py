"""LocalExecutor: run argv lists with subprocess on this machine (never a shell)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from zrepl_py.errors import CommandFailed
from zrepl_py.proc import spawn
from zrepl_py.proc.executor import Completed

log = logging.getLogger(__name__)


class LocalExecutor:
    """Executor for this machine; follows the contract in ``zrepl_py.proc.executor``.

    Commands start with this process's environment minus its secrets
    (``zrepl_py.proc.spawn``), or with ``env`` minus its secrets when given.

    Args:
        prefix: argv prepended to every command, e.g. ``["sudo", "-n"]``.
        env: the environment commands start with (``zbak serve`` passes its scrubbed
            one, ``serve.execute.clean_env``); None: this process's.
    """

    host = "local"

    def __init__(self, prefix: Sequence[str] = (), env: Mapping[str, str] | None = None):
        self.prefix = list(prefix)
        self.env = env

    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> Completed:
        """Run ``argv`` and wait; see the Executor contract for errors."""
        full = self.prefix + list(argv)
        log.debug("run [local]: %s", full)
        try:
            proc = spawn.run(
                full,
                env=self.env,
                input=input,
                stdin=None if input is not None else spawn.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except spawn.TimeoutExpired as exc:
            raise CommandFailed(full, None, f"timed out after {timeout} s", self.host) from exc
        except FileNotFoundError as exc:
            raise CommandFailed(full, 127, f"command not found: {full[0]}", self.host) from exc
        done = Completed(tuple(full), proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise CommandFailed(full, proc.returncode, done.error_text, self.host)
        return done
