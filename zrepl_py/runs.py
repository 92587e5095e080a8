"""Record every job action in the catalog's ``runs`` table: started, then ok/failed with bytes."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from zrepl_py.catalog.repository import Catalog
from zrepl_py.clock import Clock


@dataclasses.dataclass
class RunRecord:
    """Filled in by the action while it runs; written when it ends."""

    result: str = "ok"
    bytes: int = 0
    error: str | None = None


@contextlib.contextmanager
def recorded_run(
    catalog: Catalog, clock: Clock, job: str, action: str, target: str | None = None
) -> Iterator[RunRecord]:
    """Insert a ``running`` row, yield a RunRecord, and close the row when the block ends.

    An exception marks the run ``failed`` with the error text (zbak's messages carry no
    secrets) and propagates.
    """
    run_id = catalog.start_run(job, action, target, clock.now())
    record = RunRecord()
    try:
        yield record
    except BaseException as exc:
        catalog.finish_run(run_id, result="failed", now=clock.now(), bytes=record.bytes,
                           error=str(exc) or type(exc).__name__)
        raise
    catalog.finish_run(run_id, result=record.result, now=clock.now(), bytes=record.bytes,
                       error=record.error)
