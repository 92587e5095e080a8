"""The catalog's replica cursors: per job, target and source dataset, the last snapshot known
complete on the replica."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import sqlalchemy as sa

from zrepl_py.catalog.base import CatalogBase, require_aware, require_one_of
from zrepl_py.catalog.models import dataset_table, replica_cursor_table
from zrepl_py.catalog.rows import REPLICATION_METHODS, CursorRow
from zrepl_py.catalog.types import to_signed64


class Cursors(CatalogBase):
    """Replica cursor rows (part of ``Catalog``)."""

    def set_cursor(
        self,
        job: str,
        target: str,
        source_host: str,
        source_dataset: str,
        target_location: str,
        method: str,
        snapshot_name: str,
        guid: int,
        createtxg: int,
        now: dt.datetime,
    ) -> None:
        """Record that ``source_host:source_dataset`` is on ``target`` up to ``snapshot_name``.

        ``target`` is the config's target string; ``target_location`` the dataset or directory
        there; ``method`` "zfs" or "rsync"; ``guid``/``createtxg`` those of the source snapshot.
        Creates or replaces the cursor of (job, target, source dataset); may move backwards
        (after an opt-in rollback of the target).

        Raises:
            ValueError: unknown ``method``, naive ``now``, guid out of range.
        """
        self.set_cursors([CursorRow(job, target, source_host, source_dataset, target_location,
                                    method, snapshot_name, guid, createtxg, now)])

    def set_cursors(self, rows: Sequence[CursorRow]) -> None:
        """``set_cursor`` for each row (``updated_at`` is the time recorded) in ONE
        transaction: all are recorded or none (a replication run records a batch of
        datasets at once). Empty ``rows``: nothing is done.

        Raises:
            ValueError: as ``set_cursor``, for any row (then none is recorded).
        """
        for row in rows:
            require_one_of("replication method", row.method, REPLICATION_METHODS)
            require_aware("now", row.updated_at)
            to_signed64(row.guid)
        if not rows:
            return
        first = rows[0]
        doing = (f"moving the {first.job} cursor of {first.source_host}:{first.source_dataset} "
                 f"on {first.target}") if len(rows) == 1 else (
            f"moving {len(rows)} replica cursors of job {first.job}")
        with self._transaction(doing) as conn:
            for row in rows:
                self._upsert(conn, row)

    def _upsert(self, conn: sa.Connection, row: CursorRow) -> None:
        """Create or replace ``row``'s cursor inside ``conn``'s transaction; safe against a
        concurrent insert of the same key."""
        values = {
            "target_location": row.target_location,
            "method": row.method,
            "snapshot_name": row.snapshot_name,
            "guid": row.guid,
            "createtxg": row.createtxg,
            "updated_at": row.updated_at,
        }
        dataset_id = self._dataset_id(conn, row.source_host, row.source_dataset)
        cursor = replica_cursor_table.c
        key = (cursor.job == row.job, cursor.target == row.target,
               cursor.source_dataset_id == dataset_id)
        updated = conn.execute(sa.update(replica_cursor_table).where(*key).values(**values))
        if updated.rowcount:
            return
        try:
            with conn.begin_nested():
                conn.execute(sa.insert(replica_cursor_table).values(
                    job=row.job, target=row.target, source_dataset_id=dataset_id, **values))
        except sa.exc.IntegrityError:
            conn.execute(sa.update(replica_cursor_table).where(*key).values(**values))

    def cursors(self, job: str | None = None) -> list[CursorRow]:
        """Return every replica cursor (or one job's), ordered by job, target, source dataset."""
        cursor, dataset = replica_cursor_table.c, dataset_table.c
        query = (
            sa.select(cursor.job, cursor.target, dataset.host, dataset.name,
                      cursor.target_location, cursor.method, cursor.snapshot_name, cursor.guid,
                      cursor.createtxg, cursor.updated_at)  # CursorRow's fields, in order
            .select_from(replica_cursor_table.join(dataset_table,
                                                   dataset.id == cursor.source_dataset_id))
            .order_by(cursor.job, cursor.target, dataset.host, dataset.name)
        )
        if job is not None:
            query = query.where(cursor.job == job)
        with self._transaction("listing replica cursors", read_only=True) as conn:
            return [CursorRow(*tuple(row)) for row in conn.execute(query)]
