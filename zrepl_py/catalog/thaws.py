"""The catalog's thaw requests: which cold streams were asked back from GLACIER/DEEP_ARCHIVE,
at which tier, and when they are expected readable."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import sqlalchemy as sa

from zrepl_py.catalog.base import CatalogBase, chunks, require_aware
from zrepl_py.catalog.models import stream_table, thaw_request_table
from zrepl_py.catalog.rows import ThawRow
from zrepl_py.errors import NotInCatalog


class Thaws(CatalogBase):
    """Thaw request rows (part of ``Catalog``)."""

    def record_thaw(
        self, stream_id: int, *, tier: str, days: int, requested_at: dt.datetime,
        ready_by: dt.datetime,
    ) -> None:
        """Record (or replace) the thaw request of stream ``stream_id``.

        Raises:
            NotInCatalog: no such stream.
            ValueError: naive times, ``days`` < 1.
        """
        require_aware("requested_at", requested_at)
        require_aware("ready_by", ready_by)
        if days < 1:
            raise ValueError(f"thaw days must be >= 1, not {days}")
        with self._transaction(f"recording a thaw of stream {stream_id}") as conn:
            if self._row(conn, stream_table, stream_id) is None:
                raise NotInCatalog(f"stream {stream_id} is not in the catalog")
            conn.execute(sa.delete(thaw_request_table)
                         .where(thaw_request_table.c.stream_id == stream_id))
            conn.execute(sa.insert(thaw_request_table).values(
                stream_id=stream_id, tier=tier, days=days, requested_at=requested_at,
                ready_by=ready_by))

    def thaws(self, stream_ids: Iterable[int]) -> dict[int, ThawRow]:
        """The recorded thaw requests of the given streams, by stream id (absent: none)."""
        ids = sorted(set(stream_ids))
        found: dict[int, ThawRow] = {}
        with self._transaction("listing thaw requests", read_only=True) as conn:
            for chunk in chunks(ids):
                query = (sa.select(thaw_request_table)
                         .where(thaw_request_table.c.stream_id.in_(chunk)))
                for row in conn.execute(query):
                    found[row.stream_id] = ThawRow(row.stream_id, row.tier, row.days,
                                                   row.requested_at, row.ready_by)
        return found
