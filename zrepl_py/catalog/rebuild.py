"""``zbak catalog rebuild STORE``: the catalog's streams re-created from the manifests alone.

After the database is lost (docs/design.md#archive: the catalog can be rebuilt from manifests
alone), every ``manifest.json`` under the store is read and parsed (``Manifest.from_json``),
and its stream, volumes and carried snapshots are added in chain order: per dataset by the
to-snapshot's createtxg, fulls before incrementals ending at the same snapshot, so a parent
is always in before its children. An incremental's parent is the stream of the same host,
dataset and store whose to-guid is its from-guid; when several match (a chain tip and a newer
full of the same snapshot), the one created last before the incremental wins, then a full
(what ``zbak archive`` continues: the newest chain). Rebuilt streams are ``uploaded``
(``uploaded_at`` = the manifest's time): verification is not in the manifests, ``zbak audit
--deep`` verifies them again.

Each manifest is read from ``manifest.json``, or from ``manifest.json.copy`` when the primary
is missing or fails its checksum (``objects.checked``,
docs/reliability.md#r26-catalog-metadata-copy-with-checksum). The store's catalog exports
(``catalog.export``) then tell what manifests cannot: streams an export lists whose manifests are
gone (neither primary nor copy) are reported in ``lost`` (their objects may be gone too: ``zbak
audit``). Stream states are not taken from the exports: rebuilt streams are re-verified by ``zbak
audit --deep`` like any other.

A store that already has streams in the catalog is refused unless ``merge``: then only the
streams whose prefix the catalog lacks are added. Manifests that cannot be parsed, and
incrementals whose parent is nowhere, are skipped and reported; prefixes with volumes but no
manifest (an interrupted upload, or a stream whose manifest pair was lost) are not streams.
What a store can still restore after a rebuild that skipped streams is what ``zbak audit``
states per dataset (``audit.restorable``: skipped streams and manifest-less prefixes are
stored but unrestorable).

With ``not_after`` (``--not-after TIME``) the store is read as it stood at TIME
(``objects.cutoff``, docs/security.md#recovery-after-an-intrusion): on a store that keeps
versions, per key the newest version written no later than TIME (manifests, copies, exports
and volumes alike; each volume's version id and retain-until are recorded, so restores and
audits read it and the rolling lock extends it), and
every later version or delete marker is listed in ``untrusted``; a store without versions is
refused (``UsageError``) unless every object in it is older than TIME.

Snapshot rows (the ``snapshots`` table) are not in the manifests: the next ``zbak snapshot``,
``archive`` or ``prune`` lists the source and records them again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

from zrepl_py.catalog.export import CatalogExport, read_exports
from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import LIVING_STATES, StoredVersion, StreamRow, manifest_rows
from zrepl_py.errors import CatalogError, StoreError, StreamCorrupt, UsageError
from zrepl_py.objects.checked import read_with_copy
from zrepl_py.objects.cutoff import as_of, written_after
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY, is_stream_prefix
from zrepl_py.objects.manifest import Manifest
from zrepl_py.stores.base import Backend, ObjectInfo, Version

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A manifest not turned into a stream: its key and why."""

    key: str
    why: str


@dataclasses.dataclass
class RebuildResult:
    """What a rebuild did: manifests found, stream ids added (chain order), prefixes already
    in the catalog (with ``merge``), manifests skipped with the reason, and the prefixes of
    streams a catalog export lists whose manifests are gone (``lost``), and with
    ``not_after`` the versions and delete markers written later (``untrusted``)."""

    store: str
    manifests: int = 0
    added: list[int] = dataclasses.field(default_factory=list)
    present: list[str] = dataclasses.field(default_factory=list)
    skipped: list[Skipped] = dataclasses.field(default_factory=list)
    lost: list[str] = dataclasses.field(default_factory=list)
    untrusted: list[Version] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class StoreView:
    """What a rebuild reads: the objects (``listing``) and, on a store read as of a time,
    the version of each key to read (``versions``, key -> version id; empty: the newest)."""

    listing: list[ObjectInfo]
    versions: dict[str, str]


def read_manifests(backend: Backend, concurrency: int = 4, view: StoreView | None = None
                   ) -> tuple[list[tuple[str, Manifest]], list[Skipped]]:
    """Every stream manifest in the store as ``(key, Manifest)`` (``key`` the primary's, the
    copy read when the primary fails), and the unreadable ones; ``view``: the objects and
    versions to read (default: the store's listing, newest versions).

    Raises:
        StoreError: listing the store failed.
    """
    listing = backend.list("") if view is None else view.listing
    versions = None if view is None else view.versions
    keys = sorted({info.key.removesuffix(MANIFEST_COPY[len(MANIFEST):])
                   for info in listing
                   if info.key.endswith(("/" + MANIFEST, "/" + MANIFEST_COPY))
                   and is_stream_prefix(info.key[: info.key.rfind("/") + 1])})
    found, skipped = [], []

    def read(key: str) -> Manifest:
        return read_with_copy(backend, key, Manifest.from_json, StreamCorrupt, versions).value

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency))
    try:
        for key, future in [(k, pool.submit(read, k)) for k in keys]:
            try:
                found.append((key, future.result()))
            except (StreamCorrupt, StoreError) as exc:
                skipped.append(Skipped(key, str(exc)))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return found, skipped


def chain_order(manifests: Sequence[tuple[str, Manifest]]) -> list[tuple[str, Manifest]]:
    """Manifests ordered so every parent comes before its children (pure)."""
    return sorted(manifests, key=lambda km: (km[1].host, km[1].dataset, km[1].to_snap.createtxg,
                                             km[1].kind != "full", km[1].created_at, km[0]))


def pick_parent(manifest: Manifest, candidates: Sequence[StreamRow]) -> StreamRow | None:
    """The stream an incremental applies on among ``candidates`` (same host, dataset and
    store, ``to_guid`` = its from-guid, not bad or condemned): created last no later than it,
    a full on ties (see the module docstring); None when there is none (pure)."""
    usable = [s for s in candidates if s.state in LIVING_STATES]
    if not usable:
        return None
    before = [s for s in usable if s.created_at <= manifest.created_at] or usable
    return max(before, key=lambda s: (s.created_at, s.kind == "full", s.id))


def store_view(backend: Backend, store: str, not_after: dt.datetime) -> tuple[StoreView,
                                                                              list[Version]]:
    """The store as it stood at ``not_after`` (aware UTC) and the versions written later
    (``objects.cutoff``).

    Raises:
        UsageError: the store keeps no versions and holds objects written after
            ``not_after`` (their older contents are gone: nothing tells what stood at TIME).
        StoreError: listing the store failed.
    """
    if backend.keeps_versions:
        at = as_of(backend.list_versions(""), not_after)
        return StoreView(list(at.listing.values()), at.versions), at.untrusted
    listing = list(backend.list(""))
    newer = written_after(listing, not_after)
    if newer:
        first = min(newer, key=lambda info: info.modified)
        raise UsageError(
            f"store {store} keeps no object versions and {len(newer)} object(s) in it were"
            f" written after {not_after:%Y-%m-%d %H:%M:%S} UTC (first {first.key} at"
            f" {first.modified:%Y-%m-%d %H:%M:%S} UTC): what it held then cannot be told;"
            " rebuild without --not-after and check each stream with `zbak audit --deep`")
    return StoreView(listing, {}), []


def stored_versions(backend: Backend, manifests: Sequence[tuple[str, Manifest]],
                    view: StoreView, concurrency: int = 4) -> dict[str, StoredVersion]:
    """Volume key -> the version ``view`` reads of it, with its retain-until on a lock store
    (one HeadObject per version, ``concurrency`` at once), so the rolling lock
    (``archive.rolling_lock``, which extends only recorded dates) keeps extending it.

    Raises:
        StoreError: a HeadObject failed.
    """
    keys = [v.key for _, m in manifests for v in m.volumes if v.key in view.versions]
    if backend.lock_policy is None:
        return {k: StoredVersion(view.versions[k], None) for k in keys}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        dates = list(pool.map(lambda k: backend.retain_until(k, view.versions[k]), keys))
    return {k: StoredVersion(view.versions[k], d) for k, d in zip(keys, dates, strict=True)}


def rebuild_store(catalog: Catalog, backend: Backend, store: str, *, merge: bool = False,
                  concurrency: int = 4, not_after: dt.datetime | None = None
                  ) -> RebuildResult:
    """Re-create the catalog's streams of ``store`` from its manifests (module docstring).

    Args:
        catalog: the (migrated) catalog to fill.
        backend: the store's backend.
        store: the store's name in the config (recorded in every stream row).
        merge: add only what is missing when the catalog already has streams of the store.
        concurrency: manifests read at once.
        not_after: read the store as it stood then (aware UTC; :func:`store_view`).

    Raises:
        UsageError: the catalog already has streams of ``store`` and ``merge`` is False;
            ``not_after`` on a store without versions holding newer objects.
        StoreError: the store could not be listed.
        CatalogError: the database failed.
    """
    existing = catalog.bulk_streams(store=store)
    if existing and not merge:
        raise UsageError(f"the catalog already has {len(existing)} stream(s) of store {store};"
                         " pass --merge to add only the missing ones")
    result = RebuildResult(store)
    view = None
    if not_after is not None:
        view, result.untrusted = store_view(backend, store, not_after)
    manifests, result.skipped = read_manifests(backend, concurrency, view)
    stored = {} if view is None else stored_versions(backend, manifests, view, concurrency)
    result.manifests = len(manifests) + len(result.skipped)
    known = {s.object_prefix for s in existing}
    by_tip: dict[tuple[str, str, int], list[StreamRow]] = {}
    for s in existing:
        by_tip.setdefault((s.host, s.dataset, s.to_guid), []).append(s)
    for key, manifest in chain_order(manifests):
        prefix = key[: -len(MANIFEST)]
        if prefix in known:
            result.present.append(prefix)
            continue
        parent = None
        base = manifest.from_snap  # set exactly for an incremental (Manifest.from_json)
        if manifest.kind == "incremental" and base is not None:
            parent = pick_parent(manifest, by_tip.get(
                (manifest.host, manifest.dataset, base.guid), []))
            if parent is None:
                result.skipped.append(Skipped(key, f"no stream ends at @{base.name}"
                                               f" (guid {base.guid}), the snapshot"
                                               " this incremental applies on"))
                continue
        try:
            stream, volumes = manifest_rows(
                manifest, store=store, prefix=prefix, parent_id=parent.id if parent else None,
                uploaded_at=manifest.created_at,
                versions={v.index: stored[v.key] for v in manifest.volumes if v.key in stored})
            stream_id = catalog.add_stream(stream, volumes, manifest.snapshots)
        except CatalogError as exc:
            result.skipped.append(Skipped(key, str(exc)))
            continue
        row = catalog.stream(stream_id)
        by_tip.setdefault((row.host, row.dataset, row.to_guid), []).append(row)
        known.add(prefix)
        result.added.append(stream_id)
    _apply_exports(backend, known, result, view)
    for skip in result.skipped:
        log.warning("rebuild of store %s: skipped %s: %s", store, skip.key, skip.why)
    for prefix in result.lost:
        log.warning("rebuild of store %s: the catalog export lists stream %s but its manifest"
                    " is gone: its objects may be lost; run `zbak audit`", store, prefix)
    return result


def export_states(exports: Sequence[tuple[str, CatalogExport]]
                  ) -> dict[str, dict[str, Any]]:
    """Each stream prefix's row from the newest export (by time written) that lists it (pure)."""
    rows: dict[str, dict[str, Any]] = {}
    for _, export in sorted(exports, key=lambda ke: (ke[1].written_at, ke[1].generation)):
        for row in export.streams:
            rows[row["prefix"]] = row
    return rows


def _apply_exports(backend: Backend, known: set[str], result: RebuildResult,
                   view: StoreView | None) -> None:
    """List the streams the store's catalog exports name but no manifest describes."""
    exports, bad = (read_exports(backend) if view is None
                    else read_exports(backend, view.listing, view.versions))
    unreadable = {skip.key[: skip.key.rfind("/") + 1] for skip in result.skipped}
    result.skipped += [Skipped(key, why) for key, why in bad]
    rows = export_states(exports)
    result.lost = sorted(p for p in rows if p not in known and p not in unreadable)
