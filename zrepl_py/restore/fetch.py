"""Fetch and verify every volume of a restore path before its bytes reach ``zfs receive``.

Each volume is checked against the catalog: it exists with the recorded size (checked for all
volumes first, one stat each, so a missing or truncated object stops the restore before any
download), its bytes hash to the recorded SHA-256, and they have the structure its stream's
codec chain stores (``Codec.walk``: for zstd, one whole frame with a content checksum, ending
exactly at the object's end, frame and block headers only). Volumes of a local directory
store are checked where they lie; volumes of a remote store are downloaded into the spool
directory (in parallel, bounded) and checked as they are written there (one pass: the bytes
checked are the file's bytes), so the receive phase reads verified local files only. Verification runs ahead of the receive,
in chain order (``VolumeFetch``): the receive of volume N overlaps the checks of the next
ones, and takes each volume only once it verified.

Why this pass does not decode (it did until benchmarks/archive.py measured it: decoding
plus a SHA-256 of the decoded bytes took 4x as long as the SHA-256 of the stored bytes alone,
2.6 s against 0.65 s per GiB of stream here, all before the first byte is received): the
catalog's SHA-256 is the one ``Backend.put`` computed over exactly the bytes
``compress_frame`` produced for the volume, one whole frame (finished with FLUSH_FINISH,
content checksum on), and the catalog row was written only after the put returned
(docs/design.md#archive-writer-order). Stored bytes of the recorded size and SHA-256 are
therefore those bytes (SHA-256 second-preimage resistance): a missing, truncated, extended,
replaced or bit-flipped volume fails here, before anything is received, exactly as a decode
would have failed it. The frame walk checks the frame end
(docs/reliability.md#r8-truncated-stream-object) without decoding.

What a decode here would add is a check of the writer itself: a frame that was already bad
when it was hashed (memory corruption between compressor and hash, a zstd bug). That is
left to the receive pass, which decodes with zstd's content checksum, the frame-end and
nothing-after checks and the catalog's raw size, and holds back each frame's last decoded
piece until they pass (``decompress_frame``): the failing stream never reaches its END
record, and its cancelled receive discards it (zfs-receive(8) without ``-s``); streams of the
chain before it stay received (the error says which). ``zbak audit --deep`` decodes every
volume and walks the send records ahead of any restore (audit/deep.py).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from zrepl_py.catalog.rows import VolumeRow
from zrepl_py.errors import ObjectNotFound, RestoreError, StreamCorrupt
from zrepl_py.stores.base import Backend, get_recorded, stat_recorded
from zrepl_py.streams.codec import Codec, file_chunks

log = logging.getLogger(__name__)

def check_present(backend: Backend, volumes: Sequence[VolumeRow], concurrency: int = 1) -> None:
    """Every volume exists with its recorded size (one stat each, ``concurrency`` at once:
    on S3 each is a round trip; a failure is reported for the first such volume in order).

    Raises:
        StreamCorrupt: a volume is missing or has another size (named, with what to do).
        StoreError: a stat failed.
    """
    def size_of(volume: VolumeRow) -> int | None:
        try:
            return stat_recorded(backend, volume.key, volume.version_id).size
        except ObjectNotFound:
            return None

    with concurrent.futures.ThreadPoolExecutor(max(1, concurrency),
                                               thread_name_prefix="stat") as pool:
        for volume, size in zip(volumes, pool.map(size_of, volumes), strict=True):
            where = f"{backend.name}:{volume.key}"
            if size is None:
                raise StreamCorrupt(f"volume {where} (stream {volume.stream_id}) is missing from"
                                    " the store; nothing was received. Run `zbak audit` and"
                                    " restore from another chain or source (--from)")
            if size != volume.stored_bytes:
                raise StreamCorrupt(f"volume {where} has {size} bytes, the catalog records"
                                    f" {volume.stored_bytes} (truncated or replaced); nothing"
                                    " was received. Run `zbak audit`")


def _verify(chunks: Iterable[bytes], volume: VolumeRow, where: str, codec: Codec) -> None:
    """Size, SHA-256 and stored structure (``codec.walk``) of one volume's bytes (see the
    module docstring).

    Raises:
        StreamCorrupt: a check failed (the message says nothing was received).
    """
    sha = hashlib.sha256()
    size = 0
    walk = codec.walk(where)
    shape: StreamCorrupt | None = None
    for chunk in chunks:
        sha.update(chunk)
        size += len(chunk)
        if shape is None:
            try:
                walk.feed(chunk)
            except StreamCorrupt as exc:
                shape = exc  # reported after the hash: a mismatch there says more
    digest = sha.hexdigest()
    if size != volume.stored_bytes or digest != volume.sha256:
        raise StreamCorrupt(f"volume {where}: SHA-256 or size differs from the catalog"
                            f" ({size} bytes, sha256 {digest[:16]}...); nothing was received."
                            " Run `zbak audit --deep`")
    if shape is None:
        try:
            walk.end()
        except StreamCorrupt as exc:
            shape = exc
    if shape is not None:
        raise StreamCorrupt(f"{shape}; nothing was received. Run `zbak audit --deep`")


def _fetch_one(backend: Backend, volume: VolumeRow, spool: Path, codec: Codec) -> Path:
    where = f"{backend.name}:{volume.key}"
    local = backend.local_path(volume.key)
    if local is not None:
        _twice(lambda: _verify(file_chunks(local), volume, where, codec), where)
        return local
    target = spool / f"{volume.stream_id}-{volume.index:06d}.zst"
    if target.exists() and target.stat().st_size == volume.stored_bytes:
        try:
            _verify(file_chunks(target), volume, where, codec)
            return target  # verified by an earlier run (a restore that waited for a thaw)
        except StreamCorrupt:
            target.unlink()
    partial = target.with_suffix(".partial")
    _twice(lambda: _download_verified(backend, volume, partial, where, codec), where)
    partial.rename(target)
    return target


def _download_verified(backend: Backend, volume: VolumeRow, partial: Path, where: str,
                       codec: Codec) -> None:
    """Download ``volume`` into ``partial``, verifying the bytes as they are written there.

    One pass: the bytes hashed and walked are exactly the bytes written to the file, which
    the receive pass reads back (decoding them with the content checksum and the catalog's
    raw size). No fsync: a spool file is never trusted across runs without being verified
    again (``_fetch_one``), so one a crash left short or torn is read again, not received.
    Before the read-ahead
    (docs/decisions.md#restore-verifies-each-volume-before-it-is-received-and-reads-ahead) the
    file was fsync'ed and read back to be verified: a full's first volume then reached ``zfs
    receive`` only after it was downloaded, forced to disk and read once more.

    Raises:
        StreamCorrupt: the downloaded bytes fail a check.
        NeedsThaw, StoreError: the store refused.
    """
    with open(partial, "wb") as out:
        def written() -> Iterator[bytes]:
            for chunk in get_recorded(backend, volume.key, volume.version_id):
                out.write(chunk)
                yield chunk

        _verify(written(), volume, where, codec)


def _twice(read_and_verify: Callable[[], None], where: str) -> None:
    """Run ``read_and_verify``; when the bytes fail verification, warn naming the volume and
    read it once more, so a flaky read (a dropped connection that looked like EOF, a bad
    disk read) does not fail a restore, yet is reported (docs/reliability.md#r11-flaky-read,
    restic's errorOnceBackend: "check successful on second attempt"). Only one retry: a volume that
    fails twice is corrupt where it is stored.

    Raises:
        StreamCorrupt: the second read failed too.
    """
    try:
        read_and_verify()
    except StreamCorrupt as exc:
        log.warning("volume %s failed verification on the first read (%s); reading it again",
                    where, exc)
        read_and_verify()
        log.warning("volume %s verified on the second read: the first read returned bad bytes"
                    " (a flaky store, network or disk)", where)


class VolumeFetch:
    """Verify the volumes of a restore path in chain order, ``concurrency`` at a time,
    ahead of the receive that takes them one by one (bounded read-ahead).

    The constructor checks every volume's presence and size first (one stat each, so a
    missing or truncated object stops the restore before anything is received) and the
    spool's room for the remote volumes, then starts the verifications in chain order:
    the first volume alone (nothing is received before it verified), then, while the
    receive takes volume N, volumes N+1 .. N+concurrency are read and checked.
    ``path(volume)`` hands out a volume only once it verified, so a bad volume never
    reaches ``zfs receive``; ``wait_all()`` returns once every volume verified, which the
    restore waits for before the first stream's END record goes out (restore/execute.py),
    so a bad volume anywhere in the path still means nothing was received.

    Use as a context manager: leaving it stops the verifications not yet started.

    Args:
        backend: the store.
        volumes: every volume of the path, in chain order (stream by stream, index order).
        spool: a private directory for downloads (created if missing; must have room for
            the remote volumes' stored bytes).
        concurrency: verifications (downloads) at once, >= 1.
        codecs: the codec chain of each stream (by stream id) whose stored structure is
            checked; a stream not named is plain zstd (``Codec()``).

    Raises:
        StreamCorrupt: a volume is missing or has another size.
        RestoreError: the spool directory lacks space.
        StoreError: a stat failed.
    """

    def __init__(self, backend: Backend, volumes: Sequence[VolumeRow], spool: Path,
                 concurrency: int, codecs: Mapping[int, Codec] | None = None):
        check_present(backend, volumes, concurrency)
        remote = [v for v in volumes if backend.local_path(v.key) is None]
        if remote:
            spool.mkdir(parents=True, exist_ok=True, mode=0o700)
            need = sum(v.stored_bytes for v in remote)
            free = shutil.disk_usage(spool).free
            if need > free:
                raise RestoreError(f"the spool directory {spool} has {free} bytes free, the"
                                   f" restore needs {need}: set [restore] spool_dir to a larger"
                                   " file system")
        self._failed = threading.Event()
        self._head = threading.Event()  # the first volume's check is over (or never runs)
        self._closing = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix="verify")
        # The pool takes work in submission order: the volumes the receive needs next first.
        # The first volume is checked alone: nothing is received until it verified, so the
        # read-ahead waits for it rather than share the CPU, disk or network with it.
        known = codecs or {}
        self._futures = {v.id: self._pool.submit(self._fetch, backend, v, spool,
                                                 known.get(v.stream_id, Codec()), first=i == 0)
                         for i, v in enumerate(volumes)}
        for future in self._futures.values():
            future.add_done_callback(self._note)
        if volumes:
            self._futures[volumes[0].id].add_done_callback(lambda _: self._head.set())

    def _fetch(self, backend: Backend, volume: VolumeRow, spool: Path, codec: Codec, *,
               first: bool) -> Path:
        if not first:
            self._head.wait()
            if self._closing.is_set():
                raise RestoreError(f"the restore stopped before volume {volume.key} was read")
        return _fetch_one(backend, volume, spool, codec)

    def _note(self, future: concurrent.futures.Future[Path]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._failed.set()

    def __enter__(self) -> VolumeFetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path(self, volume: VolumeRow) -> Path:
        """The verified file of ``volume``, waiting for its check.

        Raises:
            StreamCorrupt: it failed verification (twice); NeedsThaw, StoreError.
        """
        return self._futures[volume.id].result()

    def failed(self) -> bool:
        """True when some volume's verification has failed already."""
        return self._failed.is_set()

    def wait_all(self) -> dict[int, Path]:
        """Wait until every volume verified; map volume id -> verified file.

        Raises:
            StreamCorrupt, NeedsThaw, StoreError: of the first failing volume in chain order.
        """
        return {vid: future.result() for vid, future in self._futures.items()}

    def close(self) -> None:
        """Stop the verifications not started yet; wait for the running ones."""
        self._closing.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._head.set()  # the checks still waiting for the first one stop at once
        self._pool.shutdown(wait=True)
