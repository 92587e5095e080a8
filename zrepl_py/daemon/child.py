"""One scheduled run = one ``zbak ACTION JOB`` child process, its output relayed to the log.

Why a child process rather than a call in a thread: the run is exactly a manual run (same
command, same per-dataset lock, same catalog records, exit 3 when the lock is taken), and it
can be stopped cleanly: SIGTERM makes ``zbak`` unwind as on Ctrl-C (``cli._terminate``), so
its pipeline stops and reaps every stage, the run is recorded as failed and a partial
receive stays resumable where the target supports it. A thread could not be interrupted
in the middle of a transfer. The child starts in its own session (a Ctrl-C meant for the
daemon's terminal reaches the daemon only, which then stops its children itself) and
through ``setpriv --pdeathsig TERM`` (util-linux), so it still gets SIGTERM if the daemon is
killed outright. A daemon run costs a Python start-up (well under a second here): nothing
next to a snapshot or a transfer.

The child logs in zbak's human format on stderr (``logsetup``): each such line is re-logged
by the daemon under the child's logger name and level, with the run's job and action (so
JSON logs stay one object per line); other output (tables, ``zbak: ...`` messages) is
logged too, messages at WARNING, tables at DEBUG.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from zrepl_py.daemon.logs import RunLogger, run_logger
from zrepl_py.daemon.plan import action_command
from zrepl_py.errors import ExitStatus
from zrepl_py.proc import spawn

log = logging.getLogger(__name__)
output_log = logging.getLogger("zrepl_py.daemon.output")

RELAY_GRACE = 5.0
"""Seconds to keep reading a child's output after it exited."""
_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<logger>[\w.]+): (?P<message>.*)$"
)


def action_argv(config_path: Path, action: str, job: str, *, debug: bool = False) -> list[str]:
    """``[setpriv --pdeathsig TERM --] python -m zrepl_py --config PATH [--debug] ACTION JOB``
    (``copy JOB --to STORE`` for action ``copy:STORE``, ``daemon.plan.action_command``)."""
    prefix = []
    setpriv = shutil.which("setpriv")
    if setpriv:
        prefix = [setpriv, "--pdeathsig", "TERM", "--"]
    flags = ["--debug"] if debug else []
    return [*prefix, sys.executable, "-m", "zrepl_py", "--config", str(config_path), *flags,
            *action_command(action, job)]


def start(argv: list[str], env: Mapping[str, str]) -> spawn.Popen[str]:
    """Start the child with stdout and stderr on one pipe (read with ``relay``).

    Raises:
        OSError: the interpreter could not be started.
    """
    return spawn.popen_zbak(argv, env, stdin=spawn.DEVNULL, stdout=spawn.PIPE,
                            stderr=spawn.STDOUT, start_new_session=True,
                            text=True, errors="replace", bufsize=1)  # fmt: skip


def relay(popen: spawn.Popen[str], job: str, action: str, messages: list[str]) -> None:
    """Log every line the child prints until its output closes; append its ``zbak:``
    message lines (the errors it reported) to ``messages``, for the run's summary."""
    assert popen.stdout is not None
    for raw in popen.stdout:
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        match = _LINE.match(line)
        if match:
            logger = run_logger(logging.getLogger(match["logger"]), job, action)
            level = logging.getLevelNamesMapping().get(match["level"], logging.INFO)
            logger.log(level, "%s", match["message"])
        elif line.startswith("zbak:"):
            messages.append(line)
            run_logger(output_log, job, action).warning("%s", line)
        else:
            run_logger(output_log, job, action).debug("%s", line)


def wait(popen: spawn.Popen[str], job: str, action: str) -> tuple[int, list[str]]:
    """Relay the child's output (``relay``, in a thread) until it exits; return its exit
    status and its ``zbak:`` messages. Waits at most ``RELAY_GRACE`` seconds for the output
    to close after the exit: a stray grandchild still holding the pipe must not hold up the
    daemon."""
    messages: list[str] = []
    thread = threading.Thread(target=relay, args=(popen, job, action, messages),
                              name=f"relay {job} {action}", daemon=True)
    thread.start()
    code = popen.wait()
    thread.join(RELAY_GRACE)
    return code, list(messages)


def terminate(popen: spawn.Popen[str]) -> None:
    """Send SIGTERM to the child (it stops its transfer and exits); no-op once it exited."""
    if popen.poll() is None:
        try:
            os.kill(popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def kill(popen: spawn.Popen[str]) -> None:
    """SIGKILL the child's whole session (its pipeline stages die by their pdeathsig)."""
    if popen.poll() is None:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def log_exit(logger: RunLogger, job: str, code: int, seconds: float,
             messages: list[str]) -> None:
    """Log how a run of ``job`` ended (exit ``code`` after ``seconds``; ``messages`` from
    ``wait``) on ``logger`` (``logs.run_logger``): done, skipped for a lock (exit 3), audit
    findings (4), waiting for a thaw (75), or failed."""
    if code == ExitStatus.OK:
        logger.info("done in %.1f s", seconds)
    elif code == ExitStatus.LOCKED:
        logger.warning("skipped: another run holds the dataset's lock (%s)",
                       "; ".join(messages) or "exit 3")
    elif code == ExitStatus.AUDIT_FINDINGS:
        logger.error("audit found problems (exit 4) after %.1f s: run `zbak audit %s`",
                     seconds, job)
    elif code == ExitStatus.THAW_PENDING:
        logger.warning("waiting for a cold-object thaw (exit 75); the next run goes on")
    else:
        logger.error("failed with exit %d after %.1f s: %s", code, seconds,
                     "; ".join(messages) or "see the lines above")
