"""The catalog's replica cursors: per job, target and source dataset, the last snapshot known
complete on the replica."""

from __future__ import annotations

import datetime as dt

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
        require_one_of("replication method", method, REPLICATION_METHODS)
        require_aware("now", now)
        to_signed64(guid)
        values = {
            "target_location": target_location,
            "method": method,
            "snapshot_name": snapshot_name,
            "guid": guid,
            "createtxg": createtxg,
            "updated_at": now,
        }
        doing = f"moving the {job} cursor of {source_host}:{source_dataset} on {target}"
        with self._transaction(doing) as conn:
            dataset_id = self._dataset_id(conn, source_host, source_dataset)
            cursor = replica_cursor_table.c
            key = (cursor.job == job, cursor.target == target,
                   cursor.source_dataset_id == dataset_id)
            updated = conn.execute(sa.update(replica_cursor_table).where(*key).values(**values))
            if updated.rowcount:
                return
            try:
                with conn.begin_nested():
                    conn.execute(sa.insert(replica_cursor_table).values(
                        job=job, target=target, source_dataset_id=dataset_id, **values))
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
        with self._transaction("listing replica cursors") as conn:
            return [CursorRow(*row) for row in conn.execute(query)]
