"""The catalog's failovers: what ``zbak status`` shows of a job's target made live
(``FailoverRow``). The replica's ``zbak:failover`` mark is what replication obeys
(``values.failover``); a row here is recorded by the failover itself, or by the first
replication that meets the mark of a failover run elsewhere."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from zrepl_py.catalog.base import CatalogBase, require_aware
from zrepl_py.catalog.models import failover_table
from zrepl_py.catalog.rows import FailoverRow


def _row(found: sa.Row[tuple[object, ...]]) -> FailoverRow:
    return FailoverRow(found.job, found.target, found.replica, found.failed_over_at,
                       bool(found.planned), found.recorded_at, found.failed_back_at, found.kept)


class Failovers(CatalogBase):
    """Failover rows (part of ``Catalog``)."""

    def record_failover(self, row: FailoverRow) -> None:
        """Record ``row`` unless a row of its job, target and ``failed_over_at`` exists
        (then that one stays: a rerun or a second replication changes nothing).

        Raises:
            ValueError: a naive time.
        """
        require_aware("failed_over_at", row.failed_over_at)
        require_aware("recorded_at", row.recorded_at)
        table = failover_table.c
        with self._transaction(f"recording the failover of {row.job} to {row.target}") as conn:
            found = conn.execute(sa.select(table.id).where(
                table.job == row.job, table.target == row.target,
                table.failed_over_at == row.failed_over_at)).first()
            if found is None:
                conn.execute(sa.insert(failover_table).values(
                    job=row.job, target=row.target, replica=row.replica,
                    failed_over_at=row.failed_over_at, planned=row.planned,
                    recorded_at=row.recorded_at, failed_back_at=row.failed_back_at,
                    kept=row.kept))

    def end_failover(self, row: FailoverRow, failed_back_at: dt.datetime,
                     kept: str | None) -> None:
        """Record that the failover ``row`` names (job, target, ``failed_over_at``) was
        failed back at ``failed_back_at``, keeping the source as ``kept``; the row is made
        when this catalog did not know the failover.

        Raises:
            ValueError: a naive time.
        """
        require_aware("failed_back_at", failed_back_at)
        self.record_failover(row)
        table = failover_table.c
        with self._transaction(f"recording the failback of {row.job} from {row.target}") as conn:
            conn.execute(sa.update(failover_table).where(
                table.job == row.job, table.target == row.target,
                table.failed_over_at == row.failed_over_at).values(
                failed_back_at=failed_back_at, kept=kept))

    def failovers(self, job: str | None = None) -> list[FailoverRow]:
        """Every failover (or one job's), oldest first by ``failed_over_at``."""
        table = failover_table.c
        query = sa.select(failover_table).order_by(table.failed_over_at, table.job, table.target)
        if job is not None:
            query = query.where(table.job == job)
        with self._transaction("listing failovers", read_only=True) as conn:
            return [_row(found) for found in conn.execute(query)]
