"""The catalog's replica cursors: per job, target and source dataset, the last snapshot known
complete on the replica."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from zrepl_py.catalog.base import CatalogBase, require_aware, require_one_of
from zrepl_py.catalog.models import Dataset, ReplicaCursor
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
        with self._session(doing) as session:
            dataset_id = self._dataset_id(session, source_host, source_dataset)
            key = (
                ReplicaCursor.job == job,
                ReplicaCursor.target == target,
                ReplicaCursor.source_dataset_id == dataset_id,
            )
            updated = session.execute(sa.update(ReplicaCursor).where(*key).values(**values))
            if updated.rowcount:
                return
            try:
                with session.begin_nested():
                    cursor = ReplicaCursor(
                        job=job, target=target, source_dataset_id=dataset_id, **values
                    )
                    session.add(cursor)
            except sa.exc.IntegrityError:
                session.execute(sa.update(ReplicaCursor).where(*key).values(**values))

    def cursors(self, job: str | None = None) -> list[CursorRow]:
        """Return every replica cursor (or one job's), ordered by job, target, source dataset."""
        query = (
            sa.select(ReplicaCursor, Dataset.host, Dataset.name)
            .join(Dataset, Dataset.id == ReplicaCursor.source_dataset_id)
            .order_by(ReplicaCursor.job, ReplicaCursor.target, Dataset.host, Dataset.name)
        )
        if job is not None:
            query = query.where(ReplicaCursor.job == job)
        with self._session("listing replica cursors") as session:
            return [
                CursorRow(
                    job=cur.job,
                    target=cur.target,
                    source_host=host,
                    source_dataset=name,
                    target_location=cur.target_location,
                    method=cur.method,
                    snapshot_name=cur.snapshot_name,
                    guid=cur.guid,
                    createtxg=cur.createtxg,
                    updated_at=cur.updated_at,
                )
                for cur, host, name in session.execute(query)
            ]
