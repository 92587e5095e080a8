"""The catalog's restore drills: one row per drilled source, and the newest per source that
``zbak status``, the metrics and the staleness alert read (``zrepl_py.drill``)."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa

from zrepl_py.catalog.base import (
    AnyRow,
    CatalogBase,
    new_id,
    require_aware,
    require_one_of,
    require_size,
)
from zrepl_py.catalog.models import drill_table
from zrepl_py.catalog.rows import DRILL_KINDS, DRILL_RESULTS, DrillRow


def _drill_row(row: AnyRow) -> DrillRow:
    """Copy a row of the drills table into a DrillRow."""
    return DrillRow(**{field.name: getattr(row, field.name)
                       for field in dataclasses.fields(DrillRow)})


class Drills(CatalogBase):
    """Drill rows (part of ``Catalog``)."""

    def record_drill(self, drill: DrillRow) -> int:
        """Record ``drill`` (its ``id`` is ignored) and return the new row's id.

        Raises:
            ValueError: an unknown kind or result, naive times, negative bytes or datasets.
        """
        require_one_of("drill kind", drill.kind, DRILL_KINDS)
        require_one_of("drill result", drill.result, DRILL_RESULTS)
        require_aware("started_at", drill.started_at)
        require_aware("ended_at", drill.ended_at)
        require_size("drill bytes", drill.bytes)
        require_size("drill datasets", drill.datasets)
        values = {f.name: getattr(drill, f.name) for f in dataclasses.fields(drill) if f.name != "id"}
        with self._transaction(f"recording the drill of job {drill.job} from {drill.source}") as conn:
            return new_id(conn.execute(sa.insert(drill_table).values(**values)))

    def _newest(self, job: str | None, result: str | None, doing: str) -> list[DrillRow]:
        """The newest drill (by start, then id) of each (job, source), of ``job`` only and
        with ``result`` only when given."""
        newest = sa.func.row_number().over(
            partition_by=(drill_table.c.job, drill_table.c.source),
            order_by=(drill_table.c.started_at.desc(), drill_table.c.id.desc()),
        )
        ranking = sa.select(drill_table.c.id, newest.label("rank"))
        if job is not None:
            ranking = ranking.where(drill_table.c.job == job)
        if result is not None:
            ranking = ranking.where(drill_table.c.result == result)
        ranked = ranking.subquery()
        query = (sa.select(drill_table).join(ranked, ranked.c.id == drill_table.c.id)
                 .where(ranked.c.rank == 1))
        with self._transaction(doing, read_only=True) as conn:
            rows = [_drill_row(row) for row in conn.execute(query)]
        return sorted(rows, key=lambda r: (r.job, r.source))

    def last_drills(self, job: str | None = None) -> list[DrillRow]:
        """The newest drill of every (job, source), or of one job's sources; ordered by job
        and source."""
        return self._newest(job, None, "listing the last drills")

    def last_drill_successes(self, job: str | None = None) -> list[DrillRow]:
        """The newest drill that ended ``ok`` of every (job, source), or of one job's
        sources; ordered by job and source."""
        return self._newest(job, "ok", "listing the last successful drills")
