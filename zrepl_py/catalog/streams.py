"""The catalog's archived streams and their volumes: recorded with the chain checked (the
parent link and guid continuity), moved through their states, condemned and deleted."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from zrepl_py.catalog.base import (
    WRAP64,
    CatalogBase,
    Condition,
    chunks,
    new_id,
    raw_batches,
    require_aware,
    require_one_of,
    require_size,
    utc_of,
)
from zrepl_py.catalog.models import (
    dataset_table,
    stream_snapshot_table,
    stream_table,
    thaw_request_table,
    volume_table,
)
from zrepl_py.catalog.rows import (
    STATE_TRANSITIONS,
    STREAM_KINDS,
    STREAM_STATES,
    ManifestLock,
    NewStream,
    NewVolume,
    StreamRow,
    VolumeRow,
)
from zrepl_py.catalog.types import to_signed64
from zrepl_py.errors import CatalogConflict, ChainBroken, NotInCatalog
from zrepl_py.objects.manifest import CarriedSnapshot

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _check_volumes(volumes: Sequence[NewVolume]) -> None:
    """Volumes must be numbered ``0, 1, ...`` with sizes and a lowercase hex sha256."""
    for offset, volume in enumerate(volumes):
        if volume.index != offset:
            raise ValueError(
                f"volume indexes must run 0, 1, ... without gaps;"
                f" got {volume.index} at position {offset}"
            )
        require_size("volume raw_bytes", volume.raw_bytes)
        require_size("volume stored_bytes", volume.stored_bytes)
        if not _SHA256_HEX.fullmatch(volume.sha256):
            raise ValueError(
                f"volume {volume.index} sha256 {volume.sha256!r} is not 64 lowercase hex digits"
            )


def _children(conn: sa.Connection, parent_ids: Sequence[int], *, living: bool = False) -> list[int]:
    """Ids of streams whose parent is in ``parent_ids`` (only not-condemned ones if ``living``)."""
    found: list[int] = []
    for chunk in chunks(list(parent_ids)):
        query = sa.select(stream_table.c.id).where(stream_table.c.parent_id.in_(chunk))
        if living:
            query = query.where(stream_table.c.state != "condemned")
        found.extend(conn.scalars(query))
    return sorted(found)


def _refuse_living_children(conn: sa.Connection, ids: Sequence[int]) -> None:
    """Raise ChainBroken if a not-condemned stream outside ``ids`` applies on one of ``ids``."""
    outside = sorted(set(_children(conn, ids, living=True)) - set(ids))
    if outside:
        raise ChainBroken(
            f"streams {outside} still apply on streams being condemned; condemn the whole"
            " chain together (condemn_streams)"
        )


def _stream_columns() -> tuple[Any, ...]:
    """A :class:`StreamRow`'s stream columns in order, with ``dataset_id`` in place of host
    and dataset and the guids read signed (raw driver values, see :func:`read_streams`)."""
    stream, signed = stream_table.c, sa.BigInteger()
    return (stream.id, stream.dataset_id, stream.store, stream.kind, stream.parent_id,
            sa.type_coerce(stream.from_guid, signed), sa.type_coerce(stream.to_guid, signed),
            stream.from_name, stream.to_name, stream.to_createtxg, stream.raw_bytes,
            stream.stored_bytes, stream.object_prefix, stream.storage_class, stream.compression,
            stream.state, stream.created_at, stream.uploaded_at, stream.verified_at,
            stream.bad_reason, stream.sealed_to)


def _keys_text(keys: tuple[str, ...] | None) -> str | None:
    """``NewStream.sealed_to`` as the column holds it: one key per line."""
    return "\n".join(keys) if keys is not None else None


def _chain_order(row: StreamRow) -> tuple[str, str, str, int, int]:
    return (row.host, row.dataset, row.store, row.to_createtxg, row.id)


def read_streams(conn: sa.Connection, datasets: Sequence[Condition] = (),
                 streams: Sequence[Condition] = ()
                 ) -> list[StreamRow]:
    """Every stream of the datasets matching ``datasets`` (conditions on ``dataset_table``;
    none: all) that matches ``streams`` (conditions on ``stream_table``), in chain order
    (host, dataset, store, to_createtxg, id).

    Raw driver rows (in batches), converted here and sorted in Python, with the datasets'
    names mapped by id instead of joined: 100,000 streams in 0.8 s of CPU on the test
    machine against 5 s through ORM objects (benchmarks/catalog.py).
    """
    ds = dataset_table.c
    named = sa.select(ds.id, ds.host, ds.name).where(*datasets)
    if streams:  # only the datasets those streams belong to (one for a stream id)
        named = named.where(ds.id.in_(sa.select(stream_table.c.dataset_id).where(*streams)))
    names = {i: (h, n) for i, h, n in conn.execute(named)}
    if not names:
        return []
    query = sa.select(*_stream_columns()).where(*streams)
    if datasets:
        query = query.where(stream_table.c.dataset_id.in_(sa.select(ds.id).where(*datasets)))
    found = []
    # The driver makes a new string per value: a few distinct values (store, kind, class,
    # compression, state) repeated on every row are interned instead (27 MiB at 100,000).
    same = sys.intern
    keys_of = functools.cache(lambda text: tuple(text.splitlines()))  # one tuple per key set
    for batch in raw_batches(conn, query):
        for (sid, dataset_id, store, kind, parent, from_guid, to_guid, from_name, to_name, txg,
             raw, stored, prefix, storage_class, compression, state, created, uploaded,
             verified, bad_reason, sealed_to) in batch:
            host, name = names[dataset_id]
            if from_guid is not None and from_guid < 0:
                from_guid += WRAP64
            found.append(StreamRow(
                sid, host, name, same(store), same(kind), parent, from_guid,
                to_guid + WRAP64 if to_guid < 0 else to_guid, from_name, to_name, txg, raw,
                stored, prefix, same(storage_class),
                same(compression), same(state), utc_of(created),
                utc_of(uploaded), utc_of(verified), bad_reason,
                None if sealed_to is None else keys_of(sealed_to)))
    found.sort(key=_chain_order)
    return found


class Streams(CatalogBase):
    """Stream and volume rows, one stream at a time (part of ``Catalog``)."""

    def add_stream(
        self,
        stream: NewStream,
        volumes: Sequence[NewVolume] = (),
        carried: Sequence[CarriedSnapshot] = (),
    ) -> int:
        """Record ``stream``, its ``volumes`` (indexes 0, 1, ...) and the snapshots it
        ``carried`` (which must include its to-snapshot when given); return the stream id.

        An incremental must name an existing ``parent_id`` of the same dataset and store, in
        state uploading/uploaded/verified, whose ``to_guid`` equals ``from_guid`` and whose
        ``to_createtxg`` is older; a full must name no parent.

        Raises:
            ChainBroken: the stream would not continue its chain (checked here first, and by
                the database's constraints as a backstop).
            CatalogConflict: ``object_prefix`` is already used in ``store``.
            ValueError: unknown kind or state, naive time, negative size, bad volume list.
        """
        self._check_new_stream(stream)
        _check_volumes(volumes)
        label = f"{stream.kind} stream {stream.host}:{stream.dataset}@{stream.to_name}"
        doing = f"adding {label} to store {stream.store}"
        with self._transaction(doing, on_integrity=ChainBroken) as conn:
            dataset_id = self._dataset_id(conn, stream.host, stream.dataset)
            if stream.kind == "incremental":
                self._check_parent(conn, stream, dataset_id, label)
            fields = {f.name: getattr(stream, f.name) for f in dataclasses.fields(stream)}
            del fields["host"], fields["dataset"]
            fields["sealed_to"] = _keys_text(stream.sealed_to)
            stream_id = new_id(conn.execute(sa.insert(stream_table).values(
                dataset_id=dataset_id, **fields)))
            if volumes:
                conn.execute(sa.insert(volume_table), [
                    {"stream_id": stream_id, **dataclasses.asdict(volume)} for volume in volumes])
            if carried and stream.to_guid not in {c.guid for c in carried}:
                raise ValueError(f"{label}: the carried snapshots must include @{stream.to_name}")
            if carried:
                conn.execute(sa.insert(stream_snapshot_table), [
                    {"stream_id": stream_id, "name": c.name, "guid": c.guid,
                     "createtxg": c.createtxg} for c in carried])
            return stream_id

    def carried(self, stream_ids: Iterable[int]) -> dict[int, list[CarriedSnapshot]]:
        """Map each stream id to the snapshots it carries, in createtxg order (streams
        recorded without them map to an empty list)."""
        ids = sorted(set(stream_ids))
        found: dict[int, list[CarriedSnapshot]] = {i: [] for i in ids}
        with self._transaction("listing the snapshots streams carry", read_only=True) as conn:
            carried_ = stream_snapshot_table.c
            for chunk in chunks(ids):
                query = (
                    sa.select(carried_.stream_id, carried_.name, carried_.guid, carried_.createtxg)
                    .where(carried_.stream_id.in_(chunk))
                    .order_by(carried_.stream_id, carried_.createtxg)
                )
                for stream_id, name, guid, createtxg in conn.execute(query):
                    found[stream_id].append(CarriedSnapshot(name, guid, createtxg))
        return found

    @staticmethod
    def _check_new_stream(stream: NewStream) -> None:
        """Argument checks that need no database: kind/parent agreement, values, times."""
        require_one_of("stream kind", stream.kind, STREAM_KINDS)
        require_one_of("stream state", stream.state, STREAM_STATES)
        require_aware("created_at", stream.created_at)
        for what in ("uploaded_at", "verified_at"):
            if getattr(stream, what) is not None:
                require_aware(what, getattr(stream, what))
        require_size("raw_bytes", stream.raw_bytes)
        require_size("stored_bytes", stream.stored_bytes)
        to_signed64(stream.to_guid)
        where = f"{stream.host}:{stream.dataset}@{stream.to_name} in store {stream.store}"
        if stream.kind == "full":
            if stream.parent_id is not None or stream.from_guid is not None or stream.from_name:
                raise ChainBroken(
                    f"full stream {where} names a parent or from-snapshot; a full starts a"
                    " chain: record it with kind='incremental' or drop parent_id/from_guid"
                )
            return
        if stream.parent_id is None or stream.from_guid is None:
            raise ChainBroken(
                f"incremental stream {where} needs parent_id and from_guid (the stream it"
                " applies on); without them archive a full stream instead"
            )
        to_signed64(stream.from_guid)
        if stream.from_guid == stream.to_guid:
            raise ChainBroken(
                f"incremental stream {where} starts and ends at guid {stream.to_guid}"
            )

    def _check_parent(self, conn: sa.Connection, stream: NewStream, dataset_id: int,
                      label: str) -> None:
        """The parent exists, is alive, and ends where ``stream`` starts (same dataset/store)."""
        parent = (self._row(conn, stream_table, stream.parent_id)
                  if stream.parent_id is not None else None)
        fix = "archive a full stream to start a new chain"
        if parent is None:
            raise ChainBroken(f"{label}: parent stream {stream.parent_id} does not exist; {fix}")
        if parent.dataset_id != dataset_id or parent.store != stream.store:
            raise ChainBroken(
                f"{label}: parent stream {parent.id} belongs to another dataset or store"
                f" (store {parent.store}); an incremental continues its own chain; {fix}"
            )
        if parent.to_guid != stream.from_guid:
            raise ChainBroken(
                f"{label} starts at guid {stream.from_guid} ({stream.from_name}) but parent"
                f" stream {parent.id} ends at @{parent.to_name} guid {parent.to_guid}; {fix}"
            )
        if parent.state in ("condemned", "bad"):
            raise ChainBroken(f"{label}: parent stream {parent.id} is {parent.state}; {fix}")
        if stream.to_createtxg <= parent.to_createtxg:
            raise ChainBroken(
                f"{label} ends at createtxg {stream.to_createtxg}, not after its parent's"
                f" {parent.to_createtxg}; {fix}"
            )

    def stream(self, stream_id: int) -> StreamRow:
        """Return stream ``stream_id``.

        Raises:
            NotInCatalog: no such stream.
        """
        with self._transaction(f"reading stream {stream_id}", read_only=True) as conn:
            rows = read_streams(conn, streams=[stream_table.c.id == stream_id])
        if not rows:
            raise NotInCatalog(f"stream {stream_id} is not in the catalog")
        return rows[0]

    def streams(
        self, *, host: str | None = None, dataset: str | None = None, store: str | None = None
    ) -> list[StreamRow]:
        """List streams ordered by host, dataset, store, to_createtxg, id (chain order)."""
        datasets = []
        if host is not None:
            datasets.append(dataset_table.c.host == host)
        if dataset is not None:
            datasets.append(dataset_table.c.name == dataset)
        with self._transaction("listing streams", read_only=True) as conn:
            return read_streams(conn, datasets,
                                [stream_table.c.store == store] if store is not None else [])

    def volumes(self, stream_id: int) -> list[VolumeRow]:
        """Return the volumes of stream ``stream_id`` by index (empty for an unknown stream)."""
        volume = volume_table.c
        query = (sa.select(volume.id, volume.stream_id, volume.index, volume.key, volume.raw_bytes,
                           volume.stored_bytes, volume.sha256,
                           volume.version_id, volume.retain_until)  # VolumeRow's fields, in order
                 .where(volume.stream_id == stream_id).order_by(volume.index))
        with self._transaction(f"listing the volumes of stream {stream_id}") as conn:
            return [VolumeRow(*row) for row in conn.execute(query)]

    def set_retain_until(self, volumes: Mapping[int, dt.datetime]) -> None:
        """Record each volume's new Object Lock retain-until date (volume id -> aware UTC),
        after the store extended the lock (``archive.rolling_lock``).

        Raises:
            CatalogError: the write failed.
        """
        if not volumes:
            return
        volume = volume_table.c
        query = (sa.update(volume_table).where(volume.id == sa.bindparam("vid"))
                 .values(retain_until=sa.bindparam("until")))
        with self._transaction(f"recording the locks of {len(volumes)} volume(s)") as conn:
            conn.execute(query, [{"vid": vid, "until": until} for vid, until in volumes.items()])

    def manifest_locks(self, stream_ids: Iterable[int]) -> list[ManifestLock]:
        """The recorded manifest versions and locks of those of ``stream_ids`` that have
        them (``NewStream.manifest_version_id``), by stream id.

        Raises:
            CatalogError: the read failed.
        """
        s = stream_table.c
        ids = sorted(set(stream_ids))
        found = []
        with self._transaction("listing the locks of manifests", read_only=True) as conn:
            for chunk in chunks(ids):
                found += [ManifestLock(*row) for row in conn.execute(
                    sa.select(s.id, s.manifest_version_id, s.manifest_copy_version_id,
                              s.manifest_retain_until)
                    .where(s.id.in_(chunk), s.manifest_version_id.is_not(None),
                           s.manifest_copy_version_id.is_not(None),
                           s.manifest_retain_until.is_not(None)).order_by(s.id))]
        return found

    def set_manifest_retain_until(self, streams: Mapping[int, dt.datetime]) -> None:
        """Record the new Object Lock retain-until date of each stream's manifest and its
        copy (stream id -> aware UTC), after the store extended both locks
        (``archive.rolling_lock``).

        Raises:
            CatalogError: the write failed.
        """
        if not streams:
            return
        query = (sa.update(stream_table).where(stream_table.c.id == sa.bindparam("sid"))
                 .values(manifest_retain_until=sa.bindparam("until")))
        with self._transaction(f"recording the locks of {len(streams)} manifest(s)") as conn:
            conn.execute(query, [{"sid": sid, "until": until} for sid, until in streams.items()])

    def set_stream_state(
        self,
        stream_id: int,
        state: str,
        now: dt.datetime,
        *,
        raw_bytes: int | None = None,
        stored_bytes: int | None = None,
        reason: str | None = None,
    ) -> None:
        """Move stream ``stream_id`` to ``state`` (see ``STATE_TRANSITIONS``) at ``now``.

        "uploaded" sets ``uploaded_at`` and may record the final sizes (bytes); "verified"
        sets ``verified_at``; "bad" records ``reason`` (required there, refused elsewhere:
        every later refusal states it, ``StreamRow.bad_reason``). "condemned" (the
        tombstone written before the objects are deleted) needs every child stream
        condemned first, or use :meth:`condemn_streams`.

        Raises:
            NotInCatalog: no such stream.
            CatalogConflict: the transition is not allowed.
            ChainBroken: condemning a stream whose children are not condemned.
            ValueError: unknown state, naive ``now``, negative size, "bad" without a
                ``reason`` or another state with one.
        """
        require_one_of("stream state", state, STREAM_STATES)
        require_aware("now", now)
        if (state == "bad") != bool(reason):
            raise ValueError(f"setting stream {stream_id} {state}: a reason is required for"
                             " 'bad' and only there")
        with self._transaction(
            f"setting stream {stream_id} {state}", on_integrity=ChainBroken
        ) as conn:
            stream = self._row(conn, stream_table, stream_id)
            if stream is None:
                raise NotInCatalog(f"stream {stream_id} is not in the catalog")
            if state not in STATE_TRANSITIONS[stream.state]:
                raise CatalogConflict(
                    f"stream {stream_id} ({stream.to_name} in {stream.store}) cannot go from"
                    f" {stream.state} to {state}"
                )
            if state == "condemned":
                _refuse_living_children(conn, [stream_id])
            values: dict[str, object] = {"state": state}
            if state == "uploaded":
                values["uploaded_at"] = now
            if state == "verified":
                values["verified_at"] = now
            if state == "bad":
                values["bad_reason"] = reason
            if raw_bytes is not None:
                values["raw_bytes"] = require_size("raw_bytes", raw_bytes)
            if stored_bytes is not None:
                values["stored_bytes"] = require_size("stored_bytes", stored_bytes)
            conn.execute(sa.update(stream_table).where(stream_table.c.id == stream_id)
                         .values(**values))

    def condemn_streams(self, stream_ids: Iterable[int]) -> None:
        """Condemn a set of streams at once (a prune plan's chain): all or none.

        Raises:
            NotInCatalog: an id is not in the catalog.
            ChainBroken: a stream outside the set, not condemned, depends on one in it.
        """
        ids = sorted(set(stream_ids))
        with self._transaction(f"condemning streams {ids}", on_integrity=ChainBroken) as conn:
            for chunk in chunks(ids):
                found = conn.scalars(sa.select(stream_table.c.id)
                                     .where(stream_table.c.id.in_(chunk))).all()
                missing = sorted(set(chunk) - set(found))
                if missing:
                    raise NotInCatalog(f"streams {missing} are not in the catalog")
            _refuse_living_children(conn, ids)
            for chunk in chunks(ids):
                conn.execute(sa.update(stream_table).where(stream_table.c.id.in_(chunk))
                             .values(state="condemned"))

    def delete_stream(self, stream_id: int) -> None:
        """Delete condemned stream ``stream_id`` and its volume rows (after its objects are gone).

        Raises:
            ChainBroken: other streams still apply on it (the database refuses too).
            CatalogConflict: the stream is not condemned (condemn it, delete its objects, then
                the row: docs/design.md#chain-prune-order).
            NotInCatalog: no such stream.
        """
        with self._transaction(f"deleting stream {stream_id}", on_integrity=ChainBroken) as conn:
            stream = self._row(conn, stream_table, stream_id)
            if stream is None:
                raise NotInCatalog(f"stream {stream_id} is not in the catalog")
            children = _children(conn, [stream_id])
            if children:
                raise ChainBroken(
                    f"stream {stream_id} ({stream.to_name} in {stream.store}) cannot be deleted:"
                    f" streams {children} apply on it; delete them first"
                )
            if stream.state != "condemned":
                raise CatalogConflict(
                    f"stream {stream_id} is {stream.state}: condemn it and delete its objects"
                    " before deleting its catalog row"
                )
            for table in (volume_table, stream_snapshot_table, thaw_request_table):
                conn.execute(sa.delete(table).where(table.c.stream_id == stream_id))
            conn.execute(sa.delete(stream_table).where(stream_table.c.id == stream_id))
