"""A stream copied into a store of another codec chain (plain into sealed, sealed into plain,
sealed to other recipients): each volume is decoded through the stream's chain and encoded
through the target's, one new volume per volume under the same key
(docs/copies.md#codec-chains, docs/decisions.md#copies-re-encode-volume-by-volume).

What is checked before the target's manifest and catalog row are written: each source
volume's stored size and SHA-256 against the catalog (after every check of its chain: zstd's
content checksum, age's authentication, the raw size), each new zstd frame decoded again to
the raw bytes read (``Codec.reencode``), each new volume's size in the target, and the raw
bytes of all volumes walked as one send stream whose BEGIN records carry the stream's guids
and the snapshots its manifest lists (``audit.deep.begin_problems``, as ``audit --deep``).

A re-encoded volume has bytes no earlier run can be checked against (age encrypts with a new
key each time), so a copy killed mid-stream starts the stream again on the next run: every
volume is put again under its key, which replaces what the killed run put, and what its
unfinished put left is removed once the stream is done. A stream that fails a check has its
volumes deleted from the target again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from zrepl_py.archive.throttle import Throttle
from zrepl_py.audit.deep import begin_problems
from zrepl_py.catalog.rows import StoredVersion, StreamRow, VolumeRow
from zrepl_py.errors import StoreError, StreamCorrupt, ZbakError
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY
from zrepl_py.objects.manifest import CarriedSnapshot, VolumeRecord
from zrepl_py.stores.base import Backend, get_recorded
from zrepl_py.streams.codec import Codec
from zrepl_py.streams.frames import Digest
from zrepl_py.streams.records import RecordWalker

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Recoding:
    """How a stream's volumes change on their way into the target store.

    Attributes:
        source: decodes the stream's volumes (with the identities of a sealed chain).
        target: the codec chain the target store writes (its recipients, the job's level).
    """

    source: Codec
    target: Codec

    @property
    def label(self) -> str:
        """``zstd -> zstd+age``: the chains, for the copy's rows."""
        return f"{self.source.name} -> {self.target.name}"


@dataclasses.dataclass(frozen=True)
class Reencoded:
    """The new volumes of one stream in the target, by index, with the class the target
    used and each volume's stored version (a store that keeps versions)."""

    volumes: tuple[VolumeRecord, ...]
    storage_class: str
    versions: dict[int, StoredVersion]


def reencode_volumes(stream: StreamRow, volumes: Sequence[VolumeRow],
                     carried: Sequence[CarriedSnapshot], recoding: Recoding, source: Backend,
                     target: Backend, storage_class: str,
                     throttle: Throttle | None = None) -> Reencoded:
    """Put every volume of a stream into ``target`` re-encoded (see the module docstring).

    Args:
        stream: the source store's catalog row of the stream.
        volumes: its volume rows in the source store, by index.
        carried: the snapshots its (checked) manifest lists, which the new manifest keeps.
        storage_class: the class asked of the target.

    Raises:
        StreamCorrupt: a source volume is not what the catalog records, a check of its
            chain failed, a new volume did not arrive whole, or the send stream's records
            contradict the stream's guids; what this run put of the stream is deleted.
        IdentityNeeded, IdentityRefused: the sealed source cannot be opened (exit 2).
        ObjectNotFound: a volume is gone from the source; StoreError: either store failed.
    """
    walker = RecordWalker(f"stream {stream.id} (@{stream.to_name}) in store {source.name}")
    records: list[VolumeRecord] = []
    versions: dict[int, StoredVersion] = {}
    used_class = storage_class
    try:
        for volume in volumes:
            where = f"{source.name}:{volume.key}"
            read, made = Digest(), Digest(hash_stored=False)
            chunks = recoding.target.reencode(
                get_recorded(source, volume.key, volume.version_id), recoding.source, where,
                made, read=read, raw_bytes=volume.raw_bytes, sink=walker.feed)
            result = target.put(volume.key, throttle.chunks(chunks) if throttle else chunks,
                                storage_class=storage_class)
            size = target.stat(volume.key).size
            if (read.stored_bytes, read.sha256) != (volume.stored_bytes, volume.sha256):
                raise StreamCorrupt(
                    f"volume {where} of stream {stream.id} holds {read.stored_bytes} bytes"
                    f" with sha256 {read.sha256}; the catalog says {volume.stored_bytes} and"
                    f" {volume.sha256}: the copy in store {source.name} is damaged (check it"
                    " with `zbak audit --deep`)")
            if not result.size == size == made.stored_bytes:
                raise StreamCorrupt(
                    f"volume {volume.key} of stream {stream.id} arrived in store {target.name}"
                    f" with {size} bytes of the {made.stored_bytes} written")
            records.append(VolumeRecord(volume.index, volume.key, volume.raw_bytes, size,
                                        result.sha256))
            used_class = result.storage_class
            if result.version_id is not None:
                versions[volume.index] = StoredVersion(result.version_id, result.retain_until)
        summary = walker.finish()
        problems = begin_problems(summary, stream, carried)
        if problems:
            raise StreamCorrupt(f"stream {stream.id} in store {source.name}: "
                                + "; ".join(problems))
    except ZbakError:
        _delete(target, [v.key for v in volumes]
                + [stream.object_prefix + MANIFEST, stream.object_prefix + MANIFEST_COPY])
        raise
    return Reencoded(tuple(records), used_class, versions)


def _delete(target: Backend, keys: Sequence[str]) -> None:
    """Delete a stream's ``keys`` from ``target`` (what this run or a killed one put); a
    failure is a warning: ``zbak audit`` reports what is left, the next copy replaces it."""
    for key in keys:
        try:
            target.delete(key)
        except StoreError as exc:
            log.warning("could not delete %s from store %s after the copy failed: %s",
                        key, target.name, exc)
