"""Walking send-stream records: BEGIN records found, payloads skipped by their per-type sizes,
structure checked; and the deep audit's comparison of BEGIN guids with the catalog. Streams
are built here record by record in the zfs_ioctl.h layout (real zfs-fuse streams are walked
in tests/integration/test_audit_records.py)."""

from __future__ import annotations

import datetime as dt
import struct

import pytest
from support.records import walk

from zrepl_py.audit.deep import begin_problems
from zrepl_py.catalog.rows import StreamRow
from zrepl_py.errors import StreamCorrupt
from zrepl_py.objects.manifest import CarriedSnapshot
from zrepl_py.streams.records import (
    DMU_BACKUP_MAGIC,
    DRR_BEGIN,
    DRR_END,
    DRR_FREE,
    DRR_OBJECT,
    DRR_SPILL,
    DRR_WRITE,
    DRR_WRITE_EMBEDDED,
    RECORD_SIZE,
    RecordWalker,
)


def record(kind: int, body: bytes = b"", payloadlen: int = 0, order: str = "<") -> bytes:
    head = struct.pack(order + "II", kind, payloadlen) + body
    return head + bytes(RECORD_SIZE - len(head))


def begin(toguid: int, fromguid: int = 0, name: str = "tank/a@s", hdrtype: int = 1,
          payload: bytes = b"", order: str = "<") -> bytes:
    body = struct.pack(order + "QQQIIQQ256s", DMU_BACKUP_MAGIC, hdrtype | (1 << 2), 1_700_000_000,
                       2, 0, toguid, fromguid, name.encode())
    return record(DRR_BEGIN, body, len(payload), order) + payload


def end(order: str = "<") -> bytes:
    return record(DRR_END, order=order)


def obj(bonuslen: int, raw_bonuslen: int = 0, order: str = "<") -> bytes:
    body = struct.pack(order + "QIIII4xI", 5, 19, 44, 131072, bonuslen, raw_bonuslen)
    payload = raw_bonuslen or (bonuslen + 7) // 8 * 8
    return record(DRR_OBJECT, body, order=order) + b"\xbb" * payload


def write(size: int, compressed: int = 0, order: str = "<") -> bytes:
    body = bytearray(struct.pack(order + "QI4xQQQ", 5, 19, 0, size, 77))
    body += bytes(88 - len(body))
    if compressed:
        body[42] = 15  # drr_compressiontype (record offset 50)
        body[88:96] = struct.pack(order + "Q", compressed)
    return record(DRR_WRITE, bytes(body), order=order) + b"\xcc" * (compressed or size)


def spill(length: int, order: str = "<") -> bytes:
    body = struct.pack(order + "QQQ", 5, length, 77)
    return record(DRR_SPILL, body, order=order) + b"\xdd" * length


def embedded(psize: int, order: str = "<") -> bytes:
    body = struct.pack(order + "QQQQBB6xII", 5, 0, 512, 77, 1, 0, 512, psize)
    return record(DRR_WRITE_EMBEDDED, body, order=order) + b"\xee" * ((psize + 7) // 8 * 8)


def substream(toguid: int, fromguid: int, order: str = "<") -> bytes:
    return (begin(toguid, fromguid, f"tank/a@{toguid}", order=order) + obj(300, order=order)
            + write(4096, order=order) + write(131072, compressed=9000, order=order)
            + spill(512, order=order) + embedded(37, order=order)
            + record(DRR_FREE, order=order) + end(order))


def chunks(data: bytes, size: int):
    return [data[i:i + size] for i in range(0, len(data), size)]


FULL = substream(11, 0)
COMPOUND = begin(0, 0, "tank/a@13", hdrtype=2) + end() + substream(12, 11) + substream(13, 12) + end()


@pytest.mark.parametrize("size", [1, 7, 311, 312, 313, 4096, 1 << 20])
def test_a_full_stream_is_walked_whatever_the_chunk_size(size):
    summary = walk(chunks(FULL, size), "s")
    assert [(b.fromguid, b.toguid, b.toname, b.substream) for b in summary.begins] == [
        (0, 11, "tank/a@11", True)]
    assert summary.records == 8 and summary.bytes == len(FULL) and not summary.compound


def test_a_compound_stream_lists_every_substream_in_order():
    summary = walk(chunks(COMPOUND, 1000), "s")
    assert summary.compound
    assert [(b.fromguid, b.toguid) for b in summary.substreams] == [(11, 12), (12, 13)]
    assert [b.header_type for b in summary.begins] == [2, 1, 1]


def test_a_big_endian_stream_is_read_in_its_own_byte_order():
    summary = walk([substream(11, 0, order=">")], "s")
    assert [(b.fromguid, b.toguid) for b in summary.substreams] == [(0, 11)]


def test_a_begin_payload_is_skipped():
    data = begin(0, 0, "tank/a@13", hdrtype=2, payload=b"\x01" * 1000) + end() + substream(13, 0) + end()
    assert [b.toguid for b in walk([data], "s").substreams] == [13]


@pytest.mark.parametrize("data, words", [
    (b"\x00" * RECORD_SIZE, "magic"),
    (FULL[:-1], "truncated inside a record"),
    (FULL[:-RECORD_SIZE], "no final END"),
    (FULL + b"\x00", "after the stream's final END"),
    (FULL + FULL, "after the stream's final END"),
    (begin(1) + record(42) + end(), "unknown record type 42"),
    (begin(1) + begin(2) + end(), "BEGIN record where none may start"),
    (COMPOUND[:-RECORD_SIZE], "no final END"),
    (begin(0, 0, hdrtype=2) + end() + write(10) + end(), "outside a BEGIN ... END"),
    (begin(1) + record(DRR_WRITE, struct.pack("<QI4xQQ", 5, 19, 0, 1 << 40)) + end(),
     "payload of 1099511627776 bytes"),
])
def test_malformed_streams_are_refused_naming_the_byte(data, words):
    with pytest.raises(StreamCorrupt, match="not a valid zfs send stream at byte") as info:
        walk(chunks(data, 500), "stream 7")
    assert words in str(info.value) and "stream 7" in str(info.value)


def test_the_walker_keeps_no_payload_in_memory():
    walker = RecordWalker("s")
    walker.feed(begin(1) + record(DRR_WRITE, struct.pack("<QI4xQQ", 5, 19, 0, 1 << 23)))
    for _ in range(8):
        walker.feed(b"\0" * (1 << 20))
    walker.feed(end())
    assert walker.finish().bytes == 3 * RECORD_SIZE + (1 << 23)
    assert len(walker._pending) == 0


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def stream_row(kind: str, to: int, frm: int | None) -> StreamRow:
    return StreamRow(1, "local", "tank/a", "cold", kind, None if frm is None else 9, frm, to,
                     None if frm is None else "f", "t", 100, 1, 1, "p/", "STANDARD", "zstd",
                     "uploaded", T0, T0, None)


def carried(*guids: int) -> list[CarriedSnapshot]:
    return [CarriedSnapshot(f"s{g}", g, g) for g in guids]


@pytest.mark.parametrize("data, row, snaps, words", [
    (FULL, stream_row("full", 11, None), carried(11), []),
    (COMPOUND, stream_row("incremental", 13, 11), carried(12, 13), []),
    (COMPOUND, stream_row("incremental", 13, 11), [], []),
    (FULL, stream_row("incremental", 11, 10), carried(11), ["first BEGIN record starts at guid 0"]),
    (FULL, stream_row("full", 12, None), carried(12),
     ["last BEGIN record ends at guid 11", "carries snapshots with guids [11], the catalog records [12]"]),
    (COMPOUND, stream_row("incremental", 13, 11), carried(12, 14, 13),
     ["carries snapshots with guids [12, 13], the catalog records [12, 13, 14]"]),
    (begin(0, 0, hdrtype=2) + end() + substream(12, 11) + substream(13, 99) + end(),
     stream_row("incremental", 13, 11), [], ["starts at guid 99, not at the previous substream's 12"]),
])
def test_begin_records_are_compared_with_the_catalogs_guids(data, row, snaps, words):
    found = begin_problems(walk([data], "s"), row, snaps)
    assert len(found) == len(words)
    for problem, word in zip(found, words, strict=True):
        assert word in problem
