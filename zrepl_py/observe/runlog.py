"""Record every job action in the catalog's ``runs`` table: started, then ok/failed with bytes.

A row records the process running it (host, pid, pid start time); a row whose process died
without ending it is ended ``interrupted`` by the next zbak on that host
(``sweep_interrupted``, called by every action and by ``zbak status``).

Each recorded run also tells ``zrepl_py.observe.events`` what operators must hear about:
a ``failure`` when it ends ``failed`` or ``partial``, a ``recovery`` when it ends ``ok`` and
the previous run of the same job, action and target had failed, and a ``budget`` event when
the action reported protection-budget warnings (``RunRecord.budget``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from zrepl_py.clock import Clock
from zrepl_py.errors import CatalogError, PipelineCancelled
from zrepl_py.observe.events import Event, emit
from zrepl_py.observe.transfers import process_gone
from zrepl_py.runtime.owner import process_start

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.catalog.rows import RunRow

log = logging.getLogger(__name__)

FAILED_RESULTS = ("failed", "partial", "interrupted")
"""Results that raise a ``failure`` event (and that a later ``ok`` recovers from). A run
``interrupted`` (its process died: SIGKILL, OOM killer, power loss) did not do its work,
so operators hear of it as of any failure; the next ``ok`` run sends the recovery."""


@dataclasses.dataclass
class RunRecord:
    """Filled in by the action while it runs; written when it ends.

    Attributes:
        result: ``ok``, ``failed`` or ``partial`` (``interrupted`` is only written by
            ``sweep_interrupted``).
        bytes: bytes moved.
        error: the error or warning text stored with the run.
        budget: protection-budget warnings (``replication.job.budget_warnings``); when not
            empty the run also emits one ``budget`` event.
    """

    result: str = "ok"
    bytes: int = 0
    error: str | None = None
    budget: list[str] = dataclasses.field(default_factory=list)


def _previous_result(catalog: Catalog, job: str, action: str, target: str | None) -> str | None:
    """The result of the latest run of (job, action, target), or None (none, or unreadable)."""
    try:
        for run in catalog.last_runs(job):
            if run.action == action and run.target == target:
                return run.result
    except CatalogError as exc:
        log.warning("cannot read the previous %s run of job %s: %s", action, job, exc)
    return None


def _what(job: str, action: str, target: str | None) -> str:
    if target is None:
        return f"{action} of job {job}"
    return f"{action} of job {job} " + ("to " if action == "replicate" else "for ") + target


def _process() -> tuple[str, int, int | None]:
    """This process, as a run row records it: ``(host, pid, pid_start)``."""
    pid = os.getpid()
    return socket.gethostname(), pid, process_start(pid)


def _finish(catalog: Catalog, clock: Clock, run_id: int, job: str, action: str,
            target: str | None, record: RunRecord, previous: str | None,
            exc: BaseException | None) -> None:
    """End one row (failed with ``exc``'s text when given, else ``record``) and emit its
    events (see the module doc and ``recorded_run``)."""
    what = _what(job, action, target)
    if exc is not None:
        error = str(exc) or type(exc).__name__
        catalog.finish_run(run_id, result="failed", now=clock.now(), bytes=record.bytes,
                           error=error)
        if isinstance(exc, Exception) and not isinstance(exc, PipelineCancelled):
            # The error goes on up: the command prints it (a daemon run's child too).
            emit(Event("failure", job, action, target, f"{what} failed: {error}", clock.now()),
                 reported=True)
        return
    catalog.finish_run(run_id, result=record.result, now=clock.now(), bytes=record.bytes,
                       error=record.error)
    if record.result in FAILED_RESULTS:
        emit(Event("failure", job, action, target,
                   f"{what} ended {record.result}: {record.error or 'no detail'}", clock.now()))
    elif previous in FAILED_RESULTS:
        emit(Event("recovery", job, action, target,
                   f"{what} succeeded again (the previous run had {previous})", clock.now()))
    if record.budget:
        emit(Event("budget", job, action, target, "; ".join(record.budget), clock.now()))


class RunSet:
    """Rows of one action against several targets, all opened before any work can fail.

    An action whose preparation is shared by its targets (``zbak replicate`` lists the source
    once for every target) opens every target's row first (``open``), so a failure while
    preparing (a dataset that does not exist, an unreachable host) ends every row ``failed``
    and alerts, instead of leaving no trace
    (docs/decisions.md#every-failed-action-is-a-recorded-run). Each target's row is ended as soon
    as its own work ends (``end``); leaving the block ends the rest: ``failed`` with the
    exception that left it, else as their records say.

    Attributes:
        records: target -> its RunRecord, to fill in while the target's work runs.
    """

    def __init__(self, catalog: Catalog, clock: Clock, job: str, action: str,
                 targets: Sequence[str | None]):
        self.catalog, self.clock, self.job, self.action = catalog, clock, job, action
        self.records: dict[str | None, RunRecord] = {}
        self._open: dict[str | None, tuple[int, str | None]] = {}
        sweep_interrupted(catalog, clock)
        host, pid, pid_start = _process()
        try:
            for target in dict.fromkeys(targets):
                previous = _previous_result(catalog, job, action, target)
                run_id = catalog.start_run(job, action, target, clock.now(), host=host, pid=pid,
                                           pid_start=pid_start)
                self._open[target] = (run_id, previous)
                self.records[target] = RunRecord()
        except BaseException as exc:
            self.close(exc)
            raise

    def end(self, target: str | None, exc: BaseException | None = None) -> None:
        """End ``target``'s row now: ``failed`` with ``exc``, else as its record says
        (no-op when it ended already)."""
        opened = self._open.pop(target, None)
        if opened is not None:
            _finish(self.catalog, self.clock, opened[0], self.job, self.action, target,
                    self.records[target], opened[1], exc)

    def close(self, exc: BaseException | None = None) -> None:
        """End every row still open (see ``end``)."""
        for target in list(self._open):
            self.end(target, exc)

    def __enter__(self) -> RunSet:
        return self

    def __exit__(self, _type: type[BaseException] | None, exc: BaseException | None,
                 _tb: TracebackType | None) -> None:
        self.close(exc)


@contextlib.contextmanager
def recorded_run(
    catalog: Catalog, clock: Clock, job: str, action: str, target: str | None = None
) -> Iterator[RunRecord]:
    """Insert a ``running`` row, yield a RunRecord, and close the row when the block ends.

    Runs left ``running`` by dead processes of this host are ended first
    (``sweep_interrupted``). An exception marks the run ``failed`` with the error text
    (zbak's messages carry no secrets) and propagates. Events (see module doc) are emitted
    after the row is closed; emitting never raises. A run cancelled on purpose
    (``PipelineCancelled``: SIGTERM, the daemon stopping) and ``KeyboardInterrupt``/
    ``SystemExit`` are recorded failed but raise no failure alert: nothing is broken, the
    next run resumes.

    Raises:
        CatalogError: the run cannot be recorded (nothing runs then).
    """
    with RunSet(catalog, clock, job, action, [target]) as runs:
        yield runs.records[target]


def sweep_interrupted(catalog: Catalog, clock: Clock) -> list[RunRow]:
    """End ``interrupted`` every run this host started whose process is gone.

    A row is swept when its host is this host and its process (pid and start time,
    ``transfers.process_gone``: a PID reused by another process does not count) no longer
    runs: a dead process holds no lock (flock(2) locks die with their holder), so its run
    cannot be going on. Rows of other hosts and rows without a pid (written before catalog
    revision 0003) are left alone. Each swept run raises a ``failure`` event (see
    ``FAILED_RESULTS``). Called when any action starts and by ``zbak status``; never raises
    for the catalog (a sweep that cannot read or write is logged and retried next time).

    Returns:
        The runs it ended.
    """
    swept = []
    try:
        for run in catalog.running_runs(socket.gethostname()):
            if run.pid is None:
                continue
            gone = process_gone(run.pid, run.pid_start)
            if gone is None:
                continue
            error = (f"interrupted: {gone} ({run.action} started"
                     f" {run.started_at:%Y-%m-%d %H:%M:%S}Z); it was killed or its host went down")
            if catalog.interrupt_run(run.id, now=clock.now(), error=error):
                swept.append(run)
                log.warning("run %d, %s, %s", run.id, _what(run.job, run.action, run.target),
                            error)
                emit(Event("failure", run.job, run.action, run.target,
                           f"{_what(run.job, run.action, run.target)} was {error}", clock.now()),
                     reported=True)
    except CatalogError as exc:
        log.warning("cannot end the runs of dead processes: %s", exc)
    return swept
