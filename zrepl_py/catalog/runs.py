"""The catalog's runs: one row per job action, started, finished or interrupted, and the
last successes ``zbak status`` and the alerts read."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from zrepl_py.catalog.base import (
    AnyRow,
    CatalogBase,
    new_id,
    require_aware,
    require_one_of,
    require_size,
)
from zrepl_py.catalog.models import run_table
from zrepl_py.catalog.rows import RUN_ACTIONS, RUN_RESULTS, RunRow
from zrepl_py.clock import ensure_utc
from zrepl_py.errors import CatalogConflict, NotInCatalog


def _run_row(run: AnyRow) -> RunRow:
    """Copy a row of the runs table into a RunRow."""
    return RunRow(
        id=run.id,
        job=run.job,
        action=run.action,
        target=run.target,
        started_at=run.started_at,
        ended_at=run.ended_at,
        result=run.result,
        bytes=run.bytes,
        error=run.error,
        host=run.host,
        pid=run.pid,
        pid_start=run.pid_start,
    )


class Runs(CatalogBase):
    """Run rows (part of ``Catalog``)."""

    def start_run(self, job: str, action: str, target: str | None, now: dt.datetime, *,
                  host: str | None = None, pid: int | None = None,
                  pid_start: int | None = None) -> int:
        """Record that ``action`` of ``job`` (against ``target``, or None) started at ``now``,
        run by process ``pid`` (started at ``pid_start``, ``transfers.process_start``) on ``host``.

        Returns the run id for :meth:`finish_run`.

        Raises:
            ValueError: ``action`` is not one of ``RUN_ACTIONS`` or ``now`` is naive.
        """
        require_one_of("run action", action, RUN_ACTIONS)
        require_aware("now", now)
        with self._transaction(f"recording the start of {job} {action}") as conn:
            inserted = conn.execute(sa.insert(run_table).values(
                job=job, action=action, target=target, started_at=now, result="running", bytes=0,
                host=host, pid=pid, pid_start=pid_start,
            ))
            return new_id(inserted)

    def finish_run(
        self,
        run_id: int,
        *,
        result: str,
        now: dt.datetime,
        bytes: int = 0,  # the column's name in the design
        error: str | None = None,
    ) -> None:
        """Record the end of run ``run_id``: ``result`` ok/failed/partial/interrupted,
        ``bytes`` moved.

        Raises:
            ValueError: ``result`` is not one of those, ``now`` naive, ``bytes`` negative.
            NotInCatalog: no run ``run_id``.
            CatalogConflict: the run was finished already.
        """
        require_one_of("run result", result, [r for r in RUN_RESULTS if r != "running"])
        require_aware("now", now)
        require_size("run bytes", bytes)
        with self._transaction(f"recording the end of run {run_id}") as conn:
            run = self._row(conn, run_table, run_id)
            if run is None:
                raise NotInCatalog(f"run {run_id} is not in the catalog; it cannot be finished")
            if run.result != "running":
                raise CatalogConflict(
                    f"run {run_id} ({run.job} {run.action}) already ended with {run.result}"
                )
            conn.execute(sa.update(run_table).where(run_table.c.id == run_id)
                         .values(result=result, ended_at=now, bytes=bytes, error=error))

    def last_runs(self, job: str | None = None) -> list[RunRow]:
        """Return the latest run (by start time) of every (job, action, target), or of one job.

        Ordered by job, action, target (no target first).
        """
        latest = sa.func.row_number().over(
            partition_by=(run_table.c.job, run_table.c.action, run_table.c.target),
            order_by=(run_table.c.started_at.desc(), run_table.c.id.desc()),
        )
        ranking = sa.select(run_table.c.id, latest.label("rank"))
        if job is not None:
            ranking = ranking.where(run_table.c.job == job)
        ranked = ranking.subquery()
        query = (sa.select(run_table).join(ranked, ranked.c.id == run_table.c.id)
                 .where(ranked.c.rank == 1))
        with self._transaction("listing the last runs", read_only=True) as conn:
            rows = [_run_row(run) for run in conn.execute(query)]
        return sorted(rows, key=lambda r: (r.job, r.action, r.target is not None, r.target or ""))

    def running_runs(self, host: str) -> list[RunRow]:
        """The runs still ``running`` that a process on ``host`` started (oldest first)."""
        query = (sa.select(run_table)
                 .where(run_table.c.result == "running", run_table.c.host == host)
                 .order_by(run_table.c.started_at, run_table.c.id))
        with self._transaction("listing the running runs", read_only=True) as conn:
            return [_run_row(run) for run in conn.execute(query)]

    def interrupt_run(self, run_id: int, *, now: dt.datetime, error: str) -> bool:
        """End run ``run_id`` ``interrupted`` with ``error`` if it is still ``running``.

        Returns False when another process ended it first (one UPDATE, so two processes
        sweeping at once end it once).
        """
        require_aware("now", now)
        query = (sa.update(run_table)
                 .where(run_table.c.id == run_id, run_table.c.result == "running")
                 .values(result="interrupted", ended_at=now, error=error))
        with self._transaction(f"marking run {run_id} interrupted") as conn:
            return conn.execute(query).rowcount == 1

    def newest_run_time(self) -> dt.datetime | None:
        """The latest start or end time of any run (aware UTC), None before the first run:
        the floor of the Context's ``MonotonicClock``
        (docs/reliability.md#r32-clock-goes-backwards)."""
        query = sa.select(sa.func.max(run_table.c.started_at), sa.func.max(run_table.c.ended_at))
        with self._transaction("reading the newest run time", read_only=True) as conn:
            times = [t for t in conn.execute(query).one() if t is not None]
        return max(ensure_utc(t) for t in times) if times else None

    def last_success(self, job: str, action: str, target: str | None = None) -> RunRow | None:
        """Return the latest run of ``job``'s ``action`` that ended ok, or None.

        ``target=None`` means runs recorded without a target (snapshot, prune of the source).
        """
        column = run_table.c
        query = sa.select(run_table).where(column.job == job, column.action == action,
                                           column.result == "ok")
        query = query.where(column.target.is_(None) if target is None else column.target == target)
        query = query.order_by(column.started_at.desc(), column.id.desc()).limit(1)
        with self._transaction(f"reading the last success of {job} {action}") as conn:
            run = conn.execute(query).first()
            return None if run is None else _run_row(run)

    def last_successes(
        self, action: str, job: str | None = None
    ) -> dict[tuple[str, str | None], RunRow]:
        """The latest ok run of ``action`` per (job, target), in one query.

        Returns:
            ``{(job, target): RunRow}`` (target None for runs recorded without one).
        """
        require_one_of("run action", action, RUN_ACTIONS)
        latest = sa.func.row_number().over(
            partition_by=(run_table.c.job, run_table.c.target),
            order_by=(run_table.c.started_at.desc(), run_table.c.id.desc()),
        )
        ranking = sa.select(run_table.c.id, latest.label("rank")).where(
            run_table.c.action == action, run_table.c.result == "ok")
        if job is not None:
            ranking = ranking.where(run_table.c.job == job)
        ranked = ranking.subquery()
        query = (sa.select(run_table).join(ranked, ranked.c.id == run_table.c.id)
                 .where(ranked.c.rank == 1))
        with self._transaction(f"reading the last successful {action} runs") as conn:
            return {(run.job, run.target): _run_row(run) for run in conn.execute(query)}
