"""The daemon's APScheduler job store: a table of its own in the catalog database.

APScheduler's ``SQLAlchemyJobStore`` creates and owns the table (``zbak_schedule``, or
``zbak_schedule_<name>`` with ``[daemon] name``), outside the catalog's Alembic models:
``migrations/env.py`` leaves tables of that prefix out of autogenerate. One table per daemon,
because APScheduler runs every due job it finds in its table: two daemons sharing a
PostgreSQL catalog must not share a table. Rows are ``id`` (``JOB:ACTION``),
``next_run_time`` (epoch seconds, float, NULL when paused) and ``job_state`` (a pickle that
only the daemon reads).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING

from zrepl_py.config.daemon import DaemonConfig
from zrepl_py.daemon.plan import split_id

if TYPE_CHECKING:
    from apscheduler.jobstores.base import BaseJobStore
    from sqlalchemy.engine import Engine

TABLE_PREFIX = "zbak_schedule"
UTC = dt.UTC


def table_name(config: DaemonConfig) -> str:
    """``zbak_schedule`` or ``zbak_schedule_<name>``."""
    return TABLE_PREFIX if config.name is None else f"{TABLE_PREFIX}_{config.name}"


def include_object(obj: object, name: str | None, type_: str, reflected: bool,
                   compare_to: object) -> bool:
    """Alembic ``include_object`` hook (``migrations/env.py``): False for the daemon's schedule
    tables and their indexes, which APScheduler owns, so autogenerate neither drops them
    nor compares them with the catalog's models."""
    table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", "")
    return not (table or "").startswith(TABLE_PREFIX)


def job_store(engine: Engine, config: DaemonConfig) -> BaseJobStore:
    """An APScheduler ``SQLAlchemyJobStore`` on ``engine`` (the catalog's) and our table."""
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore

    return SQLAlchemyJobStore(engine=engine, tablename=table_name(config))


@dataclasses.dataclass(frozen=True)
class ScheduledRun:
    """When the daemon next runs one action of one job.

    Attributes:
        job, action: what runs.
        next_run: aware UTC; in the past when a run is due (the daemon is down or busy);
            None when paused.
    """

    job: str
    action: str
    next_run: dt.datetime | None


def scheduled_runs(engine: Engine, config: DaemonConfig) -> list[ScheduledRun]:
    """The stored schedule, ordered by job and action, without unpickling anything (for
    ``zbak status``). An empty list when the daemon never ran on this catalog.

    Raises:
        CatalogError: the database cannot be read.
    """
    import sqlalchemy as sa

    from zrepl_py.catalog.db import translate

    table = table_name(config)
    with translate("reading the daemon's schedule"):
        if not sa.inspect(engine).has_table(table):
            return []
        rows = sa.Table(table, sa.MetaData(), sa.Column("id", sa.Unicode(191)),
                        sa.Column("next_run_time", sa.Float))
        with engine.connect() as connection:
            found = connection.execute(sa.select(rows.c.id, rows.c.next_run_time)).all()
    runs = []
    for job_id, stamp in found:
        job, action = split_id(job_id)
        when = dt.datetime.fromtimestamp(stamp, UTC) if stamp is not None else None
        runs.append(ScheduledRun(job, action, when))
    return sorted(runs, key=lambda r: (r.job, r.action))
