"""Fetch and verify every volume of a restore path before any byte reaches ``zfs receive``.

Each volume is checked against the catalog: it exists with the recorded size (checked for all
volumes first, one stat each, so a missing or truncated object stops the restore before any
download), its bytes hash to the recorded SHA-256, and it decodes as one whole zstd frame
whose content checksum matches and whose raw size is the recorded one. Volumes of a local
directory store are checked where they lie; volumes of a remote store are downloaded into the
spool directory (in parallel, bounded) and checked there, so the receive phase reads verified
local files only.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from zrepl_py.catalog.repository import VolumeRow
from zrepl_py.errors import ObjectNotFound, RestoreError, StreamCorrupt
from zrepl_py.stores.base import Backend
from zrepl_py.streams.frames import Digest, decompress_frame

READ_CHUNK = 1 << 20  # bytes


def file_chunks(path: Path) -> Iterator[bytes]:
    """Yield the file's bytes in chunks."""
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            yield chunk


def check_present(backend: Backend, volumes: Sequence[VolumeRow]) -> None:
    """Every volume exists with its recorded size.

    Raises:
        StreamCorrupt: a volume is missing or has another size (named, with what to do).
    """
    for volume in volumes:
        where = f"{backend.name}:{volume.key}"
        try:
            size = backend.stat(volume.key).size
        except ObjectNotFound:
            raise StreamCorrupt(f"volume {where} (stream {volume.stream_id}) is missing from the"
                                " store; nothing was received. Run `zbak audit` and restore from"
                                " another chain or source (--from)") from None
        if size != volume.stored_bytes:
            raise StreamCorrupt(f"volume {where} has {size} bytes, the catalog records"
                                f" {volume.stored_bytes} (truncated or replaced); nothing was"
                                " received. Run `zbak audit`")


def _verify(chunks, volume: VolumeRow, where: str) -> None:
    digest = Digest()
    try:
        for _ in decompress_frame(chunks, where, digest):
            pass
    except StreamCorrupt as exc:
        raise StreamCorrupt(f"{exc}; nothing was received. Run `zbak audit --deep`") from None
    if digest.stored_bytes != volume.stored_bytes or digest.sha256 != volume.sha256:
        raise StreamCorrupt(f"volume {where}: SHA-256 or size differs from the catalog"
                            f" ({digest.stored_bytes} bytes, sha256 {digest.sha256[:16]}...);"
                            " nothing was received")
    if digest.raw_bytes != volume.raw_bytes:
        raise StreamCorrupt(f"volume {where}: decodes to {digest.raw_bytes} bytes, the catalog"
                            f" records {volume.raw_bytes}; nothing was received")


def _fetch_one(backend: Backend, volume: VolumeRow, spool: Path) -> Path:
    where = f"{backend.name}:{volume.key}"
    local = backend.local_path(volume.key)
    if local is not None:
        _verify(file_chunks(local), volume, where)
        return local
    target = spool / f"{volume.stream_id}-{volume.index:06d}.zst"
    if target.exists() and target.stat().st_size == volume.stored_bytes:
        try:
            _verify(file_chunks(target), volume, where)
            return target  # verified by an earlier run (a restore that waited for a thaw)
        except StreamCorrupt:
            target.unlink()
    partial = target.with_suffix(".partial")
    with open(partial, "wb") as out:
        for chunk in backend.get(volume.key):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    _verify(file_chunks(partial), volume, where)
    partial.rename(target)
    return target


def fetch_verified(backend: Backend, volumes: Sequence[VolumeRow], spool: Path,
                   concurrency: int) -> dict[int, Path]:
    """Verify every volume (downloading remote ones into ``spool``); map volume id -> file.

    Args:
        backend: the store.
        volumes: every volume of the path, any order.
        spool: a private directory for downloads (created if missing; must have room for the
            remote volumes' stored bytes).
        concurrency: downloads/verifications at once.

    Raises:
        StreamCorrupt: a volume is missing, truncated, or fails a check (nothing received).
        RestoreError: the spool directory lacks space.
        NeedsThaw, StoreError: the store refused.
    """
    check_present(backend, volumes)
    remote = [v for v in volumes if backend.local_path(v.key) is None]
    if remote:
        spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        need = sum(v.stored_bytes for v in remote)
        free = shutil.disk_usage(spool).free
        if need > free:
            raise RestoreError(f"the spool directory {spool} has {free} bytes free, the restore"
                               f" needs {need}: set [restore] spool_dir to a larger file system")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency)
    try:
        futures = {v.id: pool.submit(_fetch_one, backend, v, spool) for v in volumes}
        return {vid: future.result() for vid, future in futures.items()}
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # the first failure stops the rest
