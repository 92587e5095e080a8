"""Where a stream's objects live in a store (docs/design.md#object-layout).

Every stream has its own key prefix, a pure function of what the stream is, so an interrupted
archive run finds its own partial upload again::

    HOST/DATASET/TXG-full-TOGUID/                 a full stream of DATASET@to
    HOST/DATASET/TXG-incr-FROMGUID-TOGUID/        an incremental stream from -> to
        vol-000000.zst, vol-000001.zst, ...       volumes: one zstd frame each, in order
        progress.json                             volumes durable so far (while uploading)
        manifest.json                             written after every volume
        manifest.json.copy                        the same bytes, written after it
    _zbak/catalog/NODE/JOB.json                   the catalog export of JOB written by
    _zbak/catalog/NODE/JOB.json.copy              machine NODE (``catalog.export``), and its copy
    _zbak/catalog/NODE/JOB/G0000000007.json       the same, generation 7, on a store that keeps
    _zbak/catalog/NODE/JOB/G0000000007.json.copy  versions: each generation written once

TXG is the to-snapshot's createtxg zero-padded to 20 digits so keys sort in chain order; guids
are 16 hex digits. ``HOST`` is ``local`` for datasets of this machine, else the config's host
name. Dataset names keep their ``/``; OpenZFS names hold only ``[A-Za-z0-9_.:-]``, space and
``/`` (zfs(8) "Naming"), all valid in S3 keys and file names. Config host names start with a
letter or digit, so the ``_zbak/`` prefix never meets a stream's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
COPY_SUFFIX = ".copy"
MANIFEST_COPY = MANIFEST + COPY_SUFFIX
EXPORT_PREFIX = "_zbak/catalog/"
_NODE_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_EXPORT = re.compile(r"(?P<node>[^/]+)/(?P<job>[^/]+?)(?:\.json|/G(?P<generation>\d{10})\.json)")
_VOLUME = re.compile(r"vol-(\d{6})\.zst")
_STREAM_DIR = re.compile(
    r"(?P<txg>\d{20})-(?:full-(?P<full>[0-9a-f]{16})|incr-(?P<from>[0-9a-f]{16})-(?P<to>[0-9a-f]{16}))"
)


def dataset_prefix(host: str, dataset: str) -> str:
    """``HOST/DATASET/``: the prefix of every stream of one dataset."""
    return f"{host}/{dataset}/"


def stream_dataset(key: str, host: str) -> str | None:
    """The dataset whose stream directory holds ``key`` (``HOST/DATASET/STREAM/LEAF``), or
    None when ``key`` is no object of a stream of ``host``."""
    prefix, _, _ = key.rpartition("/")
    head = host + "/"
    if not key.startswith(head) or not is_stream_prefix(prefix + "/"):
        return None
    return prefix[len(head):].rpartition("/")[0] or None


def stream_prefix(host: str, dataset: str, *, to_createtxg: int, to_guid: int,
                  from_guid: int | None) -> str:
    """The key prefix (ending in ``/``) of one stream; ``from_guid`` None for a full."""
    head = dataset_prefix(host, dataset) + f"{to_createtxg:020d}-"
    if from_guid is None:
        return head + f"full-{to_guid:016x}/"
    return head + f"incr-{from_guid:016x}-{to_guid:016x}/"


def volume_key(prefix: str, index: int) -> str:
    """Key of volume ``index`` (0-based) of the stream at ``prefix``."""
    if not 0 <= index <= 999_999:
        raise ValueError(f"volume index {index} out of range 0..999999")
    return f"{prefix}vol-{index:06d}.zst"


def is_stream_prefix(prefix: str) -> bool:
    """True when the last component of ``prefix`` (ending in ``/``) names a stream."""
    return bool(_STREAM_DIR.fullmatch(prefix.rstrip("/").rsplit("/", 1)[-1]))


def copy_key(key: str) -> str:
    """The key of the ``.copy`` written after ``key`` (manifests, catalog exports)."""
    return key + COPY_SUFFIX


def export_key(node: str, job: str) -> str:
    """``_zbak/catalog/NODE/JOB.json``: the catalog export of ``job`` written by machine
    ``node`` (its hostname; characters outside ``[A-Za-z0-9_.-]`` become ``_``)."""
    safe = _NODE_UNSAFE.sub("_", node).lstrip(".") or "node"
    return f"{EXPORT_PREFIX}{safe}/{job}.json"


def generations_prefix(key: str) -> str:
    """``_zbak/catalog/NODE/JOB/``: the prefix of the generation keys (:func:`generation_key`)
    of the export whose single key is ``key``."""
    return key.removesuffix(".json") + "/"


def generation_key(key: str, generation: int) -> str:
    """``_zbak/catalog/NODE/JOB/G0000000007.json``: generation ``generation`` (1 to
    9,999,999,999) of the export whose single key is ``key`` (:func:`export_key`), the key a
    store that keeps versions holds it under (docs/decisions.md#write-once-catalog-exports).

    Raises:
        ValueError: ``generation`` out of range.
    """
    if not 1 <= generation <= 9_999_999_999:
        raise ValueError(f"export generation {generation} out of range 1..9999999999")
    return f"{generations_prefix(key)}G{generation:010d}.json"


def parse_export_key(key: str) -> tuple[str, str, int | None] | None:
    """What an export key (or its ``.copy``) names: ``(single key, job, generation)``, the
    single key as :func:`export_key` makes it and generation None for the single key itself;
    None for any other key (pure)."""
    if not key.startswith(EXPORT_PREFIX):
        return None
    match = _EXPORT.fullmatch(key.removeprefix(EXPORT_PREFIX).removesuffix(COPY_SUFFIX))
    if match is None:
        return None
    node, job, generation = match.group("node", "job", "generation")
    return (f"{EXPORT_PREFIX}{node}/{job}.json", job,
            None if generation is None else int(generation))


def volume_index(key: str) -> int | None:
    """The index of a volume key, or None when ``key`` is not a volume."""
    match = _VOLUME.fullmatch(key.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def parse_stream_prefix(prefix: str) -> tuple[str, int | None, int, int]:
    """What a stream directory's name says: ``(kind, from guid, to guid, to createtxg)``,
    kind ``full`` (from guid None) or ``incremental``; the inverse of ``stream_prefix``.

    Raises:
        ValueError: the last component of ``prefix`` does not name a stream.
    """
    match = _STREAM_DIR.fullmatch(prefix.rstrip("/").rsplit("/", 1)[-1])
    if match is None:
        raise ValueError(f"{prefix!r} is not a stream prefix")
    txg = int(match.group("txg"))
    if match.group("full"):
        return "full", None, int(match.group("full"), 16), txg
    return "incremental", int(match.group("from"), 16), int(match.group("to"), 16), txg


def common_prefix(prefixes: Sequence[str]) -> str:
    """The longest ``/``-ending key prefix shared by ``prefixes`` (streams' object prefixes),
    ``""`` when they share none: the whole store."""
    shared = os.path.commonprefix(list(prefixes))
    return shared[: shared.rfind("/") + 1]
