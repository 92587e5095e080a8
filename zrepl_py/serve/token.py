"""Read ``toname`` and ``toguid`` out of a receive resume token, without running zfs.

``zfs send -t TOKEN`` sends the snapshot the token names, so ``zbak serve`` must know which
one before it allows the command. A token is ``VERSION-CHECKSUM-LENGTH-HEX`` (libzfs
``zfs_send_resume_token_to_nvlist``): HEX is a zlib-compressed packed nvlist of LENGTH bytes,
CHECKSUM the first word of its fletcher-4 checksum (the plain 64-bit sum of the compressed
bytes read as 32-bit words; a trailing partial word is ignored). Checked against the real
OpenZFS 2.3.2 tokens in ``tests/data/resume``.

The nvlist is packed NV_ENCODE_NATIVE (header byte 0 is 0; byte 1 is 1 for little-endian):
after the 4-byte header come ``nvl_version`` and ``nvl_nvflag`` (int32 each), then pairs,
each ``nvp_size`` (int32), ``nvp_name_sz`` (int16), reserved (int16), ``nvp_value_elem``
(int32), ``nvp_type`` (int32), the NUL-terminated name padded to 8 bytes, then the value;
a pair of size 0 ends the list (libnvpair ``nvs_native``). Only ``toname`` (type 9, string)
and ``toguid`` (type 8, uint64) are read; a token with a name twice, an unknown encoding or
bytes that do not add up is refused, so zbak and zfs cannot read different names.

Which snapshot is really sent is decided by ``toguid``: libzfs ``guid_to_name`` searches the
subtree of toname's dataset first, then ever larger ancestors (libzfs_sendrecv.c). The caller
therefore also checks that a snapshot with ``toguid`` exists below toname's dataset
(``execute.check_token_guid``); then zfs finds it there before looking any higher.
"""

from __future__ import annotations

import binascii
import dataclasses
import struct
import zlib

from zrepl_py.errors import CommandRefused, InvalidName
from zrepl_py.zfs.names import SnapshotName
from zrepl_py.zfs.resume import TOKEN_PATTERN

_TYPE_UINT64 = 8
_TYPE_STRING = 9
_MAX_PACKED = 1 << 20  # bytes; a real token's nvlist is a few hundred


@dataclasses.dataclass(frozen=True)
class TokenTarget:
    """What a resume token sends: the snapshot name and guid it was made for."""

    toname: SnapshotName
    toguid: int


def _fletcher4_first_word(data: bytes) -> int:
    words = len(data) // 4
    total: int = sum(struct.unpack(f"<{words}I", data[: words * 4]))
    return total % (1 << 64)


def read_token(token: str) -> TokenTarget:
    """Return the ``toname`` and ``toguid`` a resume token carries.

    Raises:
        CommandRefused: not a token, wrong checksum or length, not a native nvlist, a name
            twice, no valid ``toname``/``toguid``.
    """
    if not isinstance(token, str) or not TOKEN_PATTERN.fullmatch(token):
        raise CommandRefused("not a resume token (VERSION-CHECKSUM-LENGTH-HEX)")
    version, checksum, length, hexdata = token.split("-")
    if version != "1" or len(hexdata) % 2:
        raise CommandRefused(f"resume token version {version} or encoding not understood")
    compressed = binascii.unhexlify(hexdata)
    if _fletcher4_first_word(compressed) != int(checksum, 16):
        raise CommandRefused("resume token checksum does not match its contents")
    expected = int(length, 16)
    if expected > _MAX_PACKED:
        raise CommandRefused("resume token too large")
    try:
        packed = zlib.decompressobj().decompress(compressed, _MAX_PACKED + 1)
    except zlib.error as exc:
        raise CommandRefused(f"resume token does not decompress: {exc}") from None
    if len(packed) != expected:
        raise CommandRefused("resume token length does not match its contents")
    values = _native_nvlist(packed)
    toname, toguid = values.get("toname"), values.get("toguid")
    if not isinstance(toname, str) or not isinstance(toguid, int):
        raise CommandRefused("resume token without toname/toguid")
    try:
        return TokenTarget(SnapshotName(toname), toguid)
    except InvalidName as exc:
        raise CommandRefused(f"resume token toname: {exc}") from None


def make_token(fields: list[tuple[str, str | int]]) -> str:
    """Build a token in the layout ``read_token`` reads (the inverse, for tests and tools).

    Args:
        fields: ``(name, value)`` pairs in order: a str is packed as a string, an int as a
            uint64; names may repeat (to build malformed tokens).

    Returns:
        ``1-CHECKSUM-LENGTH-HEX`` with a correct checksum and length.
    """
    body = bytearray(struct.pack("<BBxxiI", 0, 1, 0, 1))
    for name, value in fields:
        raw_name = name.encode("ascii") + b"\x00"
        padded = raw_name + b"\x00" * (-len(raw_name) % 8)
        if isinstance(value, str):
            data, kind = value.encode("ascii") + b"\x00", _TYPE_STRING
        else:
            data, kind = struct.pack("<Q", value), _TYPE_UINT64
        data += b"\x00" * (-len(data) % 8)
        size = 16 + len(padded) + len(data)
        body += struct.pack("<ihhii", size, len(raw_name), 0, 1, kind) + padded + data
    body += b"\x00" * 8
    compressed = zlib.compress(bytes(body))
    checksum = _fletcher4_first_word(compressed)
    return f"1-{checksum:x}-{len(body):x}-{compressed.hex()}"


def _native_nvlist(packed: bytes) -> dict[str, str | int | None]:
    if len(packed) < 12 or packed[0] != 0 or packed[1] not in (0, 1):
        raise CommandRefused("resume token is not a native packed nvlist")
    order = "<" if packed[1] == 1 else ">"
    found: dict[str, str | int | None] = {}
    offset = 12
    while True:
        if offset + 4 > len(packed):
            raise CommandRefused("resume token nvlist is truncated")
        (size,) = struct.unpack_from(order + "i", packed, offset)
        if size == 0:
            if any(packed[offset:]):
                raise CommandRefused("resume token nvlist has bytes after its end")
            return found
        if size < 16 or offset + size > len(packed):
            raise CommandRefused("resume token nvlist pair has a bad size")
        name_sz, _reserved, _elements, kind = struct.unpack_from(order + "hhii", packed, offset + 4)
        name_end = offset + 16 + name_sz
        if name_sz < 1 or name_end > offset + size or packed[name_end - 1] != 0:
            raise CommandRefused("resume token nvlist pair has a bad name")
        name = packed[offset + 16:name_end - 1].decode("ascii", "replace")
        if name in found:
            raise CommandRefused(f"resume token names {name!r} twice")
        value_at = offset + 16 + ((name_sz + 7) & ~7)
        body = packed[value_at:offset + size]
        value: str | int | None = None
        if kind == _TYPE_STRING:
            end = body.find(b"\x00")
            if end < 0:
                raise CommandRefused(f"resume token string {name!r} is not terminated")
            try:
                value = body[:end].decode("ascii")
            except UnicodeDecodeError:
                raise CommandRefused(f"resume token string {name!r} is not ASCII") from None
        elif kind == _TYPE_UINT64:
            if len(body) < 8:
                raise CommandRefused(f"resume token number {name!r} is truncated")
            (value,) = struct.unpack_from(order + "Q", body)
        found[name] = value
        offset += size
