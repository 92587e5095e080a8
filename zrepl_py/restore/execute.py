"""Carry out a restore plan: thaw, fetch and verify, then receive in order.

Archive path: the store's catalog exports are checked against this machine's high-water marks
(``catalog.export.StoreGuard``), then every cold volume is thawed first (exit 75 until
readable); every volume is present with its size before the first byte is received; then
each stream is decompressed into ``zfs receive -u INTO`` (never ``-F``), full first, each
volume only once it verified (fetch.py, which checks the next volumes while one is
received), and the first stream's END record only once every volume of the path verified,
so a missing, truncated or altered volume still means nothing is received. Each stream's
``zfs receive`` is started while the one before it commits (it waits for its first byte),
so the process starts (an exec, zfs's set-up, over ssh a login) of a long chain are off
its critical path. When the target snapshot lies inside the last ``-I`` stream, the
snapshots after it are destroyed from the NEW dataset (which this restore created) and the
dataset is rolled back to the target. Once the first stream is received the new dataset is
marked (``mark.RESTORING``) until the restore finished, so a restore killed or failed
later is continued by the next run (``plan.plan_restore``: only the streams still missing).
Local and replica paths: ``zfs send`` of the first snapshot, then ``-I`` to the target, piped
into ``zfs receive -u INTO`` (over ssh when the source is a replica host; run by that host
alone when INTO is on the same remote host, so the stream never leaves it); raw (``-w``) when
that dataset is encrypted, as replication sends it. The full is marked the same way, so an
interrupted ``-I`` is sent again from the snapshot the full brought, not from scratch.

Encrypted datasets (docs/reliability.md#r38-encrypted-datasets): an archived raw stream (``zfs send
-w``) is received as it is (``zfs receive`` needs no flag); the new dataset is encrypted, its key
unloaded (``keystatus`` ``unavailable``) and it stays unmounted. Destroying the later snapshots and
the rollback work without the key (checked on OpenZFS 2.3). After every restore the new
dataset must hold the target snapshot with its guid; when it arrived locked the outcome says
so and a warning names the ``zfs load-key`` / ``zfs mount`` to run (the key is the source
dataset's: a raw stream carries none).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from zrepl_py.archive.damage import mark_bad
from zrepl_py.catalog.export import StoreGuard
from zrepl_py.catalog.rows import StreamRow, VolumeRow, shown_keys
from zrepl_py.errors import (
    CatalogError,
    IdentityRefused,
    PipelineFailed,
    RestoreError,
    StreamCorrupt,
    StreamInvalid,
    StreamRejected,
    ThawPending,
    ZbakError,
)
from zrepl_py.invocation.context import Context
from zrepl_py.observe.progress import ProgressReporter, Sampler
from zrepl_py.observe.transfers import job_of, reporting
from zrepl_py.proc.pipeline import Meter, run_pipeline
from zrepl_py.proc.python_end import ReceiveWriter
from zrepl_py.restore.fetch import VolumeFetch
from zrepl_py.restore.mark import RESTORING, mark_value
from zrepl_py.restore.plan import RestorePlan
from zrepl_py.restore.thaw import request_thaws
from zrepl_py.streams.codec import Codec
from zrepl_py.transport.stages import Side, metered_transfer
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.encryption import probe_encryption
from zrepl_py.zfs.errors import receive_refusal
from zrepl_py.zfs.estimate import expected_size
from zrepl_py.zfs.names import DatasetName, SnapshotName
from zrepl_py.zfs.sendrecv import receive_argv, send_argv
from zrepl_py.zfs.steps import Full, Incremental, SnapRef

log = logging.getLogger(__name__)

RECEIVE_AHEAD = 64 << 20
"""Bytes of decoded stream queued in this process ahead of ``zfs receive``, written by a
thread of its own (``proc.write_behind``), so the decryption and the decode go on while the
receive pauses; 64 MiB, as replication's receive buffer (measured:
docs/performance.md#a-restore-writes-behind)."""


@dataclasses.dataclass(frozen=True)
class RestoreOutcome:
    """What a restore did: the dataset created, the streams received, raw bytes received
    (0 for a copy a remote host made within itself: none crossed this machine), and ``locked``: the dataset arrived encrypted with its key not loaded (``zfs load-key
    INTO``, then ``zfs mount INTO``, with the source dataset's passphrase or key)."""

    into: str
    streams: int
    bytes: int
    locked: bool = False


def execute_restore(ctx: Context, plan: RestorePlan) -> RestoreOutcome:
    """Restore per ``plan`` (see the module docstring).

    Raises:
        CatalogReplay: the store is older than this machine last wrote it (rolled back or
            replaced); CatalogExportCorrupt: its catalog export and copy are both damaged.
        IdentityNeeded: a stream of the path is sealed and no identity was given (exit 2;
            before anything is read). IdentityRefused: the identity opens no volume of it
            (exit 2; at the first volume's header, before its stream's first byte).
        ThawPending: cold volumes are not readable yet (exit 75; thaws were requested).
        StreamCorrupt: a volume failed verification (nothing received).
        StreamRejected: zfs receive (or the receive pass's zstd decode) rejected a verified
            stream's content; the stream is marked ``bad`` in the catalog.
        PipelineFailed: a send or receive failed (the message says what was received).
        RestoreError: the new dataset does not hold the target snapshot's guid afterwards.
        SendArgsInvalid: the local or replica source is encrypted and its host has no
            ``zfs send -w`` (it is never sent decrypted).
        StoreError, ZfsError, HostUnreachable.
    """
    if plan.chosen.source == "archive":
        return _from_archive(ctx, plan)
    return _from_snapshots(ctx, plan)


def archive_codecs(ctx: Context, plan: RestorePlan) -> dict[int, Codec]:
    """The codec chain of each stream of ``plan``'s archive path, by stream id, a sealed
    one's with the identity read: what a restore checks before it asks to go on, and again
    before any thaw or download.

    Raises:
        IdentityNeeded: a stream of the path is sealed and no identity was given (exit 2).
        IdentityUnusable: the identity file cannot be read or holds no key (exit 2).
        ExtraMissing: a sealed stream without pyrage. StreamCorrupt: a chain this zbak does
            not know.
    """
    path = plan.chosen.path
    assert path is not None
    codec_of = ctx.reading_codecs(path.store)
    return {s.id: codec_of(s.compression) for s in path.streams}


def _from_archive(ctx: Context, plan: RestorePlan) -> RestoreOutcome:
    path = plan.chosen.path
    assert path is not None
    codecs = archive_codecs(ctx, plan)
    cfg = ctx.config.restore
    backend = ctx.store(path.store)
    # docs/reliability.md#r25-catalog-rollback-detection: a store rolled back behind this machine's
    # back is refused.
    StoreGuard(backend, path.store, ctx.state_dir).check()
    waiting, ready_by = request_thaws(backend, ctx.catalog(), path.streams, plan.volumes,
                                      cfg, ctx.clock.now())
    if waiting:
        raise ThawPending(
            f"{waiting} volume(s) of the chain in store {path.store} are thawing (tier"
            f" {cfg.thaw_tier}); run the same restore again after"
            f" {ready_by:%Y-%m-%d %H:%M}Z: it continues where it stopped")
    spool = (cfg.spool_dir or ctx.state_dir / "spool") / f"{plan.host}-{plan.dataset.replace('/', '_')}"
    every = [v for s in path.streams for v in plan.volumes[s.id]]
    zfs = ctx.zfs(plan.into_host, DatasetName(plan.into).pool)
    side = Side.of(ctx.config, plan.into_host)
    receive = receive_argv(plan.into, caps=zfs.capabilities, resumable=False, zfs=zfs.zfs)
    total = 0
    label = f"{path.store}:{plan.dataset}@{plan.target.name} -> {plan.into}"
    with VolumeFetch(backend, every, spool, cfg.download_concurrency, codecs) as fetch:
        progress = _reporter(ctx, plan, label, total=sum(s.raw_bytes for s in path.streams),
                             expected_source="catalog")
        sampler = Sampler(progress)
        stages = side.wrap([receive], "zfs receive")
        upcoming: ReceiveWriter | None = ReceiveWriter(stages, ahead=RECEIVE_AHEAD).start()
        try:
            for done, stream in enumerate(path.streams):
                writer, upcoming = upcoming, None
                assert writer is not None  # started before the loop and for each next stream
                try:
                    with writer:
                        for chunk in _stream_bytes(fetch, path.store, plan.volumes[stream.id],
                                                   codecs[stream.id], first=done == 0):
                            writer.write(chunk)
                            total += len(chunk)
                            sampler.add(len(chunk))
                        if done + 1 < len(path.streams):
                            # The next receive starts (an exec, zfs's library set-up, over
                            # ssh a login) while this one commits, not after it. It waits for
                            # its first byte, written once this one finished; zfs receive
                            # reads the BEGIN record before it looks at the target (the base
                            # of an incremental must exist only then: zfs-receive(8)).
                            upcoming = ReceiveWriter(stages, ahead=RECEIVE_AHEAD).start()
                        writer.finish()
                    if done == 0 and not plan.resumed:
                        _mark(zfs, plan, mark_value(plan.host, str(plan.dataset)))
                except _Unverified as exc:
                    progress.close()
                    raise exc.error from None  # says "nothing was received" (see _stream_bytes)
                except IdentityRefused as exc:
                    # The volume verified: the key is wrong, not the stream (nothing marked
                    # bad). Its header is the first thing decrypted: nothing of it went out.
                    progress.close()
                    got = (f"{plan.into} holds the streams up to @{path.streams[done - 1].to_name}"
                           if done else "nothing was received")
                    raise IdentityRefused(f"{exc}{_sealed_to(stream)}; {got}") from None
                except (ZbakError, OSError) as exc:
                    # What a receive raises; a defect's error passes on to the CLI's internal
                    # error (docs/decisions.md#a-restore-reports-a-defect-as-a-defect).
                    progress.close()  # a KeyboardInterrupt leaves the file: stale once we exit
                    got = (f"{plan.into} holds the streams up to @{path.streams[done - 1].to_name}"
                           if done else f"{plan.into} holds what it held" if plan.resumed
                           else "nothing was received")
                    if _stream_rejected(exc, receive, plan.into_host):
                        _mark_bad(ctx, stream, f"zfs receive rejected its content (stream"
                                  f" {stream.object_prefix}, every volume verified): {exc}",
                                  job_of(ctx.config, plan.host, plan.dataset))
                        raise StreamRejected(
                            f"zfs receive rejected stream {stream.id} (@{stream.to_name}, store"
                            f" {path.store}) although its volumes verified: {exc}; the stream is"
                            f" marked bad in the catalog; {got}") from exc
                    raise RestoreError(f"receiving stream {stream.id} (@{stream.to_name}) into"
                                       f" {plan.into_host}:{plan.into} failed: {exc}; {got}"
                                       ) from exc
        finally:
            if upcoming is not None:  # started for a stream that never came: received nothing
                upcoming.__exit__(None, None, None)
        files = fetch.wait_all()
    progress.finish(total, time.monotonic() - sampler.started)
    _trim(ctx, plan, [c.name for c in path.later])
    locked = _check_received(zfs, plan)
    _mark(zfs, plan, None)
    for file in set(files.values()):
        if file.is_relative_to(spool):
            file.unlink(missing_ok=True)
    return RestoreOutcome(plan.into, len(path.streams), total, locked)


def _mark(zfs: Zfs, plan: RestorePlan, value: str | None) -> None:
    """Set (``value``) or clear (None) the ``RESTORING`` mark on the new dataset; a failure
    is a warning (a delegated user without the ``userprop`` permission): the restore goes
    on, but one interrupted later is not continued by the next run."""
    try:
        if value is None:
            zfs.inherit_property(plan.into, RESTORING)
        else:
            zfs.set_property(plan.into, RESTORING, value)
    except ZbakError as exc:
        log.warning("could not %s %s on %s:%s (%s): a restore interrupted from here on is"
                    " not continued by the next run", "clear" if value is None else "set",
                    RESTORING, plan.into_host, plan.into, exc)


def _sealed_to(stream: StreamRow) -> str:
    """The recipients ``stream`` was sealed to, for a refused identity's message (the
    catalog records them since revision 0012; docs/sealed.md#changing-the-recipients)."""
    if not stream.sealed_to:
        return ""
    return f"; stream {stream.id} (@{stream.to_name}) was sealed to {shown_keys(stream.sealed_to)}"


class _Unverified(Exception):
    """A volume failed verification (or could not be read) while the first stream was
    being received; ``error`` is the fetch's own error."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def _stream_bytes(fetch: VolumeFetch, store: str, volumes: Sequence[VolumeRow], codec: Codec,
                  *, first: bool) -> Iterator[bytes]:
    """The raw send stream of one archived stream: its volumes, each taken from ``fetch``
    once verified and decoded by its codec chain with every check (``Codec.decode``).

    For the ``first`` stream of the path, its last piece (which carries the stream's END
    record) is held back until every volume of the whole path verified, and a verification
    failure seen meanwhile stops at once: a bad volume anywhere in the path then cancels
    the first receive, which discards the partial stream (zfs-receive(8) without ``-s``),
    so nothing is received, as when every volume was checked before the first byte.

    Raises:
        _Unverified: a volume failed verification or could not be fetched.
        StreamCorrupt: a verified volume failed a decode check (zfs receive is cancelled
            before the stream's end).
    """
    held = b""
    for volume in volumes:
        try:
            file = fetch.path(volume)
        except Exception as exc:
            raise _Unverified(exc) from exc
        for chunk in codec.decode_file(file, f"{store}:{volume.key}",
                                       raw_bytes=volume.raw_bytes):
            if first and fetch.failed():
                _wait_verified(fetch)
            if held:
                yield held
            held = chunk
    if first:
        _wait_verified(fetch)
    if held:
        yield held


def _wait_verified(fetch: VolumeFetch) -> None:
    try:
        fetch.wait_all()
    except Exception as exc:
        raise _Unverified(exc) from exc


def _stream_rejected(exc: BaseException, receive: list[str], host: str) -> bool:
    """True when a receive failed because of the stream's own bytes
    (docs/reliability.md#r12-valid-zstd-around-an-invalid-zfs-stream): zfs receive called it
    invalid, or its zstd frame failed while decoding for the receive."""
    if isinstance(exc, StreamCorrupt):
        return True
    return (isinstance(exc, PipelineFailed)
            and isinstance(receive_refusal(exc, receive, host), StreamInvalid))


def _mark_bad(ctx: Context, stream: StreamRow, problem: str, job: str | None) -> None:
    """Mark ``stream`` bad so no restore path uses it again, with the alert every bad mark
    raises (``archive.damage.mark_bad``); a catalog failure here is logged, never hides the
    receive error."""
    try:
        mark_bad(ctx.catalog(), stream, problem, ctx.clock.now(),
                 job=job, action="restore")
    except CatalogError as exc:
        log.error("could not mark stream %d bad in the catalog: %s", stream.id, exc)
    else:
        log.error("stream %d marked bad in the catalog: %s", stream.id, problem)


def _trim(ctx: Context, plan: RestorePlan, later: list[str]) -> None:
    """Destroy the snapshots received after the target from the NEW dataset, then roll back."""
    if not later:
        return
    zfs = ctx.zfs(plan.into_host, DatasetName(plan.into).pool)
    for name in reversed(later):
        zfs.destroy_snapshot(SnapshotName.of(DatasetName(plan.into), name))
    zfs.rollback(SnapshotName.of(DatasetName(plan.into), plan.target.name))


def is_encrypted(zfs: Zfs, dataset: str) -> bool:
    """True when ``dataset``'s ``encryption`` is not ``off`` (``zfs.encryption``).

    Raises:
        DatasetNotFound, ZfsError, HostUnreachable.
    """
    return DatasetName(dataset) in probe_encryption(zfs, [DatasetName(dataset)]).encrypted


def _check_received(zfs: Zfs, plan: RestorePlan) -> bool:
    """Check the new dataset holds the target snapshot with its guid (readable without the
    key); return True when it is encrypted with its key not loaded, and warn how to unlock it.

    Raises:
        RestoreError: the snapshot is missing or has another guid.
    """
    into = DatasetName(plan.into)
    snapshot = SnapshotName.of(into, plan.target.name)
    got = zfs.get_properties(str(snapshot), ["guid"]).get("guid", "-")
    if got != str(plan.target.guid):
        raise RestoreError(f"{plan.into_host}:{snapshot} has guid {got} after the restore, expected"
                           f" {plan.target.guid}: the received data is not @{plan.target.name}"
                           f" of {plan.dataset}")
    if into not in probe_encryption(zfs, [into], keystatus=True).locked:
        return False
    log.warning("%s:%s is encrypted (raw stream) and its key is not loaded: run `zfs load-key"
                " %s` with the key or passphrase of %s, then `zfs mount %s`", plan.into_host, into,
                into, plan.dataset, into)
    return True


def _from_snapshots(ctx: Context, plan: RestorePlan) -> RestoreOutcome:
    chosen = plan.chosen
    assert chosen.host is not None and chosen.dataset is not None
    src = ctx.zfs(chosen.host, DatasetName(chosen.dataset).pool)
    dst = ctx.zfs(plan.into_host, DatasetName(plan.into).pool)
    # An encrypted source goes raw, as replication sends it: never decrypted into a new
    # dataset, and a replica (key not loaded there) can only be sent raw.
    raw = is_encrypted(src, chosen.dataset)
    refs = [SnapRef(s.name, s.guid, s.createtxg) for s in chosen.snapshots]
    # Continuing an interrupted restore, ``refs`` starts at the newest snapshot INTO holds.
    steps: list[Full | Incremental] = [] if plan.resumed else [Full(refs[0])]
    if len(refs) > 1:
        steps.append(Incremental(refs[0], refs[-1], intermediates=True))
    source, target = Side.of(ctx.config, chosen.host), Side.of(ctx.config, plan.into_host)
    total = 0
    for step in steps:
        # -c/-L/-e only as far as the --into pool has their features (zfs.sendrecv.stream_flags)
        send = send_argv(step, source_dataset=chosen.dataset, caps=src.capabilities, raw=raw,
                         receiver=dst.capabilities, zfs=src.zfs)
        receive = receive_argv(plan.into, caps=dst.capabilities, resumable=False, zfs=dst.zfs)
        on_host = chosen.host == plan.into_host and target.config is not None
        if on_host:
            # A copy on the replica's own host stays there: one `zfs send | zfs receive` the
            # host runs (docs/decisions.md#a-replica-is-drilled-on-its-own-host); no byte
            # crosses this machine, so none is counted here.
            stages, meter = target.wrap([send, receive], "zfs send | zfs receive"), Meter.WRITTEN
        else:
            # Counted where a process of the pipeline really moves the stream (zfs-fuse's
            # daemon, not its zfs send, writes it: transport.stages.metered_transfer).
            # compress: zstd on the wire, only where a side is remote (metered_transfer).
            stages, meter = metered_transfer(
                send, receive, source=source, target=target, bandwidth_limit=None,
                compress=True, send_writes_stream=src.capabilities.send_writes_stream,
                share=False)
        label = f"{chosen.dataset}@{step.to.name} -> {plan.into}"
        expected = expected_size(src, send, full=(f"{chosen.dataset}@{step.to.name}"
                                                  if isinstance(step, Full) else None))
        moved = run_pipeline(stages, meter=meter, progress=_reporter(
            ctx, plan, label, dataset=chosen.dataset, to_snap=step.to.name,
            from_snap=step.base.name if isinstance(step, Incremental) else None,
            total=expected.bytes, expected_source=expected.source)).bytes
        total += 0 if on_host else moved  # on the host: only the ssh's own traffic counted
        if isinstance(step, Full) and len(steps) > 1:
            _mark(dst, plan, mark_value(plan.host, str(plan.dataset)))
    locked = _check_received(dst, plan)
    _mark(dst, plan, None)
    return RestoreOutcome(plan.into, len(steps), total, locked)


def _reporter(ctx: Context, plan: RestorePlan, label: str, **what: Any) -> ProgressReporter:
    """A progress reporter (bar or log lines) that also publishes the restore for
    ``zbak status`` (``zrepl_py.observe.transfers``, kind ``restore``, keyed by the new dataset)."""
    what.setdefault("dataset", plan.dataset)
    what.setdefault("to_snap", plan.target.name)
    job = job_of(ctx.config, plan.host, plan.dataset)
    return reporting(ctx.state_dir, "restore", job, plan.into)(label, **what)
