"""argv builders for ``zfs send``, ``zfs receive`` and ``zfs receive -A`` (pure, no I/O).

The replication driver pipes ``send_argv(...)`` into ``receive_argv(...)`` (possibly through
zstd and ssh); this module only decides the flags. Every name passes through
DatasetName/SnapshotName/BookmarkName and a token through ``resume.check_token`` first.

Send flags used (zfs-send(8), OpenZFS 2.3):

- ``-w`` (``--raw``): send an encrypted dataset exactly as on disk; the receiver never sees
  the key and the replica stays encrypted. Used only when asked (``raw=True``, i.e. the
  source is encrypted, RELIABILITY 38) and the host has it (``caps.raw_send``, OpenZFS 0.8+).
  ``-w`` implies ``-L -e -c`` (zfs_main.c ``zfs_do_send``), so nothing else is added.
- ``-c`` (``--compressed``): send blocks compressed as they are on disk instead of
  decompressing them (needs ``caps.compressed_send``, OpenZFS 0.7+; the receiver must have
  the pool's compression features, e.g. lz4_compress).
- ``-L`` (``--large-block``): allow blocks over 128 KiB instead of splitting them; the
  receiver needs the large_blocks feature. Once a dataset was received with ``-L`` every
  later incremental must use it too, so the flag follows the capabilities, not the data.
- ``-e`` (``--embed``): send WRITE_EMBEDDED records for tiny blocks stored in the block
  pointer; the receiver needs embedded_data, and such a stream cannot be received as a NEW
  encrypted dataset (zfs-send(8) ``-e``).
  ``-L`` and ``-e`` came with OpenZFS 0.6.5, before ``-c`` (0.7), so ``caps.compressed_send``
  is the test for all three; zfs-fuse (``send [-RDp] [-[iI] snapshot]``) has none of them.
- ``-I BASE`` sends every snapshot between BASE and the target snapshot; ``-i BASE`` only the
  target. A bookmark base (``DS#BM``) is accepted by ``-i`` only.
- ``-t TOKEN`` resumes an interrupted stream; the token carries the original flags, so none
  are added.
- Never ``-R`` (replication package: would also send children, properties and, with
  ``receive -F``, destroy on the target) and never ``-p`` (properties such as ``mountpoint``
  would follow the stream onto the backup host); zbak replicates dataset by dataset.

Receive flags used (zfs-receive(8)):

- ``-u``: do not mount the received file system, so a replica never mounts over the backup
  host's own tree (e.g. a source with ``mountpoint=/``).
- ``-s``: keep a partially received stream and set ``receive_resume_token`` if the transfer
  is interrupted (needs ``caps.resume_tokens``, OpenZFS 0.7+ and
  ``feature@extensible_dataset``).
- Never ``-F``: it would roll back and destroy target snapshots and datasets silently; a
  diverged target is reported instead (DESIGN.md "Replication").
"""

from __future__ import annotations

import dataclasses

from zrepl_py.errors import SendArgsInvalid
from zrepl_py.zfs.capabilities import Capabilities
from zrepl_py.zfs.names import BookmarkName, DatasetName, SnapshotName
from zrepl_py.zfs.resume import check_token
from zrepl_py.zfs.steps import BookmarkRef, Full, Incremental, Resume, SnapRef, Step


def stream_capabilities(source: Capabilities, target: Capabilities) -> Capabilities:
    """Return what a stream between two hosts may use: each feature both sides have.

    Pass the result as ``caps`` to ``send_argv`` and ``receive_argv`` when source and
    target differ (a ``-c``/``-L``/``-e`` stream from OpenZFS cannot be received by
    zfs-fuse, and ``-s`` needs the receiving side).
    """
    joined = {}
    for field in dataclasses.fields(Capabilities):
        mine, theirs = getattr(source, field.name), getattr(target, field.name)
        if isinstance(mine, bool):
            joined[field.name] = mine and theirs
        elif mine is None or theirs is None:
            joined[field.name] = None
        else:
            joined[field.name] = min(mine, theirs)
    return Capabilities(**joined)


def _snapshot(dataset: DatasetName, ref: SnapRef) -> SnapshotName:
    if not isinstance(ref, SnapRef):
        raise SendArgsInvalid(f"expected a snapshot of {dataset}, got {ref!r}")
    return SnapshotName.of(dataset, ref.name)


def _base(dataset: DatasetName, base: SnapRef | BookmarkRef) -> str:
    if isinstance(base, BookmarkRef):
        return BookmarkName(f"{dataset}#{base.name}")
    return _snapshot(dataset, base)


def send_argv(
    step: Step,
    *,
    source_dataset: str,
    caps: Capabilities,
    raw: bool,
    zfs: str = "zfs",
) -> list[str]:
    """Build the ``zfs send`` argv for one send step of a replication plan.

    Args:
        step: ``Full`` -> ``zfs send [-w | -c -L -e] DS@to``; ``Incremental`` ->
            ``zfs send [flags] -I DS@base DS@to`` (or ``-i`` without intermediates,
            ``-i DS#bm DS@to`` from a bookmark); ``Resume`` -> ``zfs send -t TOKEN``.
        source_dataset: the dataset on the sending host the step's short names belong to.
        caps: what the stream may use (the sending host's capabilities, or
            ``stream_capabilities(source, target)``).
        raw: send raw (``-w``); pass True exactly when the source dataset is encrypted.
        zfs: the zfs command on the sending host.

    Returns:
        the argv, e.g. ``["zfs", "send", "-c", "-L", "-e", "-I", "tank/d@a", "tank/d@c"]``.

    Raises:
        SendArgsInvalid: ``raw`` where ``caps.raw_send`` is False; a Resume without
            ``caps.resume_tokens``, whose token belongs to another dataset than
            ``source_dataset`` or whose raw flag differs from ``raw`` (RELIABILITY 4);
            a step that is not a send (AbortResume, Rollback).
        InvalidName: a name breaks the ZFS naming rules.
        ResumeTokenInvalid: a malformed token.
    """
    dataset = DatasetName(source_dataset)
    if raw and not caps.raw_send:
        raise SendArgsInvalid(
            f"{dataset} is encrypted and must be sent raw (zfs send -w), but this zfs has no "
            "raw send; refusing to send it decrypted. Upgrade to OpenZFS 0.8 or later"
        )
    if isinstance(step, Resume):
        token = step.token
        if not caps.resume_tokens:
            raise SendArgsInvalid(f"cannot resume {token.toname}: this zfs has no send -t")
        if token.dataset != dataset:
            raise SendArgsInvalid(
                f"refusing to resume: the token is for {token.toname}, not for {dataset}"
            )
        if token.raw != raw:
            mode = "raw" if token.raw else "non-raw"
            raise SendArgsInvalid(
                f"refusing to resume {token.toname}: the token is for a {mode} stream but "
                f"this send is {'raw' if raw else 'not raw'}; abort it (zfs receive -A)"
            )
        return [zfs, "send", "-t", check_token(token.token)]
    if raw:
        flags = ["-w"]
    elif caps.compressed_send:
        flags = ["-c", "-L", "-e"]
    else:
        flags = []
    if isinstance(step, Full):
        return [zfs, "send", *flags, _snapshot(dataset, step.to)]
    if isinstance(step, Incremental):
        if step.intermediates and isinstance(step.base, BookmarkRef):
            raise SendArgsInvalid("zfs send -I does not take a bookmark as its base")
        how = "-I" if step.intermediates else "-i"
        return [zfs, "send", *flags, how, _base(dataset, step.base), _snapshot(dataset, step.to)]
    raise SendArgsInvalid(f"{type(step).__name__} is not a send step")


def receive_argv(
    target_dataset: str, *, caps: Capabilities, resumable: bool, zfs: str = "zfs"
) -> list[str]:
    """Build ``zfs receive -u [-s] TARGET`` (never ``-F``).

    Args:
        target_dataset: the dataset to receive into (created by a full stream, updated by
            an incremental one).
        caps: the receiving host's capabilities.
        resumable: ask for ``-s`` (kept partial state and a resume token on interruption);
            added only where ``caps.resume_tokens``.
        zfs: the zfs command on the receiving host.

    Raises:
        InvalidName: a bad dataset name.
    """
    resume = ["-s"] if resumable and caps.resume_tokens else []
    return [zfs, "receive", "-u", *resume, DatasetName(target_dataset)]


def abort_argv(target_dataset: str, *, zfs: str = "zfs") -> list[str]:
    """Build ``zfs receive -A TARGET``: discard the target's partially received state
    (zfs-receive(8) ``-A``; for an interrupted full receive that destroys the new dataset).

    Raises:
        InvalidName: a bad dataset name.
    """
    return [zfs, "receive", "-A", DatasetName(target_dataset)]
