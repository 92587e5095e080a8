"""Carry out a restore plan: thaw, fetch and verify, then receive in order.

Archive path: every cold volume is thawed first (exit 75 until readable); every volume of
every stream is verified (fetch.py) before the first byte is received, so a missing,
truncated or altered volume means nothing is received; then each stream is decompressed
into ``zfs receive -u INTO`` (never ``-F``), full first. When the target snapshot lies inside
the last ``-I`` stream, the snapshots after it are destroyed from the NEW dataset (which this
restore created) and the dataset is rolled back to the target.
Local and replica paths: ``zfs send`` of the first snapshot, then ``-I`` to the target, piped
into ``zfs receive -u INTO`` (over ssh when the source is a replica host).
"""

from __future__ import annotations

import dataclasses
import logging
import re

from zrepl_py.context import Context
from zrepl_py.errors import (
    CatalogError,
    PipelineCancelled,
    PipelineFailed,
    RestoreError,
    StreamCorrupt,
    StreamRejected,
    ThawPending,
)
from zrepl_py.proc.pipeline import run_pipeline
from zrepl_py.replication.planner import Full, Incremental, SnapRef
from zrepl_py.replication.stages import Side, transfer_stages
from zrepl_py.restore.fetch import fetch_verified, file_chunks
from zrepl_py.restore.plan import RestorePlan
from zrepl_py.proc.python_end import ReceiveWriter
from zrepl_py.restore.thaw import request_thaws
from zrepl_py.stores.open import open_store
from zrepl_py.streams.frames import decompress_frame
from zrepl_py.zfs.names import DatasetName, SnapshotName
from zrepl_py.zfs.sendrecv import receive_argv, send_argv

log = logging.getLogger(__name__)

# What ``zfs receive`` says about a stream whose content is invalid (seen on zfs-fuse 0.7:
# "invalid stream (bad magic number)", "invalid stream (checksum mismatch)", "invalid backup
# stream"; OpenZFS libzfs_sendrecv.c adds "checksum mismatch or incomplete stream"). Not
# "unsupported feature": that is the receiver's limit, not the stream's fault.
_INVALID_STREAM = re.compile(
    r"invalid (?:backup )?stream|checksum mismatch|bad magic number|incomplete stream",
    re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class RestoreOutcome:
    """What a restore did: the dataset created, the streams received, raw bytes received."""

    into: str
    streams: int
    bytes: int


def execute_restore(ctx: Context, plan: RestorePlan) -> RestoreOutcome:
    """Restore per ``plan`` (see the module docstring).

    Raises:
        ThawPending: cold volumes are not readable yet (exit 75; thaws were requested).
        StreamCorrupt: a volume failed verification (nothing received).
        StreamRejected: zfs receive (or the receive pass's zstd decode) rejected a verified
            stream's content; the stream is marked ``bad`` in the catalog.
        PipelineFailed: a send or receive failed (the message says what was received).
        StoreError, ZfsError, HostUnreachable.
    """
    if plan.chosen.source == "archive":
        return _from_archive(ctx, plan)
    return _from_snapshots(ctx, plan)


def _from_archive(ctx: Context, plan: RestorePlan) -> RestoreOutcome:
    path = plan.chosen.path
    assert path is not None
    cfg = ctx.config.restore
    backend = open_store(path.store, ctx.config.stores[path.store])
    try:
        waiting, ready_by = request_thaws(backend, ctx.catalog(), path.streams, plan.volumes,
                                          cfg, ctx.clock.now())
        if waiting:
            raise ThawPending(
                f"{waiting} volume(s) of the chain in store {path.store} are thawing (tier"
                f" {cfg.thaw_tier}); run the same restore again after"
                f" {ready_by:%Y-%m-%d %H:%M}Z: it continues where it stopped")
        spool = (cfg.spool_dir or ctx.state_dir / "spool") / f"{plan.host}-{plan.dataset.replace('/', '_')}"
        every = [v for s in path.streams for v in plan.volumes[s.id]]
        files = fetch_verified(backend, every, spool, cfg.download_concurrency)
    finally:
        backend.close()
    zfs = ctx.zfs(plan.host, DatasetName(plan.into).pool)
    side = Side.of(ctx.config, plan.host)
    receive = receive_argv(plan.into, caps=zfs.capabilities, resumable=False, zfs=zfs.zfs)
    total = 0
    for done, stream in enumerate(path.streams):
        try:
            with ReceiveWriter(side.wrap([receive], "zfs receive")) as writer:
                for volume in plan.volumes[stream.id]:
                    where = f"{path.store}:{volume.key}"
                    chunks = decompress_frame(file_chunks(files[volume.id]), where,
                                              raw_bytes=volume.raw_bytes)
                    for chunk in chunks:
                        writer.write(chunk)
                        total += len(chunk)
                writer.finish()
        except Exception as exc:
            got = (f"{plan.into} holds the streams up to @{path.streams[done - 1].to_name}"
                   if done else "nothing was received")
            if _stream_rejected(exc):
                _mark_bad(ctx, stream.id)
                raise StreamRejected(
                    f"zfs receive rejected stream {stream.id} (@{stream.to_name}, store"
                    f" {path.store}) although its volumes verified: {exc}; the stream is marked"
                    f" bad in the catalog; {got}") from exc
            raise RestoreError(f"receiving stream {stream.id} (@{stream.to_name}) into"
                               f" {plan.host}:{plan.into} failed: {exc}; {got}") from exc
    _trim(ctx, plan, [c.name for c in path.later])
    for file in set(files.values()):
        if file.is_relative_to(spool):
            file.unlink(missing_ok=True)
    return RestoreOutcome(plan.into, len(path.streams), total)


def _stream_rejected(exc: BaseException) -> bool:
    """True when a receive failed because of the stream's own bytes (RELIABILITY 12): zfs
    receive called it invalid, or its zstd frame failed while decoding for the receive."""
    if isinstance(exc, StreamCorrupt):
        return True
    return (isinstance(exc, PipelineFailed) and not isinstance(exc, PipelineCancelled)
            and bool(_INVALID_STREAM.search(exc.culprit.stderr or "")))


def _mark_bad(ctx: Context, stream_id: int) -> None:
    """Mark stream ``stream_id`` bad so no restore path uses it again; a catalog failure here
    is logged, never hides the receive error."""
    try:
        ctx.catalog().set_stream_state(stream_id, "bad", ctx.clock.now())
    except CatalogError as exc:
        log.error("could not mark stream %d bad in the catalog: %s", stream_id, exc)
    else:
        log.error("stream %d marked bad in the catalog: zfs receive rejected its content",
                  stream_id)


def _trim(ctx: Context, plan: RestorePlan, later: list[str]) -> None:
    """Destroy the snapshots received after the target from the NEW dataset, then roll back."""
    if not later:
        return
    zfs = ctx.zfs(plan.host, DatasetName(plan.into).pool)
    for name in reversed(later):
        zfs.destroy_snapshot(SnapshotName.of(DatasetName(plan.into), name))
    zfs.rollback(SnapshotName.of(DatasetName(plan.into), plan.target.name))


def _from_snapshots(ctx: Context, plan: RestorePlan) -> RestoreOutcome:
    chosen = plan.chosen
    assert chosen.host is not None and chosen.dataset is not None
    src = ctx.zfs(chosen.host, DatasetName(chosen.dataset).pool)
    dst = ctx.zfs(plan.host, DatasetName(plan.into).pool)
    plain = dataclasses.replace(src.capabilities, compressed_send=False)
    refs = [SnapRef(s.name, s.guid, s.createtxg) for s in chosen.snapshots]
    steps = [Full(refs[0])]
    if len(refs) > 1:
        steps.append(Incremental(refs[0], refs[-1], intermediates=True))
    source, target = Side.of(ctx.config, chosen.host), Side.of(ctx.config, plan.host)
    total = 0
    for step in steps:
        send = send_argv(step, source_dataset=chosen.dataset, caps=plain, raw=False, zfs=src.zfs)
        receive = receive_argv(plan.into, caps=dst.capabilities, resumable=False, zfs=dst.zfs)
        stages = transfer_stages(send, receive, source=source, target=target,
                                 compress=source.config is not None or target.config is not None,
                                 bandwidth_limit=None)
        total += run_pipeline(stages).bytes
    return RestoreOutcome(plan.into, len(steps), total)
