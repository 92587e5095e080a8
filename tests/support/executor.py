"""Faulty and recording Executors, and pipeline Stages that misbehave
(docs/reliability.md#r1-interrupted-full-send-resumes,
docs/reliability.md#r6-receiver-fails-while-the-sender-is-still-writing,
docs/reliability.md#r7-a-failing-pipeline-stage-is-detected).

Executors (``zrepl_py.proc.executor`` contract) wrap a real executor:

* :class:`RecordingExecutor` records every argv it is asked to run, then runs it: tests assert
  that nothing ran (a hostile name rejected before any process started) or that no argv holds
  a secret.
* :class:`FaultyExecutor` answers the commands a predicate selects with an injected failure
  (exit status and stderr, without running them), or runs them and adds stderr text.

Stage helpers wrap a real ``Stage`` (``zrepl_py.proc.pipeline``) in ``support/stagewrap.py``, so
the real process still runs and only its stream or exit is changed:

* :func:`cut_stage`: kill the sender after N bytes of its stdout (exit 137).
* :func:`stderr_stage`: write text to stderr, then exec the real command.
* :func:`fail_at_end_stage`: pass the whole stream, then exit non-zero.
* :func:`flip_stage`: pass the stream with one byte XORed.
* :func:`failing_receiver_stage`: a receiver that reads N bytes, then fails.
* :func:`garbage_stage`: a sender of N bytes that are not a ZFS stream.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from zrepl_py.errors import CommandFailed
from zrepl_py.proc.executor import Completed, Executor
from zrepl_py.proc.pipeline import Stage

STAGEWRAP = Path(__file__).with_name("stagewrap.py")
"""The wrapper script every stage helper runs (see its docstring for the modes)."""


class RecordingExecutor:
    """Run through ``inner`` and record each argv (as a tuple of str) in ``calls``.

    Args:
        inner: the real executor (``LocalExecutor``, ``SSHExecutor``).
    """

    def __init__(self, inner: Executor):
        self.inner = inner
        self.host = inner.host
        self.calls: list[tuple[str, ...]] = []
        self._lock = threading.Lock()

    def run(self, argv: Sequence[str], *, input: bytes | None = None, check: bool = True,
            timeout: float | None = None) -> Completed:
        """Record ``argv``, then the inner ``run`` (same contract, same errors)."""
        with self._lock:
            self.calls.append(tuple(argv))
        return self.inner.run(argv, input=input, check=check, timeout=timeout)


class FaultyExecutor:
    """Inject failures into the commands ``match`` selects; run the others through ``inner``.

    Args:
        inner: the real executor.
        match: ``argv -> bool``; True selects the command for the fault.
        returncode: for a selected command, the exit status answered WITHOUT running it
            (None: run it for real).
        stderr: text answered on stderr (with ``returncode``), or appended to the real
            command's stderr (without).
        times: how many selected commands get the fault (None: all of them).

    ``calls`` records every argv as ``(argv, injected)``. Follows the Executor contract: with
    ``check=True`` an injected non-zero status raises ``CommandFailed`` (argv, status, stderr,
    host), else a ``Completed`` is returned.
    """

    def __init__(self, inner: Executor, match: Callable[[Sequence[str]], bool], *,
                 returncode: int | None = 1, stderr: str = "injected fault",
                 times: int | None = None):
        self.inner = inner
        self.host = inner.host
        self.match = match
        self.returncode = returncode
        self.stderr = stderr
        self.times = times
        self.calls: list[tuple[tuple[str, ...], bool]] = []
        self._lock = threading.Lock()

    def _select(self, argv: Sequence[str]) -> bool:
        with self._lock:
            hit = self.match(argv) and (self.times is None or self.times > 0)
            if hit and self.times is not None:
                self.times -= 1
            self.calls.append((tuple(argv), hit))
        return hit

    def run(self, argv: Sequence[str], *, input: bytes | None = None, check: bool = True,
            timeout: float | None = None) -> Completed:
        """The inner ``run``, or the injected answer for a selected command."""
        if not self._select(argv):
            return self.inner.run(argv, input=input, check=check, timeout=timeout)
        if self.returncode is not None:
            done = Completed(tuple(argv), self.returncode, b"", self.stderr.encode())
        else:
            real = self.inner.run(argv, input=input, check=False, timeout=timeout)
            done = Completed(real.argv, real.returncode, real.stdout,
                             real.stderr + self.stderr.encode())
        if check and done.returncode != 0:
            raise CommandFailed(list(argv), done.returncode, done.error_text, self.host)
        return done


def _wrap(name: str, mode: Sequence[str], inner: Stage | None) -> Stage:
    argv = [sys.executable, str(STAGEWRAP), *mode]
    if inner is not None:
        argv += ["--", *inner.argv]
    return Stage(name, tuple(argv))


def cut_stage(stage: Stage, after_bytes: int) -> Stage:
    """``stage`` killed (SIGKILL) after it wrote ``after_bytes`` bytes; the wrapper exits 137
    and names the kill on stderr. Same stage name, so errors blame it as before."""
    return _wrap(stage.name, ["cut", "--after", str(after_bytes)], stage)


def stderr_stage(stage: Stage, text: str) -> Stage:
    """``stage`` with ``text`` written to its stderr first; its stream and status unchanged."""
    return _wrap(stage.name, ["stderr", "--text", text], stage)


def fail_at_end_stage(stage: Stage, code: int = 1, text: str = "injected: failed at the end"
                      ) -> Stage:
    """``stage`` whose whole stream passes, then exit ``code`` with ``text`` on stderr."""
    return _wrap(stage.name, ["fail-at-end", "--code", str(code), "--text", text], stage)


def flip_stage(stage: Stage, at: int, mask: int = 1) -> Stage:
    """``stage`` with byte ``at`` of its stream XORed with ``mask``; its status unchanged."""
    return _wrap(stage.name, ["flip", "--at", str(at), "--mask", str(mask)], stage)


def failing_receiver_stage(after_bytes: int, code: int = 1,
                           text: str = "injected: the receiver failed", name: str = "receive"
                           ) -> Stage:
    """A receiver that reads ``after_bytes`` bytes, writes ``text`` and exits ``code``."""
    return _wrap(name, ["receiver-fails", "--after", str(after_bytes), "--code", str(code),
                        "--text", text], None)


def garbage_stage(size: int, seed: int = 0, name: str = "zfs send") -> Stage:
    """A sender of ``size`` seeded pseudo-random bytes (not a ZFS stream), exit 0."""
    return _wrap(name, ["garbage", "--bytes", str(size), "--seed", str(seed)], None)
