"""zstd volumes: each volume of an archived stream is one independent zstd frame.

Why one frame per volume: a volume can then be checked on its own (SHA-256 of the stored
bytes, frame end, content checksum) before any of it reaches ``zfs receive``, and volumes can
be downloaded in parallel. Frames are written with ``write_checksum=True``; STYLE.md's
zstandard pitfall applies: a truncated frame decodes partially without error, so readers
must check ``eof`` (frame end reached) and that nothing follows the frame.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator

import zstandard

from zrepl_py.errors import StreamCorrupt


@dataclasses.dataclass
class Digest:
    """Running byte count and SHA-256 of both sides of a volume.

    Attributes:
        raw_bytes / raw_sha256: the uncompressed stream bytes (what zfs send wrote).
        stored_bytes / sha256: the compressed frame (what the store holds).
    """

    raw_bytes: int = 0
    stored_bytes: int = 0
    _raw: "hashlib._Hash" = dataclasses.field(default_factory=hashlib.sha256, repr=False)
    _stored: "hashlib._Hash" = dataclasses.field(default_factory=hashlib.sha256, repr=False)

    def add_raw(self, data: bytes) -> None:
        """Account for uncompressed bytes."""
        self.raw_bytes += len(data)
        self._raw.update(data)

    def add_stored(self, data: bytes) -> None:
        """Account for stored (compressed) bytes."""
        self.stored_bytes += len(data)
        self._stored.update(data)

    @property
    def raw_sha256(self) -> str:
        """Lowercase hex SHA-256 of the raw bytes so far."""
        return self._raw.hexdigest()

    @property
    def sha256(self) -> str:
        """Lowercase hex SHA-256 of the stored bytes so far."""
        return self._stored.hexdigest()


def compress_frame(raw: Iterable[bytes], level: int, digest: Digest) -> Iterator[bytes]:
    """Yield one zstd frame (content checksum on) compressing ``raw``; fill ``digest``.

    Args:
        raw: the volume's uncompressed chunks.
        level: zstd level 1..22.
        digest: receives the raw and stored counts and hashes as bytes pass.
    """
    # threads=1 moves compression to a zstd worker thread, overlapping it with our pipe
    # reads and uploads (python-zstandard ZstdCompressor ``threads``).
    cobj = zstandard.ZstdCompressor(level=level, write_checksum=True, threads=1).compressobj()
    for chunk in raw:
        digest.add_raw(chunk)
        out = cobj.compress(chunk)
        if out:
            digest.add_stored(out)
            yield out
    out = cobj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
    if out:
        digest.add_stored(out)
        yield out


def decompress_frame(stored: Iterable[bytes], what: str, digest: Digest | None = None) -> Iterator[bytes]:
    """Yield the decompressed bytes of exactly one zstd frame read from ``stored``.

    The frame's content checksum is checked by zstd as it ends; after the input ends, the
    frame must have ended (``eof``) with nothing after it.

    Args:
        stored: the stored bytes in chunks.
        what: names the volume in error messages (store, key).
        digest: when given, receives the stored and raw counts and hashes.

    Raises:
        StreamCorrupt: a damaged frame, a checksum mismatch, a truncated frame or bytes after it.
    """
    dobj = zstandard.ZstdDecompressor().decompressobj()
    for chunk in stored:
        if digest is not None:
            digest.add_stored(chunk)
        if dobj.eof:
            raise StreamCorrupt(f"{what}: bytes after the end of the zstd frame")
        try:
            out = dobj.decompress(chunk)
        except zstandard.ZstdError as exc:
            raise StreamCorrupt(f"{what}: not a valid zstd frame: {exc}") from None
        if out:
            if digest is not None:
                digest.add_raw(out)
            yield out
    if not dobj.eof:
        raise StreamCorrupt(f"{what}: the zstd frame is truncated (no frame end)")
    if dobj.unused_data:
        raise StreamCorrupt(f"{what}: bytes after the end of the zstd frame")
