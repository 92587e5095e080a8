"""The stream manifest: a JSON object stored next to a stream's volumes (STANDARD class).

It is written after the last volume is durable and before the catalog row
(docs/design.md#archive-writer-order), and holds everything needed to rebuild
the catalog without it (``zbak catalog rebuild``). Guids are written as decimal strings: JSON
readers other than Python's lose precision on integers above 2**53.

Format ``zbak-stream/2`` (written since sealed cold storage; docs/design.md#stream-manifest)::

    {"format": "zbak-stream/2", "host": "local", "dataset": "tank/data",
     "kind": "full" | "incremental",
     "from": null | {"name": "a", "guid": "123", "createtxg": 5},
     "to": {"name": "b", "guid": "456", "createtxg": 9},
     "snapshots": [{"name": ..., "guid": ..., "createtxg": ...}, ...],   # carried, txg order
     "raw_bytes": 123, "stored_bytes": 45,
     "volumes": [{"index": 0, "key": "...", "raw_bytes": 1, "stored_bytes": 1,
                  "sha256": "<hex>"}, ...],
     "codec": ["zstd"] | ["zstd", "age"], "compression_level": 3,
     "send_flags": ["-I"], "raw": false,
     "storage_class": "GLACIER", "tool": "zbak 0.1.0", "created_at": "2026-01-01T00:00:00Z",
     "sha256": "<hex>"}

Metadata only: the ``sha256`` of a volume is that of its stored bytes (ciphertext in a sealed
store); no hash of the raw stream is in it (docs/sealed.md). ``codec`` is the codec chain's
steps in order (``streams.codec``). Format ``zbak-stream/1`` is still read: it has
``"compression": "zstd"`` instead of ``codec`` and a ``raw_sha256`` per volume, which the
reader checks for shape and drops.

``sha256`` is the SHA-256 of all the other fields as canonical JSON (``objects.checked``), so
a changed byte is caught even where the JSON still parses; the writer stores the manifest
twice (``manifest.json``, then ``manifest.json.copy``) and readers fall back to the copy
(docs/reliability.md#r26-catalog-metadata-copy-with-checksum). Manifests written before the checksum
existed have no ``sha256``: they are checked by their structure only, and any key outside the format
is refused.

``raw`` (added for docs/reliability.md#r38-encrypted-datasets; manifests written before it have
none and read as ``"-w" in send_flags``) says the stream is a raw send (``zfs send -w``) of an
encrypted dataset: its blocks are stored as encrypted on disk, the key is in no stream, and a
restore creates the dataset encrypted with its key unloaded (``zfs load-key`` it). It always equals
``"-w" in send_flags``; a manifest where they differ is refused.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from typing import Any

from zrepl_py.errors import StreamCorrupt
from zrepl_py.objects.checked import canonical_sha256

FORMAT = "zbak-stream/2"
FORMAT_1 = "zbak-stream/1"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_COMMON = frozenset({"format", "host", "dataset", "kind", "from", "to", "snapshots", "raw_bytes",
                     "stored_bytes", "volumes", "compression_level", "send_flags",
                     "storage_class", "tool", "created_at", "sha256", "raw"})
_FIELDS = {FORMAT: _COMMON | {"codec"}, FORMAT_1: _COMMON | {"compression"}}
_VOLUME_FIELDS = {FORMAT: frozenset({"index", "key", "raw_bytes", "stored_bytes", "sha256"}),
                  FORMAT_1: frozenset({"index", "key", "raw_bytes", "stored_bytes", "sha256",
                                       "raw_sha256"})}


@dataclasses.dataclass(frozen=True)
class CarriedSnapshot:
    """A snapshot a stream carries (``name`` after ``@``, guid 0 .. 2**64-1, createtxg)."""

    name: str
    guid: int
    createtxg: int


@dataclasses.dataclass(frozen=True)
class VolumeRecord:
    """One volume: ``index``, ``key``, sizes in bytes (raw: what zfs send wrote; stored: the
    object), SHA-256 (hex) of the stored bytes."""

    index: int
    key: str
    raw_bytes: int
    stored_bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A stream as its manifest describes it (see the module docstring for the JSON)."""

    host: str
    dataset: str
    kind: str
    from_snap: CarriedSnapshot | None
    to_snap: CarriedSnapshot
    snapshots: tuple[CarriedSnapshot, ...]
    volumes: tuple[VolumeRecord, ...]
    compression: str
    """The codec chain's name (``streams.codec``: ``zstd``, ``zstd+age``), as the catalog's
    ``compression`` column records it."""
    compression_level: int
    send_flags: tuple[str, ...]
    storage_class: str
    tool: str
    created_at: dt.datetime

    @property
    def raw(self) -> bool:
        """True for a raw send (``-w`` among ``send_flags``): an encrypted dataset's blocks,
        still encrypted; restoring it needs the dataset's key (zfs-send(8) ``-w``)."""
        return "-w" in self.send_flags

    @property
    def raw_bytes(self) -> int:
        """Uncompressed stream size, bytes."""
        return sum(v.raw_bytes for v in self.volumes)

    @property
    def stored_bytes(self) -> int:
        """Stored size of all volumes, bytes."""
        return sum(v.stored_bytes for v in self.volumes)

    def to_json(self) -> bytes:
        """Serialize to UTF-8 JSON (stable key order)."""
        data = {
            "format": FORMAT,
            "host": self.host,
            "dataset": self.dataset,
            "kind": self.kind,
            "from": _snap_out(self.from_snap),
            "to": _snap_out(self.to_snap),
            "snapshots": [_snap_out(s) for s in self.snapshots],
            "raw_bytes": self.raw_bytes,
            "stored_bytes": self.stored_bytes,
            "volumes": [dataclasses.asdict(v) for v in self.volumes],
            "codec": self.compression.split("+"),
            "compression_level": self.compression_level,
            "send_flags": list(self.send_flags),
            "raw": self.raw,
            "storage_class": self.storage_class,
            "tool": self.tool,
            "created_at": self.created_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        data["sha256"] = canonical_sha256(data)
        return json.dumps(data, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        """Parse and check a manifest read from ``where`` (store and key, for messages).

        Raises:
            StreamCorrupt: not JSON, a checksum that does not match, another format, unknown,
                missing or ill-typed fields, sizes that do not add up, volumes out of order.
        """
        try:
            obj = json.loads(data)
            if not isinstance(obj, dict):
                raise TypeError("not a JSON object")
            if "sha256" in obj:
                recorded = obj.pop("sha256")
                if recorded != canonical_sha256(obj):
                    raise ValueError("its content does not match its sha256 (changed bytes)")
            form = obj.get("format")
            if form not in _FIELDS:
                raise ValueError(f"format {form!r}, expected {FORMAT!r} or {FORMAT_1!r}")
            unknown = set(obj) - _FIELDS[form]
            if unknown:
                raise ValueError(f"unknown field(s) {sorted(unknown)}")
            volumes = tuple(_volume_in(v, form) for v in obj["volumes"])
            codec = (_str(obj["compression"]) if form == FORMAT_1
                     else "+".join(_str(step) for step in obj["codec"]))
            manifest = cls(
                host=_str(obj["host"]),
                dataset=_str(obj["dataset"]),
                kind=_kind(obj["kind"]),
                from_snap=None if obj["from"] is None else _snap_in(obj["from"]),
                to_snap=_snap_in(obj["to"]),
                snapshots=tuple(_snap_in(s) for s in obj["snapshots"]),
                volumes=volumes,
                compression=codec,
                compression_level=int(obj["compression_level"]),
                send_flags=tuple(_str(f) for f in obj["send_flags"]),
                storage_class=_str(obj["storage_class"]),
                tool=_str(obj["tool"]),
                created_at=dt.datetime.strptime(obj["created_at"], "%Y-%m-%dT%H:%M:%SZ").replace(
                    tzinfo=dt.UTC),
            )
            if [v.index for v in volumes] != list(range(len(volumes))) or not volumes:
                raise ValueError("volumes must be numbered 0, 1, ... and not empty")
            if "raw" in obj and obj["raw"] is not manifest.raw:
                raise ValueError(f"raw is {obj['raw']!r} but send_flags {list(manifest.send_flags)}"
                                 f" {'include' if manifest.raw else 'lack'} -w")
            if obj["raw_bytes"] != manifest.raw_bytes or obj["stored_bytes"] != manifest.stored_bytes:
                raise ValueError("stream sizes differ from the sum of the volume sizes")
            if (manifest.kind == "full") != (manifest.from_snap is None):
                raise ValueError("a full has no from-snapshot and an incremental has one")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise StreamCorrupt(f"manifest {where} is not a valid zbak-stream manifest: {exc}"
                                ) from None
        return manifest


def _snap_out(snap: CarriedSnapshot | None) -> dict[str, Any] | None:
    if snap is None:
        return None
    return {"name": snap.name, "guid": str(snap.guid), "createtxg": snap.createtxg}


def _snap_in(obj: dict[str, Any]) -> CarriedSnapshot:
    guid = int(_str(obj["guid"]))
    if not 0 <= guid < 2**64:
        raise ValueError(f"guid {guid} out of range")
    return CarriedSnapshot(name=_str(obj["name"]), guid=guid, createtxg=int(obj["createtxg"]))


def _volume_in(obj: dict[str, Any], form: str) -> VolumeRecord:
    unknown = set(obj) - _VOLUME_FIELDS[form]
    if unknown:
        raise ValueError(f"unknown volume field(s) {sorted(unknown)}")
    volume = VolumeRecord(index=int(obj["index"]), key=_str(obj["key"]),
                          raw_bytes=int(obj["raw_bytes"]), stored_bytes=int(obj["stored_bytes"]),
                          sha256=_str(obj["sha256"]))
    if volume.raw_bytes < 0 or volume.stored_bytes < 0:
        raise ValueError(f"volume {volume.index} has a negative size")
    hashes = [volume.sha256] + ([_str(obj["raw_sha256"])] if form == FORMAT_1 else [])
    if not all(_HEX64.fullmatch(h) for h in hashes):
        raise ValueError(f"volume {volume.index} has a malformed sha256")
    return volume


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _kind(value: Any) -> str:
    if value not in ("full", "incremental"):
        raise ValueError(f"kind {value!r} is neither 'full' nor 'incremental'")
    return str(value)
