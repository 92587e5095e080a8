"""Run one hook command: a real process, its output relayed to the log, bounded by a timeout.

The command starts from its argv (no shell), through ``proc.spawn`` (so with ``childenv``'s
environment: no secret variable reaches it) plus the hook's ``ZBAK_*`` variables, with
stdin from /dev/null, stdout and stderr on one pipe, in its own session (its process
group is what a timeout kills: a shell's children too) and under ``setpriv --pdeathsig``
where available (it gets SIGTERM if zbak dies). Each output line is logged at INFO as it
comes (at most ``LOG_LINES`` lines, each cut at ``LINE_CHARS``); the last few are kept for
the failure message.

At the timeout, or when zbak itself is interrupted (SIGTERM, Ctrl-C) while waiting, the
group gets SIGTERM, then SIGKILL after ``KILL_GRACE`` seconds.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Iterable, Mapping, Sequence

from zrepl_py.proc import spawn
from zrepl_py.proc.pipeline import pdeathsig_prefix

log = logging.getLogger(__name__)

KILL_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL of a hook's process group."""
RELAY_GRACE = 5.0
"""Seconds to keep reading output after the command exited (a background child may hold
the pipe: it is not waited for)."""
LOG_LINES = 1000
"""Output lines logged per command; the rest is read and dropped."""
LINE_CHARS = 1000
TAIL_LINES = 3
"""Output lines quoted in a failure's message."""


@dataclasses.dataclass(frozen=True)
class CommandOutcome:
    """How one hook command ended.

    Attributes:
        ok: it exited 0.
        problem: why not, one line (``exited 3``, ``killed by signal 9``, ``timed out after
            30s``, ``cannot start: ...``), with the last output lines; None when ok.
    """

    ok: bool
    problem: str | None = None


def _relay(stream: Iterable[str], label: str, tail: collections.deque[str]) -> None:
    logged = 0
    for raw in stream:
        line = raw.rstrip("\n")[:LINE_CHARS]
        if not line.strip():
            continue
        tail.append(line)
        logged += 1
        if logged <= LOG_LINES:
            log.info("%s: %s", label, line)
        elif logged == LOG_LINES + 1:
            log.info("%s: more output than %d lines: the rest is not logged", label, LOG_LINES)


def _stop_group(popen: spawn.Popen[str]) -> None:
    """SIGTERM the command's process group, SIGKILL it after ``KILL_GRACE``, reap it."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            pass
        try:
            popen.wait(wait)
            return
        except spawn.TimeoutExpired:
            continue


def _ended(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited {code}"


def run_command(argv: Sequence[str], variables: Mapping[str, str], *, timeout: float,
                label: str) -> CommandOutcome:
    """Run ``argv`` with this process's environment (minus secrets) plus ``variables``.

    Args:
        argv: the program (absolute path) and its arguments.
        variables: the hook's ``ZBAK_*`` variables.
        timeout: seconds it may run.
        label: how log lines name it, e.g. ``pre-snapshot hook of job db``.

    Returns:
        the outcome; a command that cannot be started is a failed outcome, not an error.

    Raises:
        KeyboardInterrupt: zbak was interrupted while the command ran (the command was
            stopped first; see the module doc).
    """
    if not os.access(argv[0], os.X_OK):
        why = "not executable" if os.path.exists(argv[0]) else "no such file"
        return CommandOutcome(False, f"cannot start {argv[0]}: {why}")
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    log.info("%s: running %s (timeout %gs)", label, " ".join(argv), timeout)
    try:
        popen = spawn.popen(pdeathsig_prefix() + list(argv), env={**os.environ, **variables},
                            stdin=spawn.DEVNULL, stdout=spawn.PIPE, stderr=spawn.STDOUT,
                            start_new_session=True, text=True, errors="replace", bufsize=1)
    except OSError as exc:
        return CommandOutcome(False, f"cannot start {argv[0]}: {exc.strerror or exc}")
    reader = threading.Thread(target=_relay, args=(popen.stdout, label, tail),
                              name=f"hook output {label}", daemon=True)
    reader.start()
    started = time.monotonic()
    try:
        code = popen.wait(timeout)
    except spawn.TimeoutExpired:
        _stop_group(popen)
        return CommandOutcome(False, _with_tail(f"timed out after {timeout:g}s: stopped", tail,
                                                reader))
    except BaseException:
        _stop_group(popen)
        reader.join(RELAY_GRACE)
        raise
    problem = None if code == 0 else _with_tail(_ended(code), tail, reader)
    if problem is None:
        reader.join(RELAY_GRACE)
        log.info("%s: done in %.1f s", label, time.monotonic() - started)
    return CommandOutcome(code == 0, problem)


def _with_tail(what: str, tail: collections.deque[str], reader: threading.Thread) -> str:
    reader.join(RELAY_GRACE)
    return what + (": " + " | ".join(tail) if tail else "")
