"""Run a process pipeline (``zfs send | zstd | ssh HOST 'zstd -d | zfs receive ...'``).

The replication data path (docs/design.md#replication) never passes through Python: stage i's
stdout is an OS pipe that is stage i+1's stdin, exactly as a shell pipe, so throughput is the
raw pipe's. Python only starts the stages, drains their stderr, watches their exit status and
reads the byte count from the kernel's per-process I/O accounting.

Behaviour:

- Every stage starts from an argv list (never a shell) in its own session and process group,
  so stopping a stage stops its children too (ssh's, a wrapper's). Stage 0 reads /dev/null
  unless ``stdin`` is given; the last stage writes to /dev/null unless ``stdout`` is given.
  Stages get this process's environment minus its secrets (``proc.spawn``).
- If zbak itself dies (SIGTERM, SIGKILL, OOM), every stage gets SIGTERM from the kernel:
  stages start through util-linux ``setpriv --pdeathsig TERM`` (prctl(2) PR_SET_PDEATHSIG;
  a ``preexec_fn`` is unsafe with the stderr threads running), so no orphaned ``zfs receive``
  outlives the lock of the run that started it. Where setpriv is missing the stages start
  directly, without that guard. The kernel clears the signal for set-user-ID programs
  (``sudo``), so a local ``sudo`` stage is not covered.
- Each stage's stderr is drained by a thread that keeps the last 64 KiB, so a chatty stage
  never blocks on a full stderr pipe.
- When a stage exits non-zero, the caller's ``cancel`` event is set or ``timeout`` passes,
  every stage's process group gets SIGTERM, then SIGKILL after ``kill_grace`` seconds; all
  stages are reaped (no zombies, no stage left blocked on a pipe) and ``PipelineFailed``
  (``PipelineCancelled``, ``PipelineTimedOut``) is raised, naming the culprit stage.
- The culprit follows zrepl's rule that a failing receiver's message wins over the sender's
  broken pipe: stages that failed only because a neighbour went away (SIGPIPE, exit 141,
  "Broken pipe" on stderr, or still running when zbak stopped the pipeline) are skipped, the
  first remaining failure upstream to downstream is blamed; if none remain, the most
  downstream failure is.

Byte counting (``Meter``) never touches the data: it reads ``wchar`` (bytes passed to
write(2) and friends) or ``rchar`` from ``/proc/PID/io`` (proc(5)), sampled every
``interval`` seconds and read a last time from the stage's zombie (``os.waitid`` with
``WNOWAIT`` leaves it unreaped) so the final count is complete. The kernel adds a reaped
child's counts to its parent's (``wait_task_zombie`` in kernel/exit.c), so a wrapper that
waits for its child (``sh -c``, tested; ``sudo`` should too, untested: not installed here)
counts what its child wrote. Verified here: ``wchar`` of ``head -c N`` and of
OpenZFS 2.3.2 ``zfs send`` (plain and ``-c``, also behind ``sh -c``) equals the stream size
exactly, unless BSD process accounting is on (acct(5), ``accton``): the kernel writes an
exiting process's 64-byte record as that process, so the count is 64 bytes more per process
that ended in it (measured: +64 for a stage, +128 behind ``sh -c``). Not so for zfs-fuse: its ``zfs send`` hands the pipe to the zfs-fuse daemon over a
unix socket and the daemon writes the stream, so the ``zfs`` process's ``wchar`` is only its
socket traffic (~100 KB for a 20 MB stream); there use ``Meter.READ`` (``rchar`` of stage 1:
the stream plus that stage's own other reads, setpriv's and ld.so's included: measured
+17 KB for ``cat``, +19 KB for ``zstd``, +40 KB (2 MB stream) to +156 KB (200 MB) for
``ssh``, which also reads its socket).
zfs-fuse's ``zfs receive`` does not read the stream itself either, so a local zfs-fuse
``send | receive`` has no faithful counter without a stage in between.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import logging
import os
import select
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from zrepl_py.errors import PipelineCancelled, PipelineFailed, PipelineTimedOut
from zrepl_py.proc import spawn

log = logging.getLogger(__name__)

STDERR_TAIL = 64 * 1024
"""Bytes of each stage's stderr kept (the last ones)."""
KILL_GRACE = 2.0
"""Default seconds between SIGTERM and SIGKILL when a pipeline is stopped."""
_TICK = 0.1  # longest sleep between checks of the cancel event and the timeout, seconds
_DRAIN_WAIT = 2.0  # seconds to wait for a stderr pipe's EOF after its stage was reaped
_GROUP_WAIT = 1.0  # seconds to wait for a stopped stage's process group to empty
# Seconds the stages downstream of a failed one get to end on their own before zbak stops
# them: a stage that closes its input and then exits (GNU head, zstd on a bad frame) lets
# its writer die of SIGPIPE first, and stopping it in that moment would mark it as stopped
# by zbak, when it ended by itself (its own exit status, so the culprit rule can see it).
_FAILURE_SETTLE = 0.5
_PDEATHSIG: dict[str, list[str]] = {}  # "prefix" -> the setpriv argv prefix, once probed


def pdeathsig_prefix() -> list[str]:
    """``["/usr/bin/setpriv", "--pdeathsig", "TERM", "--"]``, or [] where that does not work
    (probed once per process): put before an argv, the program gets SIGTERM when the thread
    that started it dies (prctl(2) PR_SET_PDEATHSIG), so it cannot outlive a killed zbak."""
    if "prefix" not in _PDEATHSIG:
        prefix: list[str] = []
        setpriv = shutil.which("setpriv")
        if setpriv:
            candidate = [setpriv, "--pdeathsig", "TERM", "--"]
            try:
                probe = spawn.run(candidate + ["true"], stdin=spawn.DEVNULL,
                                       capture_output=True, timeout=10, check=False)  # fmt: skip
                if probe.returncode == 0:
                    prefix = candidate
            except (OSError, spawn.SubprocessError):
                pass
        if not prefix:
            log.debug("setpriv --pdeathsig unavailable: stages may outlive a killed zbak")
        _PDEATHSIG["prefix"] = prefix
    return _PDEATHSIG["prefix"]


@dataclasses.dataclass(frozen=True)
class Stage:
    """One process of a pipeline.

    Attributes:
        name: a label for messages ("send", "compress", "ratelimit", "ssh receive").
        argv: the full local argv, one str per argument; a remote command is
            ``ssh_argv(...) + [remote_command(...)]`` (``zrepl_py.proc.openssh``).

    Raises:
        ValueError: ``argv`` is empty.
    """

    name: str
    argv: tuple[str, ...]

    def __post_init__(self) -> None:
        argv = tuple(str(arg) for arg in self.argv)
        if not argv:
            raise ValueError(f"stage {self.name!r} has an empty argv")
        object.__setattr__(self, "argv", argv)


@dataclasses.dataclass(frozen=True)
class StageResult:
    """How one stage ended.

    Attributes:
        name, argv: as in its ``Stage``.
        returncode: exit status; ``-N`` when killed by signal N (subprocess's convention);
            126/127 when it could not be started (not executable / not found); ``None`` when
            it was never started (an earlier stage could not start) or is synthetic.
        stderr: the last 64 KiB of its standard error, decoded as UTF-8 (bad bytes replaced).
        broken_pipe: it failed because its reader went away (SIGPIPE, exit 141, or
            "Broken pipe" on stderr), not on its own.
        killed: it was still running when zbak stopped the pipeline (another stage failed,
            cancel, timeout) and was signalled, so its failure is not its own either.
        pid: its process id, which is also its process group and session id; None when it
            was not started.
    """

    name: str
    argv: tuple[str, ...]
    returncode: int | None
    stderr: str
    broken_pipe: bool
    killed: bool = False
    pid: int | None = None

    @property
    def failed(self) -> bool:
        """True when the stage ran (or tried to) and did not exit 0."""
        return self.returncode not in (0, None)

    @property
    def status(self) -> str:
        """Its ending in words: ``exit 1``, ``killed by SIGTERM``, ``not started``."""
        if self.returncode is None:
            return "not started"
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exit {self.returncode}"


@dataclasses.dataclass(frozen=True)
class PipelineResult:
    """A pipeline whose stages all exited 0.

    Attributes:
        stages: one ``StageResult`` per stage, upstream first (stderr may hold warnings).
        bytes: the stream size: bytes the first stage wrote into its pipe, as counted by the
            ``Meter`` chosen (see the module doc for when that count is exact).
        seconds: wall time from starting the first stage to reaping the last.
    """

    stages: tuple[StageResult, ...]
    bytes: int
    seconds: float


class Meter(enum.Enum):
    """Where ``run_pipeline`` reads the stream size (see the module doc)."""

    WRITTEN = "written"
    """``wchar`` of stage 0: exact when stage 0 (or a child it reaps) writes the stream itself
    and nothing else (true for OpenZFS ``zfs send``, ``cat``, ``head``; its stderr counts too)."""
    READ = "read"
    """``rchar`` of stage 1: the stream plus stage 1's own other reads (start-up, config
    files, for ssh its socket); for writers that do not write themselves (zfs-fuse)."""


def is_broken_pipe(returncode: int | None, stderr: str) -> bool:
    """True when an exit looks caused by a reader going away: SIGPIPE, 141, "Broken pipe".

    Args:
        returncode: as in ``StageResult`` (negative for a signal).
        stderr: the stage's standard error.
    """
    if returncode in (-signal.SIGPIPE, 128 + signal.SIGPIPE):
        return True
    return returncode not in (0, None) and "broken pipe" in stderr.lower()


def choose_culprit(results: Sequence[StageResult]) -> StageResult | None:
    """Return the stage to blame for a failed pipeline, or None when none failed.

    Upstream to downstream, the first stage that failed on its own (neither ``broken_pipe``
    nor ``killed``); when every failure was caused by a neighbour, the most downstream one.
    """
    failed = [result for result in results if result.failed]
    own = [result for result in failed if not (result.broken_pipe or result.killed)]
    if own:
        return own[0]
    return failed[-1] if failed else None


class _StderrTail(threading.Thread):
    """Reads one stage's stderr pipe to EOF, keeping the last ``STDERR_TAIL`` bytes."""

    def __init__(self, fd: int, name: str):
        super().__init__(name=f"stderr-{name}", daemon=True)
        self.fd = fd
        self._lock = threading.Lock()
        self._tail = bytearray()

    def run(self) -> None:
        try:
            while True:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    return
                with self._lock:
                    self._tail += chunk
                    if len(self._tail) > STDERR_TAIL:
                        del self._tail[: len(self._tail) - STDERR_TAIL]
        except OSError:
            return
        finally:
            os.close(self.fd)

    def text(self) -> str:
        """What was read so far, decoded."""
        with self._lock:
            return self._tail.decode("utf-8", errors="replace")


@dataclasses.dataclass
class _Child:
    stage: Stage
    popen: spawn.Popen[bytes] | None = None
    start_error: tuple[int, str] | None = None  # (returncode, message) when Popen failed
    tail: _StderrTail | None = None
    pidfd: int | None = None
    exited: bool = False  # seen exited (peeked with WNOWAIT, not yet reaped)
    status: int | None = None  # exit status once exited, subprocess's convention
    killed: bool = False

    @property
    def pid(self) -> int:
        """The started stage's process id, which is also its process group's."""
        assert self.popen is not None, f"stage {self.stage.name} was not started"
        return self.popen.pid


def _io_counter(pid: int, field: str) -> int | None:
    """``field`` (``wchar``/``rchar``) of /proc/PID/io, None when unreadable (gone, no access)."""
    try:
        with open(f"/proc/{pid}/io", "rb") as handle:
            for line in handle:
                key, _, value = line.partition(b":")
                if key == field.encode():
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _peek_exit(pid: int) -> int | None:
    """Exit status of child ``pid`` if it has exited, leaving it a zombie; else None."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped by someone else: Popen.wait will tell
        return 0
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status  # CLD_KILLED / CLD_DUMPED


def live_group_members(pgids: set[int] | frozenset[int]) -> list[int]:
    """Pids of processes that are in one of the process groups ``pgids`` and not zombies.

    Zombies do not count: they hold no pipe and run nothing, and an orphan's zombie lingers
    until init reaps it (or forever, under an init that does not reap, as on the test bed).
    """
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses (proc(5)).
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != b"Z" and int(fields[2]) in pgids:
            members.append(int(entry))
    return members


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _Pipeline:
    """One run of ``run_pipeline``; see there."""

    def __init__(self, stages: Sequence[Stage], stdin: int | None,
                 stdout: int | IO[bytes] | None, meter: Meter, pipe_size: int | None):
        self.children = [_Child(stage) for stage in stages]
        self.stdin = stdin
        self.stdout = stdout
        self.meter_child = self.children[0 if meter is Meter.WRITTEN else 1]
        self.meter_field = "wchar" if meter is Meter.WRITTEN else "rchar"
        self.pipe_size = pipe_size
        self.final_bytes: int | None = None
        self.last_bytes = 0
        self.poller = select.poll()
        self.started_at = time.monotonic()

    # --- starting ---------------------------------------------------------------------------

    def start(self) -> bool:
        """Start every stage upstream first; False when one could not be started."""
        if self.stdin is None:
            read_end = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        else:  # a copy, closed below like any pipe end: the caller's fd stays open
            read_end = os.dup(self.stdin)
        last = len(self.children) - 1
        devnull_out = None
        out: int | IO[bytes]
        next_read: int | None
        try:
            for index, child in enumerate(self.children):
                if index == last:
                    if self.stdout is None:
                        devnull_out = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
                        out, next_read = devnull_out, None
                    else:
                        out, next_read = self.stdout, None
                else:
                    next_read, out = os.pipe()
                    if self.pipe_size:
                        with contextlib.suppress(OSError):  # above pipe-max-size: keep default
                            fcntl.fcntl(out, fcntl.F_SETPIPE_SZ, self.pipe_size)
                err_read, err_write = os.pipe()
                try:
                    self._spawn(child, read_end, out, err_write)
                finally:
                    # The parent must not keep pipe ends: a reader sees EOF only when every
                    # copy of the write end is closed, a writer EPIPE only for every read end.
                    os.close(err_write)
                    os.close(read_end)
                    if next_read is not None and isinstance(out, int):  # our pipe's write end
                        os.close(out)
                    read_end = next_read if next_read is not None else -1
                if child.popen is None:
                    os.close(err_read)
                    if read_end >= 0:
                        os.close(read_end)
                    read_end = -1
                    return False
                child.tail = _StderrTail(err_read, child.stage.name)
                child.tail.start()
            return True
        finally:
            if devnull_out is not None:
                os.close(devnull_out)

    def _spawn(self, child: _Child, stdin: int, stdout: int | IO[bytes], stderr: int) -> None:
        argv = list(child.stage.argv)
        log.debug("pipeline stage %s: %s", child.stage.name, argv)
        if shutil.which(argv[0]) is None:  # say so ourselves, not through setpriv's exec
            if os.sep in argv[0] and os.path.exists(argv[0]):
                child.start_error = (126, f"cannot start {argv[0]}: not executable")
            else:
                child.start_error = (127, f"cannot start {argv[0]}: command not found")
            return
        try:
            # no AWS_*/password variables (docs/reliability.md#r39-no-secrets-in-argv)
            child.popen = spawn.popen(
                pdeathsig_prefix() + argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                close_fds=True,
                start_new_session=True,  # own session and process group, no terminal
            )
        except FileNotFoundError as exc:
            child.start_error = (127, f"cannot start {argv[0]}: {exc.strerror}")
            return
        except OSError as exc:
            child.start_error = (126, f"cannot start {argv[0]}: {exc.strerror}")
            return
        try:
            child.pidfd = os.pidfd_open(child.pid)
            self.poller.register(child.pidfd, select.POLLIN)
        except (AttributeError, OSError):  # no pidfd (old kernel): the tick loop still works
            child.pidfd = None

    # --- watching ---------------------------------------------------------------------------

    def running(self) -> list[_Child]:
        return [c for c in self.children if c.popen is not None and not c.exited]

    def peek(self) -> None:
        """Record every stage that exited since the last look, leaving it unreaped."""
        for child in self.running():
            status = _peek_exit(child.pid)
            if status is None:
                continue
            if child is self.meter_child:
                self.final_bytes = self._read_meter()  # from the zombie: the complete count
            child.exited, child.status = True, status
            if child.pidfd is not None:
                self.poller.unregister(child.pidfd)
                os.close(child.pidfd)
                child.pidfd = None

    def any_failed(self) -> bool:
        return any(c.start_error or (c.exited and c.status != 0) for c in self.children)

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking as soon as a stage exits."""
        if seconds > 0:
            self.poller.poll(seconds * 1000)

    def _read_meter(self) -> int | None:
        child = self.meter_child
        if child.popen is None:
            return 0
        return _io_counter(child.pid, self.meter_field)

    def bytes(self) -> int:
        """The byte count now (monotonic: an unreadable sample repeats the last one)."""
        value: int | None
        if self.final_bytes is not None:
            value = self.final_bytes
        else:
            value = self._read_meter()
        if value is not None:
            self.last_bytes = max(self.last_bytes, value)
        return self.last_bytes

    # --- stopping ---------------------------------------------------------------------------

    def stop(self, grace: float, *, settle: float = 0.0) -> None:
        """SIGTERM every stage's process group; after ``grace`` s (or once every stage has
        exited) SIGKILL what is left of the groups; wait until every stage has exited.

        ``settle``: when a stage has failed, the stages downstream of the most upstream
        failed one get up to that many seconds to exit on their own first (those upstream
        are stopped at once: they can only be failing because of it)."""
        started = [c for c in self.children if c.popen is not None]
        self.peek()  # a stage that already exited on its own is not one zbak stopped
        failed = [i for i, c in enumerate(self.children)
                  if c.start_error or (c.exited and c.status != 0)]
        if settle > 0 and failed:
            upstream = [c for c in self.children[:failed[0]] if c in self.running()]
            for child in upstream:
                child.killed = True
                _signal_group(child.pid, signal.SIGTERM)
            self._wait_exits(time.monotonic() + settle)
        for child in self.running():
            child.killed = True
        # Every leader is alive or an unreaped zombie until reap(), so its pid (= pgid) cannot
        # have been reused: each signal reaches that stage's own group only.
        for child in started:
            _signal_group(child.pid, signal.SIGTERM)
        self._wait_exits(time.monotonic() + grace)
        for child in started:  # children of a stage that outlived it, or ignore SIGTERM
            _signal_group(child.pid, signal.SIGKILL)
        self._wait_exits(time.monotonic() + 10)

    def _wait_exits(self, deadline: float) -> None:
        while True:
            self.peek()
            if not self.running() or time.monotonic() >= deadline:
                return
            self.sleep(min(0.05, deadline - time.monotonic()))

    def reap(self, *, stopped: bool) -> tuple[StageResult, ...]:
        """Reap every stage (reading the meter first) and collect results."""
        if self.final_bytes is None and self.meter_child.popen is not None:
            self.peek()
        self.bytes()
        for child in self.children:
            if child.popen is not None:
                child.popen.wait()
            if child.pidfd is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.poller.unregister(child.pidfd)
                os.close(child.pidfd)
                child.pidfd = None
        if stopped:
            self._wait_groups_empty()
        deadline = time.monotonic() + _DRAIN_WAIT
        for child in self.children:
            if child.tail is not None:
                # EOF comes once every holder of the stderr pipe is gone; a descendant that
                # left the stage's process group may keep it: then keep what was read.
                child.tail.join(max(0.0, deadline - time.monotonic()))
        return tuple(self._result(child) for child in self.children)

    def _wait_groups_empty(self) -> None:
        """Give the SIGKILLed members of stopped stages' groups (orphans now) a moment to go."""
        pgids = {c.pid for c in self.children if c.popen is not None}
        deadline = time.monotonic() + _GROUP_WAIT
        while live_group_members(pgids) and time.monotonic() < deadline:
            time.sleep(0.02)

    def _result(self, child: _Child) -> StageResult:
        stage = child.stage
        if child.start_error is not None:
            code, message = child.start_error
            return StageResult(stage.name, stage.argv, code, message, broken_pipe=False)
        if child.popen is None:
            return StageResult(stage.name, stage.argv, None, "", broken_pipe=False)
        stderr = child.tail.text() if child.tail is not None else ""
        code = child.popen.returncode
        return StageResult(
            stage.name,
            stage.argv,
            code,
            stderr,
            broken_pipe=is_broken_pipe(code, stderr),
            killed=child.killed and code != 0,
            pid=child.pid,
        )


def run_pipeline(
    stages: Sequence[Stage],
    *,
    progress: Callable[[int, float], None] | None = None,
    interval: float = 1.0,
    cancel: threading.Event | None = None,
    timeout: float | None = None,
    stdout: int | IO[bytes] | None = None,
    meter: Meter = Meter.WRITTEN,
    kill_grace: float = KILL_GRACE,
    pipe_size: int | None = None,
    stdin: int | None = None,
    on_start: Callable[[tuple[int, ...]], None] | None = None,
) -> PipelineResult:
    """Run ``stages`` connected stdout to stdin by OS pipes and wait for all of them.

    Args:
        stages: one or more stages, upstream first (``meter=Meter.READ`` needs two).
        progress: called as ``progress(bytes, seconds)`` every ``interval`` seconds while the
            pipeline runs (bytes so far, seconds since start); an exception it raises stops
            the pipeline and propagates. When it has them (``ProgressReporter`` does), its
            ``finish(bytes, seconds)`` is called once on success with the final count, and
            its ``close()`` at the end in every case.
        interval: seconds between progress samples.
        cancel: when set, the pipeline is stopped and ``PipelineCancelled`` raised (checked
            every 0.1 s).
        timeout: seconds the whole pipeline may run before it is stopped and
            ``PipelineTimedOut`` raised; None for no limit.
        stdout: where the last stage writes (an fd or a file object with ``fileno()``, left
            open); default /dev/null.
        stdin: an fd stage 0 reads (left open: close it once the pipeline returned, so a
            writer blocked on it gets EPIPE); default /dev/null.
        meter: where the byte count comes from (``Meter``).
        kill_grace: seconds between SIGTERM and SIGKILL when stopping.
        pipe_size: bytes to ask for each pipe's buffer (``F_SETPIPE_SZ``, fcntl(2)); None
            keeps the kernel default (64 KiB), as a shell does.
        on_start: called once every stage has started, with their process ids in stage
            order (setpriv execs the program, so each is the program's own); an exception
            it raises stops the pipeline and propagates.

    Returns:
        ``PipelineResult`` when every stage exited 0.

    Raises:
        PipelineFailed: a stage exited non-zero or could not be started; ``.culprit`` names
            it (see the module doc for the rule), ``.stages`` has every stage's result.
        PipelineCancelled, PipelineTimedOut: subclasses, for ``cancel`` and ``timeout``.
        ValueError: no stages, or ``Meter.READ`` with one stage.
    """
    if not stages:
        raise ValueError("a pipeline needs at least one stage")
    if meter is Meter.READ and len(stages) < 2:
        raise ValueError("Meter.READ counts what stage 1 reads: the pipeline needs 2 stages")
    log.debug("pipeline: %s", " | ".join(stage.name for stage in stages))
    try:
        return _run(stages, progress, interval, cancel, timeout, stdin, stdout, meter,
                    kill_grace, pipe_size, on_start)  # fmt: skip
    finally:
        close = getattr(progress, "close", None)
        if callable(close):
            close()


def _run(stages: Sequence[Stage], progress: Callable[[int, float], None] | None,
         interval: float, cancel: threading.Event | None, timeout: float | None,
         stdin: int | None, stdout: int | IO[bytes] | None, meter: Meter, kill_grace: float,
         pipe_size: int | None, on_start: Callable[[tuple[int, ...]], None] | None
         ) -> PipelineResult:
    """``run_pipeline`` after argument checks, without the progress close."""
    run = _Pipeline(stages, stdin, stdout, meter, pipe_size)
    reason, settle = "failed", 0.0
    try:
        if cancel is not None and cancel.is_set():
            reason = "cancelled"  # before anything started: start nothing
        elif run.start():
            if on_start is not None:
                on_start(tuple(c.pid for c in run.children))
            reason = _watch(run, progress, interval, cancel, timeout)
            settle = _FAILURE_SETTLE if reason == "failed" else 0.0
        if reason != "done":
            run.stop(kill_grace, settle=settle)
    except BaseException:
        run.stop(kill_grace)
        run.reap(stopped=True)
        raise
    results = run.reap(stopped=reason != "done")
    seconds = time.monotonic() - run.started_at
    total = run.bytes()
    if reason == "done":
        log.debug("pipeline done: %d bytes in %.2f s", total, seconds)
        finish = getattr(progress, "finish", None)
        if callable(finish):
            finish(total, seconds)
        return PipelineResult(results, total, seconds)
    if reason == "failed":
        culprit = choose_culprit(results)
        if culprit is not None:
            raise PipelineFailed(results, culprit, bytes=total, seconds=seconds)
        reason_text = "stopped, but no stage reported a failure"  # cannot happen; be explicit
        culprit = StageResult("failed", (), None, reason_text, broken_pipe=False)
        raise PipelineFailed(results, culprit, bytes=total, seconds=seconds)
    stopped = ", ".join(r.name for r in results if r.killed) or "nothing was running"
    if reason == "cancelled":
        text = f"cancelled by the caller; stopped: {stopped}"
        culprit = StageResult("cancelled", (), None, text, broken_pipe=False)
        raise PipelineCancelled(results, culprit, bytes=total, seconds=seconds)
    text = f"ran longer than its {timeout:g} s timeout; stopped: {stopped}"
    culprit = StageResult("timeout", (), None, text, broken_pipe=False)
    raise PipelineTimedOut(results, culprit, bytes=total, seconds=seconds)


def _watch(
    run: _Pipeline,
    progress: Callable[[int, float], None] | None,
    interval: float,
    cancel: threading.Event | None,
    timeout: float | None,
) -> str:
    """Wait until all stages exit 0 (``"done"``), one fails, cancel or timeout; say which."""
    next_sample = run.started_at + interval
    while True:
        run.peek()
        if run.any_failed():
            return "failed"
        if not run.running():
            return "done"
        now = time.monotonic()
        if cancel is not None and cancel.is_set():
            return "cancelled"
        if timeout is not None and now - run.started_at >= timeout:
            return "timeout"
        if progress is not None and now >= next_sample:
            progress(run.bytes(), now - run.started_at)
            next_sample = max(next_sample + interval, now + interval / 2)
        wake = now + _TICK
        if progress is not None:
            wake = min(wake, next_sample)
        if timeout is not None:
            wake = min(wake, run.started_at + timeout)
        run.sleep(wake - now)
