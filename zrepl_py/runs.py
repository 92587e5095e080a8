"""Record every job action in the catalog's ``runs`` table: started, then ok/failed with bytes.

Each recorded run also tells ``zrepl_py.events`` what operators must hear about:
a ``failure`` when it ends ``failed`` or ``partial``, a ``recovery`` when it ends ``ok`` and
the previous run of the same job, action and target had failed, and a ``budget`` event when
the action reported protection-budget warnings (``RunRecord.budget``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Iterator

from zrepl_py.clock import Clock
from zrepl_py.errors import CatalogError, PipelineCancelled
from zrepl_py.events import Event, emit

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog

log = logging.getLogger(__name__)

FAILED_RESULTS = ("failed", "partial")
"""Results that raise a ``failure`` event (and that a later ``ok`` recovers from)."""


@dataclasses.dataclass
class RunRecord:
    """Filled in by the action while it runs; written when it ends.

    Attributes:
        result: ``ok``, ``failed`` or ``partial``.
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


@contextlib.contextmanager
def recorded_run(
    catalog: Catalog, clock: Clock, job: str, action: str, target: str | None = None
) -> Iterator[RunRecord]:
    """Insert a ``running`` row, yield a RunRecord, and close the row when the block ends.

    An exception marks the run ``failed`` with the error text (zbak's messages carry no
    secrets) and propagates. Events (see module doc) are emitted after the row is closed;
    emitting never raises. A run cancelled on purpose (``PipelineCancelled``: SIGTERM, the
    daemon stopping) and ``KeyboardInterrupt``/``SystemExit`` are recorded failed but raise no
    failure alert: nothing is broken, the next run resumes.

    Raises:
        CatalogError: the run cannot be recorded (nothing runs then).
    """
    previous = _previous_result(catalog, job, action, target)
    run_id = catalog.start_run(job, action, target, clock.now())
    record = RunRecord()
    try:
        yield record
    except BaseException as exc:
        error = str(exc) or type(exc).__name__
        catalog.finish_run(run_id, result="failed", now=clock.now(), bytes=record.bytes,
                           error=error)
        if isinstance(exc, Exception) and not isinstance(exc, PipelineCancelled):
            emit(Event("failure", job, action, target,
                       f"{_what(job, action, target)} failed: {error}", clock.now()))
        raise
    catalog.finish_run(run_id, result=record.result, now=clock.now(), bytes=record.bytes,
                       error=record.error)
    if record.result in FAILED_RESULTS:
        emit(Event("failure", job, action, target,
                   f"{_what(job, action, target)} ended {record.result}: {record.error or 'no detail'}",
                   clock.now()))
    elif previous in FAILED_RESULTS:
        emit(Event("recovery", job, action, target,
                   f"{_what(job, action, target)} succeeded again (the previous run had {previous})",
                   clock.now()))
    if record.budget:
        emit(Event("budget", job, action, target, "; ".join(record.budget), clock.now()))
