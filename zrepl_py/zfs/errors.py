"""Translate a failed zfs/zpool command into a typed ZfsError
(docs/style.md#typed-errors-at-the-boundary).

Callers catch types, never grep stderr: this module is the one place that reads the words.
The table covers the wording of OpenZFS 2.x and of zfs-fuse 0.7 (pool v23); sources:

- OpenZFS ``lib/libzfs/libzfs_util.c`` (``zfs_standard_error_fmt``: ENOENT "dataset does not
  exist", EEXIST "dataset already exists", EBUSY "dataset is busy", EPERM "permission
  denied", ENOTSUP "unsupported version"; EZFS_REFTAG_HOLD "tag already exists on this
  dataset", EZFS_REFTAG_RELE "no such tag on this dataset");
- OpenZFS ``cmd/zfs/zfs_main.c`` (``destroy_check_dependent``: "snapshot has dependent
  clones"; ``zfs_do_destroy``: "could not find any snapshots to destroy; check snapshot
  names."; a held snapshot: "it's being held. Run 'zfs holds -r ...' to see holders.",
  seen on OpenZFS 2.3.2 in the test bed's guest, docs/testbed.md#the-openzfs-guest);
- OpenZFS ``lib/libzfs/libzfs_dataset.c`` (``zfs_destroy_snaps_nvl``: "snapshot is cloned";
  ``zfs_create``/``check_parents``: "no such parent", "parent does not exist");
- zbak serve (``serve.floor.refusal``): "... is kept by the floor of zbak serve: ..." when
  its floor keeps a snapshot the request would destroy (exit 126);
- zfs-fuse, observed: a held snapshot says only "dataset is busy" (the client tells it
  apart by reading ``userrefs``), ``zfs holds`` says "internal error:
  /usr/lib/zfs/pyzfs.py not found" (on stdout, exit 255: the client passes stdout when
  stderr is empty), ``zfs snapshot a@x b@y`` says "too many arguments",
  unknown flags "invalid option 'p'", unknown properties "bad property list: invalid
  property 'receive_resume_token'", a non-root user "connect: Permission denied".

``classify_receive`` reads a failed ``zfs receive``: the words above, plus those of a stream
the receiver cannot take (``StreamUnsupported``): OpenZFS ``lib/libzfs/libzfs_sendrecv.c``
"stream has unsupported feature, feature flags = %llx" (unknown ``DMU_BACKUP_FEATURE_*``
bits) and, for ENOTSUP from ``dmu_recv.c`` ``recv_begin_check_feature_flags_impl`` (a stream
feature whose pool feature is not enabled), "pool must be upgraded to receive this stream.";
a kernel that knows fewer stream features than its userland says "the loaded zfs module does
not support this operation" (``libzfs_util.c``, ``ZFS_ERR_UNKNOWN_SEND_STREAM_FEATURE``), and
EZFS_BADVERSION without detail prints "unsupported version" (zfs-fuse) or "unsupported
version or feature" (OpenZFS). zfs-fuse 0.7, observed receiving an OpenZFS 2.3.2 stream:
"cannot receive: stream has unsupported feature, feature flags = 4" (plain send; 420004 with
``-c``, 30004 with ``-e``, 430004 with ``-w``), exit 1. Two more refusals of a receive:
``TargetModified`` (libzfs ``zfs_receive_one``: "destination %s has been modified since most
recent snapshot", the same in zfs-fuse 0.7 and OpenZFS 2.x) and ``StreamInvalid``, the
stream's own bytes (zfs-fuse 0.7, seen: "invalid stream (bad magic number)", "invalid stream
(checksum mismatch)", "invalid backup stream"; OpenZFS ``libzfs_sendrecv.c`` adds "checksum
mismatch or incomplete stream"); not "unsupported feature": that is the receiver's limit.

Other words read here: ``zfs rollback``'s "more recent snapshots or bookmarks exist" (OpenZFS
2.3.2, seen in the zfsvm guest; zfs-fuse "more recent snapshots exist", in the strings of
/usr/sbin/zfs), ``zfs bookmark``'s "bookmark exists" (OpenZFS 2.3, zfsvm guest), ``zfs send
-t``'s "resume token is corrupt (invalid format)" / "(incorrect checksum)" (OpenZFS 2.3.2,
tests/data/resume/), and the answers the capability probes (``zfs.capabilities``) read:
"invalid option 'c'" (``zfs_main.c`` ``usage``), "invalid character '%' in name"
(``zfs_name_valid``: the names were parsed one by one) and "missing snapshot argument" (the
options were accepted).
"""

from __future__ import annotations

import re

from zrepl_py.errors import (
    CommandFailed,
    DatasetBusy,
    DatasetExists,
    DatasetNotFound,
    HoldExists,
    HoldNotFound,
    KeptByFloor,
    NewerSnapshotsExist,
    PermissionDenied,
    PipelineCancelled,
    PipelineFailed,
    PipelineTimedOut,
    ResumeTokenRefused,
    SnapshotHasClones,
    SnapshotHeld,
    StreamInvalid,
    StreamUnsupported,
    TargetModified,
    Unsupported,
    ZfsError,
)
from zrepl_py.proc.mbuffer import without_buffer_noise

_FLOOR_MARK = "is kept by the floor of zbak serve: "
"""The words of a floor refusal (``serve.floor.refusal``)."""

# First match wins, so narrower wordings come before the generic ones they contain
# ("tag already exists" before "already exists", "snapshot has dependent clones" before
# anything mentioning "destroy").
_TABLE: tuple[tuple[re.Pattern[str], type[ZfsError]], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), cls)
    for pattern, cls in (
        (re.escape(_FLOOR_MARK.strip()), KeptByFloor),
        (r"resume token is corrupt|invalid resume token|token.*(?:invalid|corrupt)",
         ResumeTokenRefused),
        (r"more recent snapshots", NewerSnapshotsExist),
        (r"it's being held|snapshot is held|has user holds", SnapshotHeld),
        (r"snapshot has dependent clones|snapshot is cloned", SnapshotHasClones),
        (r"tag already exists", HoldExists),
        (r"no such tag", HoldNotFound),
        (
            r"invalid option|unrecognized command|too many arguments"
            r"|bad property list: invalid property|invalid property '"
            r"|pyzfs\.py not found|unsupported version|pool must be upgraded"
            r"|operation not supported|not supported by|feature .*(?:not enabled|disabled)",
            Unsupported,
        ),
        (r"permission denied|operation not permitted|must be run as root", PermissionDenied),
        (
            r"does not exist|no such pool|no such dataset|no such parent"
            r"|could not find any snapshots",
            DatasetNotFound,
        ),
        (r"already exists|destination '.*' exists|bookmark exists", DatasetExists),
        (r"\bbusy\b", DatasetBusy),
    )
)


def floor_reasons(exc: KeptByFloor) -> str:
    """The reasons serve's floor gave for keeping the snapshot (its refusal after
    ``_FLOOR_MARK``), or the whole message when it has another shape."""
    text = exc.stderr.strip()
    return text.partition(_FLOOR_MARK)[2] or text


def classify(stderr: str) -> type[ZfsError]:
    """Return the ZfsError subclass for a zfs/zpool stderr text (``ZfsError`` if none fits).

    Args:
        stderr: the command's standard error, any case, may span several lines.
    """
    for pattern, cls in _TABLE:
        if pattern.search(stderr):
            return cls
    return ZfsError


_RECEIVE_TABLE: tuple[tuple[re.Pattern[str], type[ZfsError]], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), cls)
    for pattern, cls in (
        (r"has been modified\s+since most recent snapshot", TargetModified),
        (
            r"stream has unsupported feature|pool must be upgraded to receive"
            r"|module does not support this operation|unsupported version",
            StreamUnsupported,
        ),
        (r"invalid (?:backup )?stream|checksum mismatch|bad magic number|incomplete stream",
         StreamInvalid),
    )
)


def classify_receive(stderr: str) -> type[ZfsError]:
    """Return the ZfsError subclass for the stderr of a failed ``zfs receive``.

    ``TargetModified``, ``StreamUnsupported`` or ``StreamInvalid`` when the receiver refused
    the stream (see the module doc for the wordings), else what ``classify`` says.

    Args:
        stderr: the receive's standard error (any case, several lines).
    """
    for pattern, cls in _RECEIVE_TABLE:
        if pattern.search(stderr):
            return cls
    return classify(stderr)


def receive_refusal(failed: PipelineFailed, argv: list[str], host: str) -> ZfsError | None:
    """The refusal of the ``zfs receive`` that ends ``failed``'s pipeline, as a typed error.

    The receive is the last stage; when it refuses the stream the sender dies of the closed
    pipe, sometimes (an ssh exiting 255 without a word) before zbak stops it, so the stage the
    pipeline blamed may be the sender: the receiver's own words decide.

    Args:
        failed: what ``run_pipeline`` raised.
        argv: the receive's argv, for the error.
        host: where the receive ran.

    Returns:
        a ``TargetModified``, ``StreamUnsupported`` or ``StreamInvalid`` carrying ``argv``,
        the receive's exit status and its stderr without mbuffer's noise (the caller raises
        it ``from failed``); None when the pipeline was cancelled or timed out, the receive
        did not fail, or it failed for another reason.
    """
    last = failed.stages[-1] if failed.stages else None
    if isinstance(failed, (PipelineCancelled, PipelineTimedOut)) or last is None or not last.failed:
        return None
    cls = classify_receive(last.stderr)
    if cls not in (TargetModified, StreamUnsupported, StreamInvalid):
        return None
    return cls(argv, last.returncode, without_buffer_noise(last.stderr).strip(), host)


def refused_option(stderr: str) -> str | None:
    """The option zfs refused as unknown: ``"c"`` for "invalid option 'c'", the whole word
    for "unrecognized option '--x'"; None when it refused none."""
    found = _REFUSED_OPTION.search(stderr)
    return None if found is None else found.group(1) or found.group(2)


_REFUSED_OPTION = re.compile(r"invalid option '(.)'|unrecognized option '?([^'\s]*)")


def parsed_names(stderr: str) -> bool:
    """True when zfs refused a name for a character in it ("invalid character '%' in
    name"): it took each of several names on one command line as a name."""
    return "invalid character" in stderr


def wants_snapshot(stderr: str) -> bool:
    """True when ``zfs receive`` stopped at "missing snapshot argument": it accepted every
    option before it."""
    return "missing snapshot argument" in stderr


def map_error(exc: CommandFailed) -> ZfsError:
    """Return the typed error for a failed zfs/zpool command, keeping its details.

    Args:
        exc: what the Executor raised; argv, returncode, stderr and host are copied to the
            new exception. A ZfsError is returned as it is (already mapped). A timeout
            (``returncode`` None) or a missing binary maps to plain ``ZfsError``.

    Returns:
        an instance of DatasetNotFound, DatasetExists, DatasetBusy, PermissionDenied,
        Unsupported, SnapshotHeld, SnapshotHasClones, HoldExists, HoldNotFound, KeptByFloor
        or ZfsError;
        the caller raises it ``from exc``.
    """
    if isinstance(exc, ZfsError):
        return exc
    cls = classify(exc.stderr) if exc.returncode is not None else ZfsError
    return cls(exc.argv, exc.returncode, exc.stderr, exc.host)
