"""What the store's listing said of each stream's manifest when an audit last read it.

``zbak audit`` compares every stream's ``manifest.json`` with the catalog. A stamp records
the listing's identity of the manifest (``stores.base.ObjectInfo.identity``: its size and
the store's etag) from a read that agreed with the stream's row, and when that read was; a
later audit re-reads the manifest only when the listing shows another identity or the
stamp is old (``audit.objects``). The compared catalog fields are written once with the
stream (``Streams.add_stream``; later changes touch only its state and ``verified_at``), so
a stamp stays true of the row until the object changes. Stamps live on the stream's row
(``streams.manifest_seen``/``manifest_read_at``) and go with it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence

import sqlalchemy as sa

from zrepl_py.catalog.base import CatalogBase, chunks, raw_rows, require_aware, stream_scope, utc_of
from zrepl_py.catalog.models import stream_table

BATCH = 5_000
"""Stamps written per transaction: the audit runs beside archives, whose catalog writes
wait for each batch (SQLite has one writer at a time)."""


class ManifestStamps(CatalogBase):
    """Manifest stamps (part of ``Catalog``)."""

    def manifest_stamps(
        self, *, host: str | None = None, below: str | None = None, store: str | None = None,
        datasets: Sequence[int] | None = None,
    ) -> dict[int, tuple[str, dt.datetime]]:
        """``{stream id: (identity, read at)}`` for the streams in a scope (see
        ``Catalog.bulk_streams``) that carry a stamp; times aware UTC."""
        stream = stream_table.c
        query = (sa.select(stream.id, stream.manifest_seen, stream.manifest_read_at)
                 .where(stream.manifest_seen.is_not(None),
                        *stream_scope(host, below, store, datasets)))
        with self._transaction("reading the manifest stamps", read_only=True) as conn:
            rows = raw_rows(conn, query)
        times: dict[object, dt.datetime] = {}  # an audit stamps thousands at one time
        found: dict[int, tuple[str, dt.datetime]] = {}
        for sid, seen, when in rows:
            if when not in times:
                times[when] = utc_of(when)
            found[sid] = (seen, times[when])
        return found

    def stamp_manifests(self, seen: Mapping[int, str], now: dt.datetime) -> None:
        """Record that the manifest of each stream in ``seen`` (``{stream id: identity}``)
        was read at ``now`` (aware UTC) and agreed with its row. Streams deleted meanwhile
        are skipped.

        Raises:
            ValueError: a naive ``now``.
        """
        require_aware("now", now)
        table = stream_table
        # An executemany UPDATE keyed by a bound id.
        update = (sa.update(table).where(table.c.id == sa.bindparam("sid"))
                  .values(manifest_seen=sa.bindparam("seen"), manifest_read_at=now))
        items = sorted(seen.items())
        for start in range(0, len(items), BATCH):
            batch = [{"sid": sid, "seen": value} for sid, value in items[start:start + BATCH]]
            with self._transaction(f"stamping {len(batch)} manifest(s)") as conn:
                conn.execute(update, batch)

    def forget_manifest_stamps(self, stream_ids: Iterable[int]) -> None:
        """Drop the stamps of ``stream_ids`` (their manifest was read and found wrong, or
        could not be read): the next audit reads them again."""
        ids = sorted(set(stream_ids))
        with self._transaction(f"forgetting {len(ids)} manifest stamp(s)") as conn:
            for chunk in chunks(ids):
                conn.execute(sa.update(stream_table).where(stream_table.c.id.in_(chunk))
                             .values(manifest_seen=None, manifest_read_at=None))
