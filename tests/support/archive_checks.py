"""Invariants of an archive store and its catalog, checked after every injected fault.

docs/design.md#archive-writer-order and docs/design.md#chain-prune-order: the catalog never
names an object that is not stored whole (every catalogued volume exists with its recorded size and
SHA-256, next to its manifest); the only objects outside a catalogued stream are those of an upload
that a rerun finishes (a partial upload, with or without ``progress.json`` yet) or adopts (a
manifest whose volumes are all stored, written just before the crash hit the catalog row). Each
manifest may have its ``.copy`` next to it, and the store's catalog exports (``_zbak/``,
docs/reliability.md#r25-catalog-rollback-detection,
docs/reliability.md#r26-catalog-metadata-copy-with-checksum) are checked by :func:`export_problems`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Iterator
from pathlib import Path

from zrepl_py.catalog.db import make_engine
from zrepl_py.catalog.export import load_export
from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import StreamRow, VolumeRow
from zrepl_py.config.loading import load_config
from zrepl_py.objects.layout import EXPORT_PREFIX, MANIFEST, MANIFEST_COPY, PROGRESS, volume_index
from zrepl_py.objects.manifest import Manifest
from zrepl_py.stores.base import Backend


@contextlib.contextmanager
def catalog_of(config_path: Path) -> Iterator[Catalog]:
    """The catalog of the zbak config at ``config_path`` (engine disposed afterwards)."""
    engine = make_engine(load_config(config_path).catalog_url)
    try:
        yield Catalog(engine)
    finally:
        engine.dispose()


@dataclasses.dataclass(frozen=True)
class StoreState:
    """What a store holds, grouped by stream prefix (``HOST/DATASET/TXG-...-GUID/``).

    Attributes:
        objects: key -> size in bytes, every object.
        prefixes: stream prefix -> the leaf names under it.
    """

    objects: dict[str, int]
    prefixes: dict[str, set[str]]


def store_state(backend: Backend) -> StoreState:
    """List every object of ``backend`` (its ``list("")``)."""
    objects = {info.key: info.size for info in backend.list("")}
    prefixes: dict[str, set[str]] = {}
    for key in objects:
        head, _, leaf = key.rpartition("/")
        prefixes.setdefault(head + "/", set()).add(leaf)
    return StoreState(objects, prefixes)


def catalogued(catalog: Catalog, dataset: str) -> list[tuple[StreamRow, list[VolumeRow]]]:
    """Every stream of ``dataset`` in the catalog with its volumes, chain order."""
    return [(s, catalog.volumes(s.id)) for s in catalog.streams(dataset=dataset)]


def sha256_of(backend: Backend, key: str) -> str:
    """Lowercase hex SHA-256 of the stored object ``key``."""
    digest = hashlib.sha256()
    for chunk in backend.get(key):
        digest.update(chunk)
    return digest.hexdigest()


def catalog_problems(backend: Backend, streams: list[tuple[StreamRow, list[VolumeRow]]]
                     ) -> list[str]:
    """Catalogued objects that are missing, of another size or SHA-256, or lack a manifest."""
    state = store_state(backend)
    problems = []
    for stream, volumes in streams:
        if not volumes:
            problems.append(f"stream {stream.id} has no volumes")
        if stream.object_prefix + MANIFEST not in state.objects:
            problems.append(f"stream {stream.id}: no manifest at {stream.object_prefix}")
        for v in volumes:
            size = state.objects.get(v.key)
            if size is None:
                problems.append(f"stream {stream.id}: volume {v.key} missing")
            elif size != v.stored_bytes:
                problems.append(f"stream {stream.id}: volume {v.key} has {size} bytes,"
                                f" catalog {v.stored_bytes}")
            elif sha256_of(backend, v.key) != v.sha256:
                problems.append(f"stream {stream.id}: volume {v.key} SHA-256 differs")
    return problems


def leftovers(backend: Backend, streams: list[tuple[StreamRow, list[VolumeRow]]]
              ) -> dict[str, str]:
    """Stream prefixes that hold objects but no catalogued stream, each classified:
    ``"partial"`` (volumes and/or progress.json, no manifest: a rerun resumes or restarts it),
    ``"adoptable"`` (a manifest whose volumes are all stored with their sizes), or
    ``"broken: ..."`` (anything else: a manifest naming missing volumes, stray files)."""
    state = store_state(backend)
    known = {s.object_prefix for s, _ in streams}
    found: dict[str, str] = {}
    for prefix, leaves in state.prefixes.items():
        if prefix in known or prefix.startswith(EXPORT_PREFIX):
            continue
        strays = {leaf for leaf in leaves
                  if leaf not in (MANIFEST, MANIFEST_COPY, PROGRESS) and volume_index(leaf) is None}
        if strays:
            found[prefix] = f"broken: stray objects {sorted(strays)}"
        elif MANIFEST not in leaves:
            found[prefix] = "partial"
        else:
            data = b"".join(backend.get(prefix + MANIFEST))
            manifest = Manifest.from_json(data, prefix + MANIFEST)
            missing = [v.key for v in manifest.volumes
                       if state.objects.get(v.key) != v.stored_bytes]
            found[prefix] = f"broken: manifest names missing volumes {missing}" if missing \
                else "adoptable"
    return found


def converged_problems(backend: Backend, streams: list[tuple[StreamRow, list[VolumeRow]]],
                       *, stale_progress_ok: bool = False) -> list[str]:
    """After a successful run: the store holds exactly the catalogued manifests, their copies
    and volumes, and a healthy catalog export listing exactly the catalogued streams (no
    ``progress.json``, nothing else), and they match the catalog.

    ``stale_progress_ok`` allows a ``progress.json`` inside a catalogued stream: a run killed
    after the catalog row and before deleting it leaves one, and a rerun with nothing to write
    does not look at the store (``archive.job`` cleans it when it next writes a stream)."""
    state = store_state(backend)
    expected = set()
    for stream, volumes in streams:
        expected.add(stream.object_prefix + MANIFEST)
        expected.add(stream.object_prefix + MANIFEST_COPY)
        expected.update(v.key for v in volumes)
        if stale_progress_ok:
            expected.add(stream.object_prefix + PROGRESS)
    problems = catalog_problems(backend, streams)
    problems += export_problems(backend, streams)
    problems += [f"object {key} is not in the catalog" for key in sorted(set(state.objects)
                                                                          - expected)
                 if not key.startswith(EXPORT_PREFIX)]
    for stream, volumes in streams:
        key = stream.object_prefix + MANIFEST
        for each in (key, stream.object_prefix + MANIFEST_COPY):
            if each not in state.objects:
                continue
            manifest = Manifest.from_json(b"".join(backend.get(each)), each)
            if [(v.key, v.sha256, v.stored_bytes) for v in manifest.volumes] != \
                    [(v.key, v.sha256, v.stored_bytes) for v in volumes]:
                problems.append(f"manifest {each} and the catalog disagree on the volumes")
    return problems


def export_problems(backend: Backend, streams: list[tuple[StreamRow, list[VolumeRow]]]
                    ) -> list[str]:
    """The store's catalog exports (primary and copy, ``_zbak/catalog/...``): exactly one,
    healthy (both objects valid and equal), listing exactly the catalogued stream prefixes."""
    keys = sorted({info.key.removesuffix(".copy") for info in backend.list(EXPORT_PREFIX)})
    if len(keys) != 1:
        return [f"expected one catalog export, found {keys}"]
    loaded = load_export(backend, keys[0])
    if loaded is None or not loaded.healthy:
        return [f"catalog export {keys[0]} is missing or not healthy"]
    listed = sorted(row["prefix"] for row in loaded.export.streams)
    wanted = sorted(s.object_prefix for s, _ in streams)
    return [] if listed == wanted else [f"catalog export lists {listed}, catalog {wanted}"]
