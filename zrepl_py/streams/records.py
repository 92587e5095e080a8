"""Walk the records of a raw ``zfs send`` stream and report its BEGIN records (pure).

A send stream is a sequence of ``dmu_replay_record_t`` headers (312 bytes each), some followed
by a payload whose length depends on the record type. Layout from OpenZFS
``include/sys/zfs_ioctl.h`` (unchanged in its leading fields since the Solaris format that
zfs-fuse, pool v23, writes; checked against ``zstream dump``/``zstreamdump`` on real streams
of both):

* header: ``drr_type`` (uint32: BEGIN=0, OBJECT=1, FREEOBJECTS=2, WRITE=3, FREE=4, END=5,
  WRITE_BYREF=6, SPILL=7, WRITE_EMBEDDED=8, OBJECT_RANGE=9, REDACT=10), ``drr_payloadlen``
  (uint32), then the type's struct in a union padded to 304 bytes;
* ``drr_begin``: ``drr_magic`` (0x2F5BACBAC, ``DMU_BACKUP_MAGIC``; read byte-swapped, the
  whole stream is in the other byte order), ``drr_versioninfo`` (bits 0-1 header type:
  1 substream, 2 compound; bits 2-31 feature flags), ``drr_creation_time``, ``drr_type``
  (objset type), ``drr_flags``, ``drr_toguid``, ``drr_fromguid`` (0 for a full),
  ``drr_toname`` (256 bytes, NUL-terminated);
* payload bytes after a record (what ``zstream dump`` and ``receive_read_record`` read):
  BEGIN ``drr_payloadlen`` (a packed nvlist, compound headers and raw sends); OBJECT
  ``drr_raw_bonuslen`` or else ``drr_bonuslen`` rounded up to 8; WRITE ``drr_compressed_size``
  when ``drr_compressiontype`` is set, else ``drr_logical_size``; SPILL ``drr_compressed_size``
  or else ``drr_length``; WRITE_EMBEDDED ``drr_psize`` rounded up to 8; the others none.

Raw streams (``zfs send -w`` of an encrypted dataset, docs/reliability.md#r38-encrypted-datasets;
checked against OpenZFS ``module/zfs/dmu_send.c`` ``dump_write`` and on real OpenZFS 2.3 streams):
every substream's BEGIN carries ``DMU_BACKUP_FEATURE_RAW`` (1 << 24 of the feature flags; the
compound header of ``-I`` carries no features) and a payload (an nvlist with the wrapped key
material, never the key itself); OBJECT_RANGE records (salt, IV and MAC of a range of dnode
blocks) have no payload; a WRITE's ``drr_compressiontype`` is the block's own
(``BP_GET_COMPRESS``, ZIO_COMPRESS_OFF = 2 for an uncompressed block, never 0), so its
payload is ``drr_compressed_size`` (the block's encrypted physical size) like a ``-c``
WRITE; OBJECT payloads are ``drr_raw_bonuslen``. All substreams of one stream are raw or
none is (libzfs sends them with the same flags); a mix is reported as corrupt.

What ``zfs send`` writes (libzfs ``zfs_send``): a plain full or ``-i`` stream is one
substream, BEGIN ... END. ``-I`` and ``-R`` write a compound stream: a BEGIN with header
type 2 (toguid 0), its END, then one substream per snapshot in createtxg order (each
BEGIN's fromguid is the previous substream's toguid), then a final END.

The walker checks the structure (magic, known record types, BEGIN/END nesting, nothing
after the final END, no truncation) but not the fletcher-4 checksums: ``zfs receive``
checks those, and the volumes' SHA-256 and zstd checksums already cover the bytes.
"""

from __future__ import annotations

import dataclasses
import struct

from zrepl_py.errors import StreamCorrupt

DMU_BACKUP_MAGIC = 0x2F5BACBAC
RECORD_SIZE = 312  # sizeof (dmu_replay_record_t)
MAXNAMELEN = 256

DRR_BEGIN, DRR_OBJECT, DRR_FREEOBJECTS, DRR_WRITE, DRR_FREE, DRR_END = range(6)
DRR_WRITE_BYREF, DRR_SPILL, DRR_WRITE_EMBEDDED, DRR_OBJECT_RANGE, DRR_REDACT = range(6, 11)
DRR_NUMTYPES = 11
DMU_SUBSTREAM, DMU_COMPOUNDSTREAM = 1, 2
DMU_BACKUP_FEATURE_RAW = 1 << 24  # of BeginRecord.features (zfs_ioctl.h)

# A record's payload is at most one block: SPA_MAXBLOCKSIZE (16 MiB, include/sys/spa.h).
# A larger length means the header is damaged; stop instead of skipping gigabytes.
MAX_PAYLOAD = 1 << 24
# BEGIN payloads are nvlists (a -R header lists every dataset and snapshot); allow more.
MAX_BEGIN_PAYLOAD = 1 << 28

_BEGIN = "8xQQQIIQQ256s"  # after drr_type/drr_payloadlen: magic .. toname


@dataclasses.dataclass(frozen=True)
class BeginRecord:
    """One BEGIN record.

    Attributes:
        offset: its byte offset in the raw stream.
        header_type: 1 (substream: one snapshot's data) or 2 (compound header).
        features: the feature flags (``DMU_BACKUP_FEATURE_*``).
        creation_time: the to-snapshot's creation, Unix seconds.
        toguid: the snapshot the substream brings the receiver to (0 in a compound header).
        fromguid: the snapshot it applies on (0 for a full).
        toname: ``DATASET@SNAP`` as the sender named it.
    """

    offset: int
    header_type: int
    features: int
    creation_time: int
    toguid: int
    fromguid: int
    toname: str

    @property
    def substream(self) -> bool:
        """True for a substream's BEGIN (not a compound header)."""
        return self.header_type == DMU_SUBSTREAM

    @property
    def raw(self) -> bool:
        """True when the substream is a raw send (``DMU_BACKUP_FEATURE_RAW``)."""
        return bool(self.features & DMU_BACKUP_FEATURE_RAW)


@dataclasses.dataclass(frozen=True)
class StreamSummary:
    """What walking a whole stream found.

    Attributes:
        begins: every BEGIN record, in stream order (compound header included).
        records: how many records (headers) the stream holds.
        bytes: its length in bytes.
        compound: True when it starts with a compound header (``-I``, ``-R``).
    """

    begins: tuple[BeginRecord, ...]
    records: int
    bytes: int
    compound: bool

    @property
    def substreams(self) -> tuple[BeginRecord, ...]:
        """The substreams' BEGIN records, in order (one per snapshot carried)."""
        return tuple(b for b in self.begins if b.substream)

    @property
    def raw(self) -> bool:
        """True for a raw stream (``zfs send -w``): its substreams carry the RAW feature
        (the walker refused a stream whose substreams disagree)."""
        return any(b.raw for b in self.substreams)


class RecordWalker:
    """Feed a raw stream in chunks of any size (``feed``), then call ``finish``.

    Memory stays at one record header whatever the stream size: payloads are skipped by
    counting. ``what`` names the stream in error messages.

    Raises (from ``feed`` and ``finish``):
        StreamCorrupt: bad magic, an unknown record type, BEGIN/END out of order, an
            impossible payload length, bytes after the final END, or a truncated stream.
    """

    def __init__(self, what: str):
        self._what = what
        self._pending = bytearray()
        self._skip = 0
        self._offset = 0  # bytes consumed so far
        self._records = 0
        self._order = ""  # struct byte-order prefix, known after the first record
        self._begins: list[BeginRecord] = []
        self._compound = False
        self._raw: bool | None = None  # whether the substreams so far are raw
        # "start", "header" (in a compound header), "between" (between substreams),
        # "sub" (inside a substream), "done"
        self._state = "start"

    def feed(self, data: bytes) -> None:
        """Consume the next ``data`` bytes of the stream."""
        view = memoryview(data)
        size = len(view)
        pos = 0
        while pos < size:
            if self._skip:
                step = min(self._skip, size - pos)
                self._skip -= step
                pos += step
                self._offset += step
                continue
            if self._state == "done":
                raise self._corrupt(f"{size - pos} byte(s) after the stream's final END record")
            if not self._pending and size - pos >= RECORD_SIZE:
                self._record(view[pos:pos + RECORD_SIZE])
                pos += RECORD_SIZE
                continue
            step = min(RECORD_SIZE - len(self._pending), size - pos)
            self._pending += view[pos:pos + step]
            pos += step
            if len(self._pending) == RECORD_SIZE:
                record = bytes(self._pending)
                self._pending.clear()
                self._record(memoryview(record))

    def finish(self) -> StreamSummary:
        """Check the stream ended where it should and return what it held."""
        if self._skip or self._pending:
            raise self._corrupt("the stream is truncated inside a record")
        if self._state != "done":
            raise self._corrupt("the stream is truncated: no final END record")
        return StreamSummary(tuple(self._begins), self._records, self._offset, self._compound)

    def _corrupt(self, why: str) -> StreamCorrupt:
        return StreamCorrupt(f"{self._what}: not a valid zfs send stream at byte"
                             f" {self._offset}: {why}")

    def _record(self, rec: memoryview) -> None:
        offset = self._offset
        self._offset += RECORD_SIZE
        self._records += 1
        if not self._order:
            self._order = self._byte_order(rec)
        order = self._order
        kind, payloadlen = struct.unpack_from(order + "II", rec, 0)
        if kind >= DRR_NUMTYPES:
            self._offset = offset
            raise self._corrupt(f"unknown record type {kind}")
        state = self._state
        if kind == DRR_BEGIN:
            begin = self._begin(rec, offset)
            if state == "start":
                self._compound = begin.header_type == DMU_COMPOUNDSTREAM
                self._state = "header" if self._compound else "sub"
            elif state == "between" and begin.substream:
                self._state = "sub"
            else:
                self._offset = offset
                raise self._corrupt("a BEGIN record where none may start")
            if payloadlen > MAX_BEGIN_PAYLOAD:
                raise self._corrupt(f"BEGIN payload of {payloadlen} bytes")
            if begin.substream:
                if self._raw is not None and self._raw != begin.raw:
                    self._offset = offset
                    raise self._corrupt(f"substream {begin.toname} is"
                                        f" {'' if begin.raw else 'not '}raw but the one before"
                                        f" it is {'' if self._raw else 'not '}raw")
                self._raw = begin.raw
            self._begins.append(begin)
            self._skip = payloadlen
            return
        if state in ("start", "between") and kind != DRR_END:
            self._offset = offset
            raise self._corrupt(f"record type {kind} outside a BEGIN ... END substream")
        if kind == DRR_END:
            if state == "start":
                self._offset = offset
                raise self._corrupt("an END record before any BEGIN")
            if state in ("header", "sub"):
                self._state = "between" if self._compound else "done"
            else:  # "between": the compound stream's final END
                self._state = "done"
            return
        self._skip = self._payload(kind, rec, order)
        if self._skip > MAX_PAYLOAD:
            raise self._corrupt(f"record type {kind} announces a payload of {self._skip} bytes")

    def _byte_order(self, rec: memoryview) -> str:
        (magic,) = struct.unpack_from("<Q", rec, 8)
        if magic == DMU_BACKUP_MAGIC:
            return "<"
        (magic,) = struct.unpack_from(">Q", rec, 8)
        if magic == DMU_BACKUP_MAGIC:
            return ">"
        raise self._corrupt("no BEGIN record with the send-stream magic 0x2f5bacbac at the start")

    def _begin(self, rec: memoryview, offset: int) -> BeginRecord:
        magic, versioninfo, creation, _objset, _flags, toguid, fromguid, name = struct.unpack_from(
            self._order + _BEGIN, rec, 0)
        if magic != DMU_BACKUP_MAGIC:
            self._offset = offset
            raise self._corrupt("a BEGIN record without the send-stream magic")
        header_type = versioninfo & 0x3
        if header_type not in (DMU_SUBSTREAM, DMU_COMPOUNDSTREAM):
            self._offset = offset
            raise self._corrupt(f"BEGIN record of unknown header type {header_type}")
        toname = name.split(b"\0", 1)[0].decode("utf-8", "replace")
        return BeginRecord(offset, header_type, (versioninfo >> 2) & 0x3FFFFFFF, creation,
                           toguid, fromguid, toname)

    @staticmethod
    def _payload(kind: int, rec: memoryview, order: str) -> int:
        """Payload bytes after a non-BEGIN record (see the module docstring). Offsets are
        from the record's start: 8 (``drr_type``, ``drr_payloadlen``) plus the field's
        offset in its struct of zfs_ioctl.h, e.g. ``drr_write.drr_compressed_size`` at 88
        (after a 40-byte ``ddt_key_t``) -> 96."""
        # struct.unpack_from returns tuple[Any, ...]: the declared ints type what it unpacks.
        bonuslen: int
        raw_bonuslen: int
        size: int
        length: int
        if kind == DRR_OBJECT:
            bonuslen, raw_bonuslen = struct.unpack_from(order + "I4xI", rec, 28)
            return raw_bonuslen or (bonuslen + 7) & ~7
        if kind == DRR_WRITE:
            if rec[50]:  # drr_compressiontype
                (size,) = struct.unpack_from(order + "Q", rec, 96)  # drr_compressed_size
                return size
            (size,) = struct.unpack_from(order + "Q", rec, 32)  # drr_logical_size
            return size
        if kind == DRR_SPILL:
            (length,) = struct.unpack_from(order + "Q", rec, 16)
            (size,) = struct.unpack_from(order + "Q", rec, 40)  # drr_compressed_size
            return size or length
        if kind == DRR_WRITE_EMBEDDED:
            (size,) = struct.unpack_from(order + "I", rec, 52)  # drr_psize
            return (size + 7) & ~7
        return 0
