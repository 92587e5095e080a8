"""Copy one catalogued stream from one store to another, in the order that keeps the catalog
honest (docs/copies.md#order-of-a-copy):

0. the source's manifest, read and checked against the catalog (its volumes, the snapshot
   it ends at and the snapshots it carries) before any byte moves;
1. each volume, read from the source store and put under the same key in the target, its
   bytes hashed as they pass (or, between two ``s3://`` stores on one endpoint, copied inside
   S3, which answers the SHA-256 of what it wrote: ``copying.inside``): the SHA-256 and the size the target reports must be the
   catalog's before the next volume (a mismatch deletes what arrived and stops the stream);
   a volume the target already holds (a copy killed earlier) is checked the same way
   (the store's own SHA-256 where it keeps one, else read back) and kept;
2. ``manifest.json`` and its copy: the source's manifest with the storage class the target
   used;
3. the catalog row of the target store (state ``uploaded``), with its volumes and carried
   snapshots.

A copy killed before 3 leaves volumes (and maybe the manifest) that the next run checks and
keeps, and at most one unfinished put, removed once the stream is done (``drop_unfinished``);
no catalog row names an object that was not checked. The volumes are byte-identical when
the target writes the stream's codec chain; into a store of another chain each volume is
re-encoded instead, and the manifest is the target's own (``copying.reencode``; ``job``
decides which).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from collections.abc import Callable, Iterable, Sequence

from zrepl_py.archive.throttle import Throttle
from zrepl_py.archive.writer import drop_unfinished
from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import StoredVersion, StreamRow, VolumeRow, manifest_rows
from zrepl_py.copying.inside import InsideS3
from zrepl_py.copying.reencode import Recoding, reencode_volumes
from zrepl_py.errors import ObjectNotFound, StreamCorrupt
from zrepl_py.objects.checked import put_with_copy, read_with_copy
from zrepl_py.objects.layout import MANIFEST
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest, VolumeRecord
from zrepl_py.stores.base import Backend


@dataclasses.dataclass(frozen=True)
class CopiedStream:
    """What copying one stream did: the target's new stream id, the bytes put, and how many
    volumes were put and how many an earlier, interrupted copy had put already."""

    stream_id: int
    stored_bytes: int
    volumes_written: int
    volumes_kept: int


@dataclasses.dataclass(frozen=True)
class StreamCopy:
    """One stream to copy.

    Attributes:
        stream: the source store's catalog row.
        volumes: its volume rows, by index.
        parent_id: the target store's stream this one applies on (None for a full).
        storage_class: the class asked of the target for the volumes.
        carried: the snapshots the catalog records the stream carries, in createtxg order
            (None: a row recorded without them; the manifest's are then not compared).
    """

    stream: StreamRow
    volumes: Sequence[VolumeRow]
    parent_id: int | None
    storage_class: str
    carried: Sequence[CarriedSnapshot] | None = None


def copy_stream(item: StreamCopy, source: Backend, target: Backend, catalog: Catalog,
                now: Callable[[], dt.datetime], throttle: Throttle | None = None,
                inside: InsideS3 | None = None, recoding: Recoding | None = None) -> CopiedStream:
    """Copy ``item`` from ``source`` to ``target`` and record it in the target store (see the
    module docstring for the order); with ``inside``, each volume is copied inside S3 where
    S3 can (the throttle then paces nothing: no byte passes through this host); with
    ``recoding``, the target writes another codec chain and each volume is re-encoded
    (``copying.reencode``), with a manifest of its own.

    Raises:
        StreamCorrupt: a volume arrived with another SHA-256 or size than the catalog's (the
            source's copy is damaged: ``zbak audit --deep`` of the source store), the
            source's manifest disagrees with the catalog, or a re-encoded stream failed a
            check (``copying.reencode.reencode_volumes``).
        IdentityNeeded, IdentityRefused: re-encoding a sealed stream without its identity.
        StoreError: either store failed; ObjectNotFound: a volume or the manifest is gone
            from the source.
        ChainBroken, CatalogError: the catalog refused the row.
    """
    began = dt.datetime.now(dt.UTC)  # the store's clock: leftovers are told apart by it
    stream = item.stream
    original = _manifest(item, source)  # checked before any byte moves
    sealed_to = stream.sealed_to  # a copy byte for byte holds the same age files
    if recoding is None:
        versions, used_class, written, kept = _copy_volumes(item, source, target, throttle,
                                                            inside)
        manifest = dataclasses.replace(original, storage_class=used_class)
    else:
        sealed_to = recoding.target.sealed_to
        new = reencode_volumes(stream, item.volumes, original.snapshots, recoding, source,
                               target, item.storage_class, throttle)
        manifest = dataclasses.replace(
            original, volumes=new.volumes, compression=recoding.target.name,
            compression_level=recoding.target.level, storage_class=new.storage_class)
        versions, written, kept = new.versions, len(new.volumes), 0
    puts = put_with_copy(target, stream.object_prefix + MANIFEST, manifest.to_json())
    row, volumes = manifest_rows(manifest, store=target.name, prefix=stream.object_prefix,
                                 parent_id=item.parent_id, uploaded_at=now(),
                                 versions=versions or None, manifest_puts=puts,
                                 sealed_to=sealed_to)
    stream_id = catalog.add_stream(row, volumes, manifest.snapshots)
    drop_unfinished(target, stream.object_prefix, began)
    return CopiedStream(stream_id, manifest.stored_bytes, written, kept)


def _copy_volumes(item: StreamCopy, source: Backend, target: Backend,
                  throttle: Throttle | None, inside: InsideS3 | None
                  ) -> tuple[dict[int, StoredVersion], str, int, int]:
    """Copy ``item``'s volumes byte for byte (step 1 of the module docstring): the stored
    version of each by index, the class the target used, and how many volumes were put and
    kept.

    Raises:
        as :func:`copy_stream`.
    """
    stream = item.stream
    written = kept = 0
    used_class = item.storage_class
    versions: dict[int, StoredVersion] = {}
    for volume in item.volumes:
        if arrived(target, volume):
            kept += 1
            if target.keeps_versions:
                versions[volume.index] = _newest_version(target, volume.key)
            continue
        result = inside.copy(volume, item.storage_class) if inside else None
        if result is None:
            chunks = source.get(volume.key)
            result = target.put(volume.key, throttle.chunks(chunks) if throttle else chunks,
                                storage_class=item.storage_class)
        used_class = result.storage_class
        size = target.stat(volume.key).size
        if (result.sha256, result.size, size) != (volume.sha256, volume.stored_bytes,
                                                  volume.stored_bytes):
            target.delete(volume.key)
            raise StreamCorrupt(
                f"volume {volume.key} of stream {stream.id} arrived in store {target.name} with"
                f" sha256 {result.sha256} and {size} bytes; the catalog says {volume.sha256} and"
                f" {volume.stored_bytes}: the copy in store {source.name} is damaged (check it"
                f" with `zbak audit --deep`); the arrived object was deleted")
        if result.version_id is not None:
            versions[volume.index] = StoredVersion(result.version_id, result.retain_until)
        written += 1
    return versions, used_class, written, kept


def arrived(target: Backend, volume: VolumeRow) -> bool:
    """Whether ``target`` already holds ``volume`` as the catalog records it (an earlier,
    interrupted copy put it): the size, then the SHA-256 the store keeps or, without one,
    the object read back and hashed. An object in a cold class without a SHA-256 of its own
    (an S3 multipart upload into DEEP_ARCHIVE) cannot be read back: it is not trusted, and
    put again.

    Raises:
        StoreTransient, StorePermanent: the target failed.
    """
    try:
        info = target.stat(volume.key)
    except ObjectNotFound:
        return False
    if info.size != volume.stored_bytes:
        return False
    if info.sha256 is not None:
        return info.sha256 == volume.sha256
    return info.readable and _sha256(target.get(volume.key)) == volume.sha256


def _newest_version(target: Backend, key: str) -> StoredVersion:
    """The version of ``key`` that ``arrived`` checked (the newest; a HEAD without a version
    id reads it) and when its lock lapses, for the catalog: restore and audit read that version
    and the rolling lock extends it (docs/security.md#object-versions-the-master-cannot-delete).

    Raises:
        ObjectNotFound: no version of ``key`` (it went since ``arrived``); StoreTransient,
            StorePermanent: the target failed.
    """
    for version in target.list_versions(key):
        if version.info.key == key:
            if version.marker:
                break
            return StoredVersion(version.version_id,
                                 target.retain_until(key, version.version_id))
    raise ObjectNotFound(f"store {target.name}: {key} has no version to record")


def _sha256(chunks: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def _manifest(item: StreamCopy, source: Backend) -> Manifest:
    """The source's manifest of the stream, checked against the catalog's volume rows and
    carried snapshots.

    Raises:
        StreamCorrupt: the manifest (and its copy) is damaged, or describes other volumes or
            carries other snapshots than the catalog records (the copy would record them).
        ObjectNotFound: neither the manifest nor its copy is in the source store.
    """
    key = item.stream.object_prefix + MANIFEST
    manifest = read_with_copy(source, key, Manifest.from_json, StreamCorrupt).value
    recorded = tuple(VolumeRecord(v.index, v.key, v.raw_bytes, v.stored_bytes, v.sha256)
                     for v in item.volumes)
    if manifest.volumes != recorded or manifest.to_snap.guid != item.stream.to_guid:
        raise StreamCorrupt(f"manifest {source.name}:{key} describes other volumes than the"
                            f" catalog's stream {item.stream.id}: check store {source.name}"
                            " with `zbak audit`")
    if item.carried is not None and manifest.snapshots != tuple(item.carried):
        raise StreamCorrupt(f"manifest {source.name}:{key} carries other snapshots than the"
                            f" catalog's stream {item.stream.id}: check store {source.name}"
                            " with `zbak audit`")
    return manifest

