"""zstd volumes: each volume of an archived stream is one independent zstd frame.

Why one frame per volume: a volume can then be checked on its own (SHA-256 of the stored
bytes, frame end, content checksum) before any of it reaches ``zfs receive``, and volumes can
be downloaded in parallel. Frames are written with ``write_checksum=True``; the zstandard
pitfall applies (docs/style.md#the-zstandard-pitfall): a truncated frame decodes partially without
error, so readers must check ``eof`` (frame end reached) and that nothing follows the frame.

Frame layout (RFC 8878 section 3.1.1, the only facts :class:`FrameWalk` relies on): magic
``28 B5 2F FD``; a frame header descriptor byte (bits 7-6 Frame_Content_Size_Flag, bit 5
Single_Segment_Flag, bit 3 reserved = 0, bit 2 Content_Checksum_Flag, bits 1-0
Dictionary_ID_Flag); a window descriptor byte unless Single_Segment; 0/1/2/4 dictionary id
bytes; 0/2/4/8 content size bytes (1 when the flag is 0 and Single_Segment is set); then
blocks, each a 3-byte little-endian header (bit 0 Last_Block, bits 2-1 Block_Type: 0 raw,
1 RLE, 2 compressed, 3 reserved; bits 23-3 Block_Size, at most 128 KiB) followed by
Block_Size bytes (1 byte for RLE); after the last block, the 4-byte content checksum.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import blake3
import zstandard

from zrepl_py.errors import StreamCorrupt
from zrepl_py.runtime.behind import Behind
from zrepl_py.runtime.cpus import usable_cpus

_MAGIC = b"\x28\xb5\x2f\xfd"
_MAX_BLOCK = 128 * 1024  # RFC 8878 3.1.1.2.3: Block_Maximum_Size <= 128 KiB
JOB_SIZE = 2 << 20
"""Raw bytes per zstd job in multi-threaded compression (see :func:`compress_frame`)."""
RAW_HASH_DEPTH = 3
"""Chunks handed to the raw hash thread and not hashed yet before :func:`compress_frame`
waits for it (3 MiB at 1 MiB chunks): on 2 busy CPUs the hasher falls behind for a moment
now and then, and with one chunk of slack the compressing thread waited on it for 28 % of a
50 % compressible archive (py-spy, benchmarks/archive.py)."""
MAX_COMPRESS_THREADS = 2
"""Most zstd workers one frame uses. Each holds about 15 MiB at ``JOB_SIZE`` (more on
incompressible data, whose output buffers fill): with two, ``zbak archive`` of random data to
S3 peaked at 197 MiB beside 8 MiB parts four at a time (benchmarks/archive.py), so a third
worker would break the 200 MiB bound
(docs/decisions.md#archive-at-the-speed-of-the-pipe-within-200-mib)."""


class _Hasher(Protocol):
    def update(self, data: bytes, /) -> object: ...

    def hexdigest(self) -> str: ...


RAW_HASHES: dict[str, Callable[[], _Hasher]] = {"blake3": blake3.blake3,
                                                 "sha256": hashlib.sha256}
"""The hashes of a volume's raw bytes an upload's progress record may name (``archive.progress``):
BLAKE3 is written, SHA-256 is read from records written before it
(docs/decisions.md#the-raw-volume-hash-is-blake3)."""
RAW_HASH = "blake3"
"""The raw hash new volumes get."""


@dataclasses.dataclass
class Digest:
    """Running byte count and hashes of both sides of a volume.

    Attributes:
        raw_bytes / raw_hash: the uncompressed stream bytes (what zfs send wrote) and their
            hash (hex) by ``raw_algorithm``.
        stored_bytes / sha256: the compressed frame (what the store holds).
        raw_algorithm: a key of ``RAW_HASHES``; the default ``RAW_HASH``.
        hash_stored: False to only count the stored bytes (when the store hashes them
            anyway, ``Backend.put`` returns the SHA-256); ``sha256`` then raises ValueError.
        hash_raw: False to only count the raw bytes (a reader that checks their count
            alone: the deep audit); ``raw_hash`` then raises ValueError.

    Raises:
        KeyError: ``raw_algorithm`` is no key of ``RAW_HASHES``.
    """

    raw_bytes: int = 0
    stored_bytes: int = 0
    hash_stored: bool = True
    raw_algorithm: str = RAW_HASH
    hash_raw: bool = True
    _raw: _Hasher = dataclasses.field(init=False, repr=False)
    _stored: hashlib._Hash = dataclasses.field(default_factory=hashlib.sha256, repr=False)

    def __post_init__(self) -> None:
        self._raw = RAW_HASHES[self.raw_algorithm]()

    def add_raw(self, data: bytes) -> None:
        """Account for uncompressed bytes."""
        self.raw_bytes += len(data)
        if self.hash_raw:
            self._raw.update(data)

    def add_stored(self, data: bytes) -> None:
        """Account for stored (compressed) bytes."""
        self.stored_bytes += len(data)
        if self.hash_stored:
            self._stored.update(data)

    def take_raw(self, other: Digest) -> None:
        """Take ``other``'s raw count and hash as this digest's (a codec chain whose first
        step saw the raw bytes and whose last step made the stored ones)."""
        self.raw_bytes, self.raw_algorithm, self._raw, self.hash_raw = (
            other.raw_bytes, other.raw_algorithm, other._raw, other.hash_raw)

    @property
    def raw_hash(self) -> str:
        """Lowercase hex hash (``raw_algorithm``) of the raw bytes so far.

        Raises:
            ValueError: the digest only counts raw bytes (``hash_raw=False``).
        """
        if not self.hash_raw:
            raise ValueError("this digest counts the raw bytes without hashing them")
        return self._raw.hexdigest()

    @property
    def sha256(self) -> str:
        """Lowercase hex SHA-256 of the stored bytes so far.

        Raises:
            ValueError: the digest only counts stored bytes (``hash_stored=False``).
        """
        if not self.hash_stored:
            raise ValueError("this digest counts the stored bytes without hashing them")
        return self._stored.hexdigest()


def compress_threads() -> int:
    """zstd worker threads for :func:`compress_frame`: the CPUs this process may run on (as
    ``zstd -T0`` takes), at most ``MAX_COMPRESS_THREADS``, so memory stays bounded."""
    return max(1, min(MAX_COMPRESS_THREADS, usable_cpus() or 1))


def compress_frame(raw: Iterable[bytes], level: int, digest: Digest, *,
                   threads: int | None = None) -> Iterator[bytes]:
    """Yield one zstd frame (content checksum on) compressing ``raw``; fill ``digest``.

    zstd's own multi-threaded mode compresses (``threads`` workers, jobs of ``JOB_SIZE``
    raw bytes; python-zstandard releases the GIL inside libzstd), so this thread only hands
    it each chunk while the raw hash (BLAKE3) runs in one helper thread (``runtime.behind``, up to
    ``RAW_HASH_DEPTH`` chunks behind), and the consumer stores what came out before. What
    each worker holds is bounded by the job
    size: measured with python-zstandard 0.25 (libzstd 1.5.7) at level 3, 2 MiB jobs add
    about 15 MiB of RSS per worker and make output 0.1 % larger than zstd's default jobs of
    4 x the window (8 MiB), which added 45 MiB per worker. The output does not depend on
    the number of workers (libzstd cuts the same jobs). The workers cost more CPU than
    zstd's single-threaded mode (about twice, from memory), yet the archive is faster with
    them than with that mode in a helper thread
    (docs/performance.md#the-cold-path-goals-and-its-peer).

    Args:
        raw: the volume's uncompressed chunks (any size; 1 MiB is what callers use). Each
            chunk must not change after it is yielded (it is hashed in another thread).
        level: zstd level 1..22.
        digest: receives the raw and stored counts and hashes; complete once the
            generator is exhausted.
        threads: zstd workers, >= 1; None for :func:`compress_threads`.

    Raises:
        whatever iterating ``raw`` raises; zstandard.ZstdError (not expected).
    """
    params = zstandard.ZstdCompressionParameters.from_level(
        level, threads=threads or compress_threads(), job_size=JOB_SIZE, write_checksum=True)
    cobj = zstandard.ZstdCompressor(compression_params=params).compressobj()
    with Behind("hash-raw", depth=RAW_HASH_DEPTH) as hasher:
        for chunk in raw:
            hasher.submit(digest.add_raw, chunk)
            out = cobj.compress(chunk)
            if out:
                digest.add_stored(out)
                yield out
        out = cobj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)
        hasher.drain()
    if out:
        digest.add_stored(out)
        yield out


BLOCKS_PER_CALL = 64
"""Blocks one decode call may take: at most 64 x 128 KiB (Block_Maximum_Size) come out of
it, plus what zstd held back of the window (8 MiB at zbak's levels), so a decoded piece
stays under about 16 MiB; ordinary data has 8-30 blocks per MiB stored, one call."""


def decompress_frame(stored: Iterable[bytes], what: str, digest: Digest | None = None, *,
                     raw_bytes: int | None = None) -> Iterator[bytes]:
    """Yield the decompressed bytes of exactly one zstd frame read from ``stored``.

    The frame's content checksum is checked by zstd as it ends; after the input ends, the
    frame must have ended (``eof``) with nothing after it, and, when ``raw_bytes`` is given,
    have decoded to that many bytes. Each call into zstd decodes at most
    ``BLOCKS_PER_CALL`` blocks (``FrameWalk`` finds their headers), so what one piece holds
    is bounded whatever the ratio: a frame of zeros decodes 128 KiB from 4 bytes (an RLE
    block), and 2 GiB of zeros, 64 KiB stored, came out of one call as one 2 GiB piece.
    The last decoded piece is held back until all of these checks passed, so a consumer
    (``zfs receive``) never gets the end of a frame that fails them: a send stream's END
    record is in its last bytes, and a receive that never sees it discards the partial
    stream once cancelled.

    Args:
        stored: the stored bytes in chunks.
        what: names the volume in error messages (store, key).
        digest: when given, receives the stored and raw counts and hashes.
        raw_bytes: the decoded size the catalog records, checked at the end.

    Raises:
        StreamCorrupt: a damaged frame, a checksum mismatch, a truncated frame, bytes after
            it, or another decoded size than ``raw_bytes``.
    """
    dobj = zstandard.ZstdDecompressor().decompressobj()
    walk = FrameWalk(what)
    held = b""
    total = 0
    for chunk in stored:
        if digest is not None:
            digest.add_stored(chunk)
        if dobj.eof:
            raise StreamCorrupt(f"{what}: bytes after the end of the zstd frame")
        headers = walk.feed(chunk)
        cuts = [0, *headers[BLOCKS_PER_CALL::BLOCKS_PER_CALL], len(chunk)]
        for start, stop in itertools.pairwise(cuts):
            try:
                out = dobj.decompress(chunk[start:stop] if len(cuts) > 2 else chunk)
            except zstandard.ZstdError as exc:
                raise StreamCorrupt(f"{what}: not a valid zstd frame: {exc}") from None
            if out:
                total += len(out)
                if digest is not None:
                    digest.add_raw(out)
                if held:
                    yield held
                held = out
    if not dobj.eof:
        raise StreamCorrupt(f"{what}: the zstd frame is truncated (no frame end)")
    if dobj.unused_data:
        raise StreamCorrupt(f"{what}: bytes after the end of the zstd frame")
    if raw_bytes is not None and total != raw_bytes:
        raise StreamCorrupt(f"{what}: decodes to {total} bytes, the catalog records {raw_bytes}")
    if held:
        yield held


def redecoded(frame: Iterable[bytes], what: str, expected: Digest) -> Iterator[bytes]:
    """Pass the chunks of one zstd frame through while decoding them again; the last chunk
    comes only once the frame ended and decoded to ``expected``'s raw count and hash (read
    when the frame is over: the raw bytes it was made from were all read by then). What a
    copy into a store of another codec chain checks its new volume by
    (docs/decisions.md#copies-re-encode-volume-by-volume). A chunk is what
    :func:`compress_frame` yields, at most a few zstd jobs (``JOB_SIZE`` raw bytes each), so
    what one decode call makes stays bounded.

    Raises:
        StreamCorrupt: the frame is damaged, or decodes to other bytes than ``expected``'s.
    """
    dobj = zstandard.ZstdDecompressor().decompressobj()
    again = Digest(hash_stored=False, raw_algorithm=expected.raw_algorithm)
    held = b""
    for chunk in frame:
        try:
            out = dobj.decompress(chunk)
        except zstandard.ZstdError as exc:
            raise StreamCorrupt(f"{what}: the new zstd frame does not decode: {exc}") from None
        if out:
            again.add_raw(out)
        if held:
            yield held
        held = chunk
    if not dobj.eof or dobj.unused_data or (again.raw_bytes, again.raw_hash) != (
            expected.raw_bytes, expected.raw_hash):
        raise StreamCorrupt(
            f"{what}: the new zstd frame decodes to {again.raw_bytes} bytes"
            f" ({expected.raw_algorithm} {again.raw_hash[:16]}...), the volume read holds"
            f" {expected.raw_bytes} ({expected.raw_hash[:16]}...): it was not stored")
    if held:
        yield held


class FrameWalk:
    """Check the structure of one zstd frame as its bytes pass, without decoding it.

    Follows the frame header and block headers (see the module docstring) to where the
    frame must end, so a frame cut short, with bytes after it, with a reserved block type
    or an oversized block, or without a content checksum is rejected at a cost of a few
    bytes read per 128 KiB block. What it cannot see (a changed byte inside a block, a
    wrong content checksum) is what the SHA-256 of the stored bytes or a decode catches.

    Use: ``feed(chunk)`` for every chunk in order, then ``end()``.

    Args:
        what: names the volume in error messages (store, key).
    """

    def __init__(self, what: str):
        self._what = what
        self._need = 5  # bytes the next structure needs (magic + frame header descriptor)
        self._pending = bytearray()
        self._parse: Callable[[bytes], None] = self._frame_start
        self._skip = 0  # block content bytes still to pass over
        self._after_skip: Callable[[], None] = self._expect_block
        self._ended = False
        self._checksum = False
        self._headers: list[int] = []  # what feed() returns
        self._at = 0  # offset in the chunk being fed just after the structure parsed

    def feed(self, chunk: bytes) -> list[int]:
        """Account for the next stored bytes.

        Returns:
            the offsets in ``chunk`` just after each block header it completed, in order
            (``decompress_frame`` cuts its input there to bound what one call decodes).

        Raises:
            StreamCorrupt: the bytes so far cannot be (the start of) one whole frame.
        """
        self._headers = []
        view = memoryview(chunk)
        size = len(chunk)
        while view:
            if self._ended:
                self._fail("bytes after the end of the zstd frame")
            if self._skip:
                step = min(self._skip, len(view))
                self._skip -= step
                view = view[step:]
                if not self._skip:
                    self._after_skip()
                continue
            take = self._need - len(self._pending)
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) == self._need:
                data = bytes(self._pending)
                self._pending.clear()
                self._at = size - len(view)
                self._parse(data)
        return self._headers

    def end(self) -> None:
        """The input is over: the frame must be complete.

        Raises:
            StreamCorrupt: the frame is truncated.
        """
        if not self._ended:
            self._fail("the zstd frame is truncated (no frame end)")

    # -- states ------------------------------------------------------------------

    def _fail(self, why: str) -> None:
        raise StreamCorrupt(f"{self._what}: {why}")

    def _frame_start(self, data: bytes) -> None:
        if data[:4] != _MAGIC:
            self._fail("not a zstd frame (bad magic number)")
        fhd = data[4]
        if fhd & 0x08:
            self._fail("not a valid zstd frame (reserved header bit set)")
        self._checksum = bool(fhd & 0x04)
        if not self._checksum:
            self._fail("the zstd frame has no content checksum (zbak writes one)")
        single = bool(fhd & 0x20)
        fcs = (1 if single else 0, 2, 4, 8)[fhd >> 6]
        rest = (0 if single else 1) + (0, 1, 2, 4)[fhd & 0x03] + fcs
        if rest:
            self._expect(rest, lambda _: self._expect_block())
        else:
            self._expect_block()

    def _expect(self, need: int, parse: Callable[[bytes], None]) -> None:
        self._need, self._parse = need, parse

    def _expect_block(self) -> None:
        self._expect(3, self._block_header)

    def _block_header(self, data: bytes) -> None:
        header = int.from_bytes(data, "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:
            self._fail("not a valid zstd frame (reserved block type)")
        if size > _MAX_BLOCK:
            self._fail(f"not a valid zstd frame (a block of {size} bytes)")
        self._headers.append(self._at)
        self._skip = 1 if kind == 1 else size
        self._after_skip = self._expect_checksum if last else self._expect_block
        if not self._skip:
            self._after_skip()

    def _expect_checksum(self) -> None:
        self._expect(4, self._frame_end)

    def _frame_end(self, _: bytes) -> None:
        self._ended = True
