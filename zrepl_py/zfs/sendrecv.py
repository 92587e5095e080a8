"""argv builders for ``zfs send``, ``zfs receive`` and ``zfs receive -A`` (pure, no I/O).

The replication driver pipes ``send_argv(...)`` into ``receive_argv(...)`` (possibly through
zstd and ssh); this module only decides the flags. Every name passes through
DatasetName/SnapshotName/BookmarkName and a token through ``resume.check_token`` first.

Send flags used (zfs-send(8), OpenZFS 2.3):

- ``-w`` (``--raw``): send an encrypted dataset exactly as on disk; the receiver never sees
  the key and the replica stays encrypted. Used only when asked (``raw=True``, i.e. the
  source is encrypted, docs/reliability.md#r38-encrypted-datasets) and the host has it
  (``caps.raw_send``, OpenZFS 0.8+). ``-w`` implies ``-L -e -c`` (zfs_main.c ``zfs_do_send``), so
  nothing else is added.
- ``-c`` (``--compressed``): send blocks compressed as they are on disk instead of
  decompressing them (needs ``caps.compressed_send``, OpenZFS 0.7+).
- ``-L`` (``--large-block``): allow blocks over 128 KiB instead of splitting them. Once a
  dataset was received with ``-L`` every later incremental must use it too, so the flag
  follows the receiving pool's features, not the data.
- ``-e`` (``--embed``): send WRITE_EMBEDDED records for tiny blocks stored in the block
  pointer; such a stream cannot be received as a NEW encrypted dataset (zfs-send(8) ``-e``).
  ``-L`` and ``-e`` came with OpenZFS 0.6.5, before ``-c`` (0.7), so ``caps.compressed_send``
  is the test for all three; zfs-fuse (``send [-RDp] [-[iI] snapshot]``) has none of them.
- Each of ``-c -L -e`` is used only when the RECEIVING pool can take what it puts in the
  stream (``stream_flags``): a pool created with ``zpool create -d`` or
  ``compatibility=legacy`` answers "pool must be upgraded to receive this stream" to any of
  them (seen on OpenZFS 2.3.2), while a plain send works there.
- ``-p``: include the dataset's properties (``properties=True``, ``[replicate] properties``);
  the receive's ``-o``/``-x`` (``zfs.properties``) keep the backup host's own ones.
- ``-I BASE`` sends every snapshot between BASE and the target snapshot; ``-i BASE`` only the
  target. A bookmark base (``DS#BM``) is accepted by ``-i`` only.
- ``-t TOKEN`` resumes an interrupted stream; the token carries the original flags, so none
  are added.
- Never ``-R`` (replication package: would also send children and, with ``receive -F``,
  destroy on the target); zbak replicates dataset by dataset.

Receive flags used (zfs-receive(8)):

- ``-u``: do not mount the received file system, so a replica never mounts over the backup
  host's own tree (e.g. a source with ``mountpoint=/``).
- ``-o PROP=VALUE`` / ``-x PROP``: the job's ``zfs.properties.ReceiveProperties``, where
  the receiving zfs has them (``caps.receive_properties``; not zfs-fuse).
- ``-s``: keep a partially received stream and set ``receive_resume_token`` if the transfer
  is interrupted (needs ``caps.resume_tokens``, OpenZFS 0.7+ and
  ``feature@extensible_dataset``).
- Never ``-F``: it would roll back and destroy target snapshots and datasets silently; a
  diverged target is reported instead (docs/design.md#replication).
"""

from __future__ import annotations

from zrepl_py.errors import SendArgsInvalid
from zrepl_py.zfs.capabilities import Capabilities
from zrepl_py.zfs.names import BookmarkName, DatasetName, SnapshotName
from zrepl_py.zfs.properties import ReceiveProperties
from zrepl_py.zfs.resume import check_token
from zrepl_py.zfs.steps import BookmarkRef, Full, Incremental, Resume, SnapRef, Step


def stream_flags(sender: Capabilities, receiver: Capabilities | None) -> list[str]:
    """The stream flags of a send from ``sender`` that ``receiver``'s pool can receive.

    What a flag puts in the stream and what the receiving pool then needs, from OpenZFS
    ``dmu_send.c`` ``setup_featureflags`` and ``dmu_recv.c``
    ``recv_begin_check_feature_flags_impl``:

    - ``-L``: LARGE_BLOCKS when the dataset has blocks over 128 KiB; the receiving pool needs
      ``large_blocks``. Used whenever the receiving pool has it, so every stream of a
      dataset is sent alike.
    - ``-e``: EMBED_DATA when the sending pool's ``embedded_data`` is active, plus LZ4 when
      its ``lz4_compress`` is; the receiving pool needs ``embedded_data`` (and
      ``lz4_compress``).
    - ``-c``: LZ4 when the sending pool's ``lz4_compress`` is active and ZSTD when its
      ``zstd_compress`` is; the receiving pool needs those features.

    Args:
        sender: the sending host's capabilities and pool features.
        receiver: the receiving host's and pool's, or None when the receiver is not known:
            then ``-c -L -e`` follow the sender alone.

    Returns:
        a subset of ``["-c", "-L", "-e"]``, in that order (``[]`` when either zfs lacks
        them, e.g. zfs-fuse). An encrypted dataset is sent ``-w`` instead (``send_argv``).
    """
    if not sender.compressed_send or (receiver is not None and not receiver.compressed_send):
        return []
    if receiver is None:
        return ["-c", "-L", "-e"]

    def takes(feature: str) -> bool:
        return receiver.feature_enabled(feature) or not sender.feature_active(feature)

    flags = []
    if takes("lz4_compress") and takes("zstd_compress"):
        flags.append("-c")
    if receiver.feature_enabled("large_blocks"):
        flags.append("-L")
    if receiver.feature_enabled("embedded_data") and takes("lz4_compress"):
        flags.append("-e")
    return flags


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
    receiver: Capabilities | None = None,
    properties: bool = False,
    zfs: str = "zfs",
) -> list[str]:
    """Build the ``zfs send`` argv for one send step of a replication plan.

    Args:
        step: ``Full`` -> ``zfs send [-w | -c -L -e] [-p] DS@to``; ``Incremental`` ->
            ``zfs send [flags] [-p] -I DS@base DS@to`` (or ``-i`` without intermediates,
            ``-i DS#bm DS@to`` from a bookmark); ``Resume`` -> ``zfs send -t TOKEN``.
        source_dataset: the dataset on the sending host the step's short names belong to.
        caps: the sending host's capabilities and pool features.
        raw: send raw (``-w``); pass True exactly when the source dataset is encrypted.
        receiver: the receiving host's capabilities and pool features (``stream_flags``);
            None when it is not known.
        properties: add ``-p`` (the dataset's properties travel with the stream).
        zfs: the zfs command on the sending host.

    Returns:
        the argv, e.g. ``["zfs", "send", "-c", "-L", "-e", "-I", "tank/d@a", "tank/d@c"]``.

    Raises:
        SendArgsInvalid: ``raw`` where ``caps.raw_send`` is False; a Resume without
            ``caps.resume_tokens``, whose token belongs to another dataset than
            ``source_dataset`` or whose raw flag differs from ``raw``
            (docs/reliability.md#r4-token-for-another-operation-is-rejected); a step that is not a
            send (AbortResume, Rollback).
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
        if not caps.resume_tokens or (receiver is not None and not receiver.resume_tokens):
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
    flags = ["-w"] if raw else stream_flags(caps, receiver)
    if properties:
        flags.append("-p")
    if isinstance(step, Full):
        return [zfs, "send", *flags, _snapshot(dataset, step.to)]
    if isinstance(step, Incremental):
        if step.intermediates and isinstance(step.base, BookmarkRef):
            raise SendArgsInvalid("zfs send -I does not take a bookmark as its base")
        how = "-I" if step.intermediates else "-i"
        return [zfs, "send", *flags, how, _base(dataset, step.base), _snapshot(dataset, step.to)]
    raise SendArgsInvalid(f"{type(step).__name__} is not a send step")


def receive_argv(
    target_dataset: str,
    *,
    caps: Capabilities,
    resumable: bool,
    properties: ReceiveProperties | None = None,
    zfs: str = "zfs",
) -> list[str]:
    """Build ``zfs receive -u [-s] [-o PROP=VALUE]... [-x PROP]... TARGET`` (never ``-F``).

    Args:
        target_dataset: the dataset to receive into (created by a full stream, updated by
            an incremental one).
        caps: the receiving host's capabilities.
        resumable: ask for ``-s`` (kept partial state and a resume token on interruption);
            added only where ``caps.resume_tokens``.
        properties: what to set and exclude (already fitted to the dataset's type with
            ``ReceiveProperties.for_kind``); added only where ``caps.receive_properties``
            (the driver applies them with ``zfs set``/``zfs inherit`` elsewhere).
        zfs: the zfs command on the receiving host.

    Raises:
        InvalidName: a bad dataset name.
    """
    resume = ["-s"] if resumable and caps.resume_tokens else []
    props = properties.receive_args() if properties and caps.receive_properties else []
    return [zfs, "receive", "-u", *resume, *props, DatasetName(target_dataset)]


def abort_argv(target_dataset: str, *, zfs: str = "zfs") -> list[str]:
    """Build ``zfs receive -A TARGET``: discard the target's partially received state
    (zfs-receive(8) ``-A``; for an interrupted full receive that destroys the new dataset).

    Raises:
        InvalidName: a bad dataset name.
    """
    return [zfs, "receive", "-A", DatasetName(target_dataset)]
