"""zstd volume frames (zrepl_py/streams/frames.py): compression in a helper thread, the
structural frame walk used by restore's verify pass, and the decoder that holds back a
frame's last piece until the frame end is proven."""

from __future__ import annotations

import hashlib
import os
import random

import blake3
import pytest
import zstandard

from zrepl_py.errors import StreamCorrupt
from zrepl_py.streams.frames import Digest, FrameWalk, compress_frame, decompress_frame

MIB = 1 << 20


def text(size: int) -> bytes:
    rng = random.Random(size)
    words = [bytes(rng.choices(b"abcdefghij", k=rng.randint(2, 9))) for _ in range(500)]
    return b" ".join(rng.choices(words, k=size // 4))[:size]


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def walk(data: bytes, size: int) -> None:
    check = FrameWalk("vol")
    for piece in chunks(data, size):
        check.feed(piece)
    check.end()


def frames_of(raw: bytes) -> list[bytes]:
    """The same content framed by the writers zbak has used and zstd's other shapes."""
    ours = b"".join(compress_frame(chunks(raw, 65536), 3, Digest()))
    return [
        ours,
        zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw),  # content size
        zstandard.ZstdCompressor(level=3, write_checksum=True, threads=1).compress(raw),
        zstandard.ZstdCompressor(level=1, write_checksum=True, write_content_size=False,
                                 write_dict_id=True).compress(raw),
    ]


SAMPLES = [b"", b"x", b"a" * MIB, os.urandom(300_000), os.urandom(MIB // 2) + text(MIB)]


@pytest.mark.parametrize("raw", SAMPLES, ids=["empty", "1-byte", "rle", "random", "mixed"])
def test_the_frame_walk_accepts_a_whole_frame_however_its_bytes_are_chunked(raw):
    for frame in frames_of(raw):
        for size in (1, 3, 4096, MIB):
            if size == 1 and len(frame) > 50_000:
                continue
            walk(frame, size)
        assert b"".join(decompress_frame(chunks(frame, 4096), "vol", raw_bytes=len(raw))) == raw


def test_the_frame_walk_rejects_a_frame_cut_anywhere_or_followed_by_any_byte():
    frame = frames_of(os.urandom(300_000) + text(200_000))[0]
    cuts = set(range(0, len(frame), 509)) | set(range(1, 20)) | set(range(len(frame) - 20, len(frame)))
    for cut in sorted(cuts):
        with pytest.raises(StreamCorrupt, match="truncated|not a zstd frame"):
            walk(frame[:cut], 4096)
    for extra in (b"\0", frame[:4], frame):
        with pytest.raises(StreamCorrupt, match="bytes after the end"):
            walk(frame + extra, 4096)


def test_the_frame_walk_rejects_a_bad_magic_a_reserved_block_and_a_frame_without_checksum():
    frame = frames_of(text(10_000))[0]
    with pytest.raises(StreamCorrupt, match="bad magic"):
        walk(b"\0" + frame[1:], 4096)
    no_checksum = zstandard.ZstdCompressor(level=3).compress(b"hello")
    with pytest.raises(StreamCorrupt, match="no content checksum"):
        walk(no_checksum, 4096)
    # The first block header follows the 4-byte magic and the header (descriptor + window
    # byte here: no content size, no dictionary id); block type 3 is reserved.
    damaged = bytearray(frame)
    assert damaged[4] & 0x20 == 0 and damaged[4] & 0xC3 == 0
    damaged[6] |= 0b110
    with pytest.raises(StreamCorrupt, match="reserved block type"):
        walk(bytes(damaged), 4096)


@pytest.mark.parametrize("damage", ["checksum", "raw size"])
def test_decoding_never_releases_the_last_piece_of_a_frame_that_fails_its_end_checks(damage):
    raw = text(3 * MIB)
    frame = bytearray(frames_of(raw)[0])
    expect = len(raw)
    if damage == "checksum":
        frame[-1] ^= 0x01
    else:
        expect += 1
    released = bytearray()
    with pytest.raises(StreamCorrupt):
        for piece in decompress_frame(chunks(bytes(frame), 64 * 1024), "vol", raw_bytes=expect):
            released += piece
    assert len(released) < len(raw) and raw.startswith(released)


@pytest.mark.parametrize("frame_of", ["ours", "one shot"])
def test_a_frame_of_zeros_decodes_in_bounded_pieces(frame_of):
    """A zero-filled region (a VM image on a dataset without compression) is a run of RLE
    blocks, 128 KiB from 4 stored bytes: 1 GiB of zeros is 32 KiB stored. Decoded in one
    call per stored chunk it came out as one 1 GiB piece (and the restore held it twice);
    each call now takes at most BLOCKS_PER_CALL blocks."""
    raw_size = 1024 * MIB
    zeros = bytes(MIB)
    if frame_of == "ours":
        frame = b"".join(compress_frame((zeros for _ in range(1024)), 3, Digest()))
    else:
        cobj = zstandard.ZstdCompressor(level=3, write_checksum=True).compressobj()
        frame = b"".join([*(cobj.compress(zeros) for _ in range(1024)), cobj.flush()])
    assert len(frame) < MIB, "one stored chunk holds the whole GiB"
    digest = Digest()
    sizes = [len(piece) for piece in decompress_frame([frame], "vol", digest,
                                                      raw_bytes=raw_size)]
    assert sum(sizes) == raw_size and max(sizes) <= 16 * MIB
    assert digest.raw_hash == blake3.blake3(bytes(raw_size)).hexdigest()
    with pytest.raises(StreamCorrupt, match="truncated"):
        for _ in decompress_frame([frame[:-1]], "vol"):
            pass
    with pytest.raises(StreamCorrupt, match="after the end"):
        for _ in decompress_frame([frame + b"\0"], "vol"):
            pass


def test_compressing_fills_the_digest_and_can_leave_hashing_the_frame_to_the_store():
    raw = os.urandom(MIB) + text(2 * MIB)
    full, counted = Digest(), Digest(hash_stored=False)
    frame = b"".join(compress_frame(chunks(raw, MIB), 3, full))
    again = b"".join(compress_frame(chunks(raw, MIB), 3, counted))
    assert frame == again  # single-thread zstd: the same bytes for the same input and level
    assert zstandard.ZstdDecompressor().decompress(frame, max_output_size=len(raw)) == raw
    assert (full.raw_bytes, full.raw_hash) == (len(raw), blake3.blake3(raw).hexdigest())
    assert (full.stored_bytes, full.sha256) == (len(frame), hashlib.sha256(frame).hexdigest())
    assert counted.stored_bytes == len(frame) and counted.raw_hash == full.raw_hash
    with pytest.raises(ValueError):
        _ = counted.sha256  # a property: reading it raises


def test_compressing_stops_at_once_when_the_consumer_or_the_source_fails():
    raw = text(4 * MIB)
    frames = compress_frame(chunks(raw, 256 * 1024), 3, Digest())
    next(frames)
    frames.close()  # a failed upload: the helper thread is joined, nothing hangs

    def source():
        yield raw[:MIB]
        yield raw[MIB:2 * MIB]
        raise OSError("send died")

    with pytest.raises(OSError, match="send died"):
        for _ in compress_frame(source(), 3, Digest()):
            pass
