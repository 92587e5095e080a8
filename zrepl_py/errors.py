"""The zbak error hierarchy and the process exit codes it maps to.

Every error zbak raises on purpose is a ``ZbakError``; each subclass carries the
``ExitStatus`` the command line returns for it (borg's errors.py pattern). Messages say
what was being done, on which dataset/host/object, and what to do next.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol


class ExitStatus(enum.IntEnum):
    """Process exit codes; the API scripts and systemd units rely on (docs/design.md#exit-codes)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    LOCKED = 3
    AUDIT_FINDINGS = 4
    THAW_PENDING = 75  # EX_TEMPFAIL from sysexits.h: run again later

    @classmethod
    def help_table(cls) -> str:
        """Return the exit-code table printed at the end of ``zbak --help``."""
        meaning = {
            cls.OK: "done",
            cls.FAILED: "failed",
            cls.USAGE: "bad usage or config (the message names the key and the file)",
            cls.LOCKED: "nothing done: another run holds the lock",
            cls.AUDIT_FINDINGS: "audit found a problem",
            cls.THAW_PENDING: "waiting for a cold-object thaw; run again later",
        }
        return "\n".join(f"  {int(code):>3}  {meaning[code]}" for code in cls)


class ZbakError(Exception):
    """Base of every error zbak raises on purpose; ``exit_status`` is what the CLI returns."""

    exit_status: ExitStatus = ExitStatus.FAILED

    def lines(self) -> list[str]:
        """The message as the lines to show: one, unless a subclass lists several (each
        is shown with its control characters escaped, so a quoted name cannot add a line)."""
        return [str(self)]


class UsageError(ZbakError):
    """The command line itself is wrong (unknown job, missing argument)."""

    exit_status = ExitStatus.USAGE


class ConfigError(ZbakError):
    """The config file is missing, unreadable or invalid.

    Args:
        path: the config file.
        problems: one ``(key_path, message)`` per problem, key_path dotted
            (``jobs.nightly.snapshot.retention.daily``) or ``""`` for the whole file.
    """

    exit_status = ExitStatus.USAGE

    def __init__(self, path: str, problems: list[tuple[str, str]]):
        self.path = path
        self.problems = problems
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        """``invalid config PATH: KEY: MESSAGE`` for one problem; for several, ``invalid
        config PATH:`` then one indented line per problem."""
        if len(self.problems) == 1:
            ((key, msg),) = self.problems
            return [f"invalid config {self.path}: {key or '<file>'}: {msg}"]
        return [f"invalid config {self.path}:",
                *(f"  {key or '<file>'}: {msg}" for key, msg in self.problems)]


class ExtraMissing(UsageError):
    """The config needs an optional dependency that is not installed: boto3 for an ``s3://``
    store (``zbak[s3]``), psycopg for a PostgreSQL catalog (``zbak[postgresql]``).

    Args:
        needs: one ``(user, module, extra, reason)`` per missing dependency: what needs it
            (``"store cold"``), the module, the pip extra that installs it, and the import's
            own error when the module is there but broken (None when it is simply absent).
    """

    def __init__(self, needs: list[tuple[str, str, str, str | None]]):
        self.needs = needs
        # One line (``USER needs MODULE: pip install 'zbak[EXTRA]'``, joined by "; "), so
        # a job's error line and a recorded run carry all of it.
        super().__init__("; ".join(
            f"{user} needs {module}{f' ({reason})' if reason else ''}: pip install 'zbak[{extra}]'"
            for user, module, extra, reason in needs))


class InvalidName(ZbakError):
    """A dataset, snapshot, bookmark or hold name breaks the OpenZFS naming rules."""

    exit_status = ExitStatus.USAGE


class InvalidEndpoint(InvalidName, ValueError):
    """A ``HOST:POOL/PATH`` (or ``HOST:/dir``) value does not parse. A ValueError too, so the
    config schema's validators report it under the key that holds it."""


class InvalidProperty(InvalidName, ValueError):
    """A ZFS property name or value zbak refuses to pass to ``zfs receive -o/-x``, ``zfs
    set`` or ``zfs inherit`` (``zfs.properties``). A ValueError too, so the config schema
    reports it under the key that holds it."""


class UnsafeDirectory(ZbakError):
    """A directory zbak keeps private state in already exists and is shared: writable by
    group or others, or owned by another user. zbak never changes its mode
    (docs/decisions.md#a-shared-state-directory-is-refused)."""

    exit_status = ExitStatus.USAGE


class Locked(ZbakError):
    """Another zbak run holds the lock for this dataset or target."""

    exit_status = ExitStatus.LOCKED


class CommandFailed(ZbakError):
    """An external command (zfs, zpool, ssh, rsync) exited non-zero.

    Attributes:
        argv: the command as run (never contains secrets: see docs/style.md#secrets-are-a-type).
        returncode: its exit status; ``None`` when it was killed or timed out.
        stderr: its standard error, decoded, stripped.
        host: the host it ran on, ``"local"`` for this machine.
    """

    def __init__(self, argv: list[str], returncode: int | None, stderr: str, host: str = "local"):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        self.host = host
        shown = " ".join(self.argv)
        super().__init__(f"[{host}] `{shown}` exited {returncode}: {stderr or '(no stderr)'}")


class SourceMissing(ZbakError):
    """A job's source dataset, or its whole pool, does not exist (``zrepl_py.checks.source``); the
    message names the job and the config file, as a config error does."""


class ZfsError(CommandFailed):
    """A zfs/zpool command failed for a reason not mapped to a narrower class."""


class DatasetNotFound(ZfsError):
    """The dataset, snapshot or pool does not exist."""


class DatasetExists(ZfsError):
    """The dataset or snapshot to be created exists already."""


class DatasetBusy(ZfsError):
    """The dataset is busy (mounted, held or being received); often passes after a moment."""


class PermissionDenied(ZfsError):
    """The zfs operation is not allowed for this user (see ``zfs allow``)."""


class Unsupported(ZfsError):
    """The host's ZFS does not support the requested feature or flag."""


class SnapshotHeld(ZfsError):
    """A snapshot cannot be destroyed because it carries user holds."""


class KeptByFloor(ZfsError):
    """``zbak serve`` on the other host refused to destroy a snapshot, or to roll back past
    one, because its floor keeps it (``--keep-newer-than``/``--keep-last``: young by that
    host's clock, or among the newest of its dataset). Prune reports it as kept, not as a
    failure (``docs/design.md#security``)."""


class HostUnreachable(ZbakError):
    """An SSH host could not be reached or refused the login."""


class LoginRefused(HostUnreachable):
    """The SSH host refused the login (the key is not authorised, or the identity file cannot
    be read): trying again does not help until the admin changes something."""


class HostKeyMismatch(ZbakError):
    """The SSH host key is unknown or differs from known_hosts; no data was sent."""


class CatalogError(ZbakError):
    """The catalog database rejected an operation or is out of date."""


class ChainBroken(CatalogError):
    """An insert or delete would break a stream chain (guid continuity, missing parent)."""


class CatalogNotCurrent(CatalogError):
    """The catalog schema is missing or not at the migrations' head: run ``zbak init``."""


class CatalogUnavailable(CatalogError):
    """The catalog database cannot be reached or opened (server down, locked, bad path)."""


class CatalogConflict(CatalogError):
    """A write clashed with a row already in the catalog (duplicate key or illegal change)."""


class NotInCatalog(CatalogError):
    """The run, stream or other row named by id is not in the catalog."""


class HostKeyUnknown(HostKeyMismatch):
    """The SSH host offered a key known_hosts has no entry for, and trust_on_first_use is off.

    A HostKeyMismatch, so callers that treat both alike catch one type; no data was sent.
    """


class SnapshotHasClones(ZfsError):
    """A snapshot cannot be destroyed because clones depend on it (``zfs destroy`` without -R).

    OpenZFS and zfs-fuse say "snapshot has dependent clones"; OpenZFS says "snapshot is
    cloned" when a clone appears between its own check and the destroy.
    """


class HoldExists(ZfsError):
    """``zfs hold`` failed: the snapshot already carries a hold with this tag."""


class HoldNotFound(ZfsError):
    """``zfs release`` failed: the snapshot carries no hold with this tag."""


class HoldNotReleased(ZbakError):
    """The new replication base (or archive tip) was held and the cursor moved, but zfs
    refused to release the hold on the old one (``zfs.protect``): nothing is lost,
    but that snapshot cannot be destroyed until the hold goes (``zbak holds
    release-stale``); the message names each snapshot, tag and zfs's answer."""


class Diverged(ZbakError):
    """A replica target has snapshots or writes the source does not; nothing was changed on it.

    Set ``on_divergence = "rollback"`` on the job's ``[replicate]`` section to opt in to
    rolling the target back to the newest common snapshot (zbak still never destroys target
    snapshots it did not create).
    """


class FailedOver(ZbakError):
    """Replication refused a target dataset that carries a failover mark (``zbak:failover``,
    ``values.failover``): it is the live copy now, so nothing is received into it or rolled
    back, whatever the catalog says (docs/decisions.md#failed-over-is-recorded-on-the-replica).
    ``zbak failback`` brings the source back and makes it a replica again.

    Attributes:
        marks: ``{dataset: zbak:failover value}`` of the marked datasets.
    """

    def __init__(self, message: str, marks: dict[str, str]):
        self.marks = dict(marks)
        super().__init__(message)


class ReplicaPropertiesFailed(ZbakError):
    """A replica was received and confirmed, but zfs refused to set or inherit one of the
    job's replica properties on it (``[replicate] properties``); the message names each
    command and zfs's answer (a delegated user without that property's permission)."""


class StageEnd(Protocol):
    """How one pipeline stage ended, as ``PipelineFailed`` reads it
    (``proc.pipeline.StageResult``, which imports this module)."""

    @property
    def name(self) -> str: ...
    @property
    def argv(self) -> tuple[str, ...]: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def stderr(self) -> str: ...
    @property
    def failed(self) -> bool: ...
    @property
    def status(self) -> str: ...


class PipelineFailed(ZbakError):
    """A process pipeline (``zfs send | zstd | ssh HOST 'zfs receive ...'``) did not finish.

    Raised by ``zrepl_py.proc.pipeline.run_pipeline`` after every stage was stopped and reaped.

    Attributes:
        stages: one ``StageResult`` per stage, upstream first.
        culprit: the ``StageResult`` to blame: the first stage (upstream to downstream) that
            failed on its own rather than because its neighbour went away; for a cancel or
            timeout, a synthetic result named ``"cancelled"`` or ``"timeout"`` with empty argv.
        bytes: stream bytes the first stage had written when the pipeline stopped.
        seconds: how long the pipeline ran.
    """

    def __init__(self, stages: Sequence[StageEnd], culprit: StageEnd, *, bytes: int = 0,
                 seconds: float = 0.0):
        self.stages = tuple(stages)
        self.culprit = culprit
        self.bytes = bytes
        self.seconds = seconds
        stderr = culprit.stderr.strip()
        if len(stderr) > 4000:  # the whole tail stays on culprit.stderr
            stderr = "..." + stderr[-4000:]
        if not culprit.argv:
            message = f"pipeline {culprit.name} after {seconds:.1f} s: {stderr}"
        else:
            shown = _shown_argv(culprit.argv)
            message = (
                f"pipeline stage '{culprit.name}' failed ({culprit.status}): `{shown}`: "
                f"{stderr or '(no stderr)'}"
            )
        super().__init__(message)


def _shown_argv(argv: Sequence[str]) -> str:
    """A failed stage's argv as an admin wants to read it: for ssh, ``ssh HOST REMOTE
    COMMAND`` without its ~20 ``-o`` options
    (docs/decisions.md#a-failed-stage-is-shown-as-the-admin-would-type-it: zfs's own words, not a
    500-character argv); ``proc.openssh.ssh_argv`` ends with ``-- ADDRESS REMOTE_COMMAND``."""
    argv = list(argv)
    if argv and argv[0].rsplit("/", 1)[-1] == "ssh" and "--" in argv:
        rest = argv[argv.index("--") + 1:]
        return " ".join(["ssh", *rest])
    return " ".join(argv)


class PipelineCancelled(PipelineFailed):
    """The pipeline was stopped because the caller set its cancel event."""


class PipelineTimedOut(PipelineFailed):
    """The pipeline was stopped because it ran longer than its timeout."""


class ResumeTokenInvalid(ZbakError):
    """A ``receive_resume_token`` is malformed, corrupt, or its ``zfs send -nvt`` description
    cannot be read; nothing was sent. Abort the partial receive (``zfs receive -A``) and
    replicate again from the last common snapshot.
    """


class SendArgsInvalid(ZbakError):
    """zbak refused to build a ``zfs send`` command as asked, before anything ran: a raw send
    where the host has no ``send -w``, a resume token of another dataset or another encryption
    mode (docs/reliability.md#r4-token-for-another-operation-is-rejected), or a step that is not a
    send.
    """


class NewerSnapshotsExist(ZfsError):
    """``zfs rollback`` refused: snapshots or bookmarks newer than the rollback target exist.

    zbak never passes ``rollback -r``; the planner lists those snapshots and the driver
    destroys them one by one first (only when the user opted in with
    ``on_divergence = "rollback"``).
    """


class ResumeTokenRefused(ZfsError):
    """``zfs send -t`` refused a resume token as corrupt or invalid ("resume token is corrupt
    (invalid format)", "(incorrect checksum)": OpenZFS 2.3.2). ``zfs.resume.describe_token``
    turns it into ``ResumeTokenInvalid``."""


RSYNC_EXIT_VALUES = {
    1: "syntax or usage error",
    2: "protocol incompatibility",
    3: "errors selecting input/output files, dirs",
    4: "requested action not supported",
    5: "error starting client-server protocol",
    6: "daemon unable to append to log-file",
    10: "error in socket I/O",
    11: "error in file I/O",
    12: "error in rsync protocol data stream",
    13: "errors with program diagnostics",
    14: "error in IPC code",
    20: "received SIGUSR1 or SIGINT",
    21: "some error returned by waitpid()",
    22: "error allocating core memory buffers",
    23: "partial transfer due to error",
    24: "partial transfer due to vanished source files",
    25: "the --max-delete limit stopped deletions",
    30: "timeout in data send/receive",
    35: "timeout waiting for daemon connection",
}
"""rsync's exit statuses and their meanings, from rsync(1) "EXIT VALUES"."""


class RsyncFailed(CommandFailed):
    """rsync exited with a failure: any exit status but 0 and 24 (rsync(1) "EXIT VALUES";
    23 "partial transfer due to error" is a failure), or it was killed or timed out
    (``returncode`` None). No snapshot tree was recorded on the target.

    The message names the status's meaning from rsync(1) besides rsync's stderr: a remote
    rsync's own error line travels in the protocol stream and can be lost when that side
    exits first, leaving the status as the only account of what failed
    (docs/reliability.md#r43-rsync-exit-codes).

    Attributes: as CommandFailed (``argv``, ``returncode``, ``stderr``, ``host``).
    """

    def __init__(self, argv: list[str], returncode: int | None, stderr: str, host: str = "local"):
        super().__init__(argv, returncode, stderr, host)
        meaning = RSYNC_EXIT_VALUES.get(returncode) if returncode is not None else None
        if meaning:
            self.args = (f"{self.args[0]} (rsync: {meaning})",)


class RsyncNotFound(RsyncFailed):
    """rsync is not installed (or not on PATH) on one side of an rsync transfer; ``host``
    names that side. Install rsync there, or use a ZFS target."""


class DigestError(ZbakError):
    """A snapshot's file manifest could not be made or read (``drill.manifest``): a path
    that cannot be read, or a host's output that is not a whole manifest."""


class ScratchLeft(ZbakError):
    """A drill's scratch dataset could not be destroyed after the drill (the host refused or
    failed the destroy); the message names it and what to do. It holds space until the next
    drill or the admin destroys it."""


class DrillMismatch(ZbakError):
    """A drill's restored copy differs from the source snapshot it claims to be (a file's
    content, metadata, or a path missing or extra); the message names the paths."""


class SnapshotViewError(ZbakError):
    """A snapshot's files could not be offered as a directory (a volume has no files; the
    temporary clone did not mount), or the temporary clone could not be destroyed afterwards
    (the message names it: ``zfs destroy`` it by hand)."""


class StoreError(ZbakError):
    """An object store (``s3://`` or ``file://``) refused or failed an operation.

    Attributes:
        store: the store's name in the config (or its URL when unnamed).
        key: the object key involved, or None for a store-wide operation.
    """

    def __init__(self, message: str, *, store: str = "", key: str | None = None):
        self.store = store
        self.key = key
        super().__init__(message)


class StoreTransient(StoreError):
    """A failure worth retrying (throttling, 5xx, connection reset, timeout); raised only after
    the backend's own retries with backoff were used up."""


class StorePermanent(StoreError):
    """A failure retrying cannot fix: access denied, no such bucket, invalid storage class."""


class StoreNotLockable(StorePermanent):
    """A store configured with ``[stores.NAME.object_lock]`` whose bucket has no versioning
    or no Object Lock, so no object version can be locked: the admin's set-up to fix (a
    bucket gets Object Lock only when created with it), hence exit 2."""

    exit_status = ExitStatus.USAGE


class ObjectNotFound(StorePermanent):
    """The object does not exist in the store (deleted behind zbak's back, or never written)."""


class NeedsThaw(StoreError):
    """The object is in a cold class (GLACIER, DEEP_ARCHIVE) and not restored: request a thaw
    (``Backend.request_thaw``) and read it once ``Backend.stat`` reports it ready."""

    exit_status = ExitStatus.THAW_PENDING


class ThawPending(ZbakError):
    """A restore or deep audit is waiting for cold objects to thaw; run the command again after
    the time in the message (the run resumes where it stopped)."""

    exit_status = ExitStatus.THAW_PENDING


class StreamCorrupt(ZbakError):
    """A stored volume or stream does not match what the catalog or manifest records (size,
    SHA-256, zstd frame end, or BEGIN-record guids); it was not fed to ``zfs receive``."""


class IdentityNeeded(UsageError):
    """A sealed store's volumes must be decrypted (restore, ``audit --deep``, a drill) and no
    age identity was given (``--identity FILE`` or ``[stores.NAME.age] identity_file``);
    nothing was read or received."""


class IdentityUnusable(UsageError):
    """An age identity file or a recipient the config names cannot be used: unreadable, or
    no age X25519 / ssh-ed25519 key."""


class IdentityRefused(UsageError):
    """A sealed volume's age header opens with none of the identities given: the identity is
    not one of the store's recipients (the volume's recorded SHA-256 matched, so its bytes
    are the ones written). Nothing of the stream was received and nothing is marked bad."""


class RestoreError(ZbakError):
    """A restore could not be planned or carried out; nothing was received, or the message
    names what was received and where."""


class StreamUnsupported(Unsupported):
    """The receiving ZFS rejected a send stream as unsupported: feature flags it does not know
    ("stream has unsupported feature, feature flags = 4": zfs-fuse 0.7 receiving any OpenZFS
    2.x stream, whose SA_SPILL flag it lacks), or a pool too old for them ("pool must be
    upgraded to receive this stream"). Nothing was received. Method ``auto`` falls back to
    rsync for that dataset; method ``zfs`` reports this."""


class TargetModified(ZfsError):
    """``zfs receive`` refused an incremental: its target was written to since its newest
    snapshot (libzfs ``zfs_receive_one``: "destination %s has been modified since most recent
    snapshot", the same words in zfs-fuse 0.7 and OpenZFS 2.x). Nothing was received;
    replication reports the target as diverged, or rolls it back when the job opted in."""


class StreamInvalid(ZfsError):
    """``zfs receive`` called the stream's own bytes invalid: the stream's fault, not the
    receiver's limit (that is ``StreamUnsupported``). A restore marks such an archived stream
    bad (``StreamRejected``)."""


class SecretUnavailable(UsageError):
    """A secret the config points at (``{ env = "NAME" }`` / ``{ file = "/path" }``) cannot be
    read; the message names the variable or file, never a value."""


class AlertDeliveryFailed(ZbakError):
    """An alert could not be delivered to a webhook or SMTP server after its retries; the
    message names the channel and the server (never a URL path, header or password)."""


class CommandRefused(ZbakError):
    """``zbak serve`` refused a remote request: it is not one of the commands zbak issues, or
    it names something outside the allowed root (the message says which rule). Nothing was
    run; the forced command exits ``serve.execute.REFUSED`` (126)."""


class InsufficientSpace(ZbakError):
    """A target pool has less free space than the job's ``min_free`` floor: nothing was sent
    to it. The message names the host, pool, free bytes and the floor (``zrepl_py.checks.health``)."""


class StreamRejected(RestoreError):
    """``zfs receive`` rejected an archived stream whose volumes had passed verification (size,
    SHA-256, zstd frame): the stored stream itself is not a valid ZFS stream ("invalid stream
    (bad magic number)", "checksum mismatch", "invalid backup stream"). The stream is marked
    ``bad`` in the catalog, so no later restore plans a path through it; the message names it
    and what was received."""


class CatalogReplay(ZbakError):
    """A store's exported catalog object is older than this machine last wrote there (its
    generation is below the local high-water mark in ``<state_dir>/catalog-marks``), or it is
    gone although this machine wrote one: the store was rolled back, restored from an older
    copy or replaced (borg's ``RepositoryReplay``). Nothing was done to the store; the message
    names the object, both generations and the mark file to remove once the store is known to
    be the right one (``catalog.export``)."""


class CatalogExportCorrupt(ZbakError):
    """A store's exported catalog object and its ``.copy`` both fail their SHA-256 or do not
    parse (pgBackRest ``backup.info``/``.copy``). Nothing was done to the store; the message
    names both keys and what to do (``catalog.export``)."""


class StoreInconsistent(ZbakError):
    """An object the catalog records is missing from the store, or has another size there:
    ``zbak prune`` refuses to delete anything of that dataset in that store (restic
    ``ErrPacksMissing``; docs/reliability.md#r19-prune-refuses-on-an-inconsistent-store). The
    message names the streams and objects; run ``zbak audit`` and repair the store or the catalog
    first."""


class ReleaserMismatch(ZbakError):
    """Right before deleting an old chain, an object of the newer chain that releases it no
    longer matches the catalog (size, stored checksum or re-read SHA-256;
    docs/decisions.md#the-releasing-chain-is-rechecked-before-any-delete): the
    mismatching streams are marked ``bad`` and nothing of that dataset is deleted
    (``pruning.recheck``). The message names the stream, the object and what differs."""


class LockBroken(ZbakError):
    """The lock this run held was taken away (its lock file removed or rewritten by another
    process that judged it stale): the run stops at once rather than work unprotected
    (borg ``LockTimeout``/``NotMyLock``; docs/reliability.md#r29-stale-locks)."""

    exit_status = ExitStatus.LOCKED


class StoreReadCorrupt(StoreTransient, StreamCorrupt):
    """The bytes of one read did not match the checksum the store keeps for the object
    (botocore's ``FlexibleChecksumError`` on an S3 GET: "Expected checksum ... did not match
    calculated checksum"). Raised while iterating ``Backend.get``, after the damaged bytes
    were yielded, so the caller discards what it read. Both a ``StoreTransient`` (damage in
    transit: reading again may succeed) and a ``StreamCorrupt`` (what was read is not the
    object), so a verifying reader re-reads it once like any other bad read
    (docs/reliability.md#r11-flaky-read); a second failure means the object is damaged where it is
    stored."""


class RawSendUnavailable(SendArgsInvalid):
    """An encrypted dataset (``encryption`` not ``off``) was to be archived, but its host's
    ``zfs send`` has no ``-w`` (``Capabilities.raw_send`` False): without ``-w`` the stream
    would carry the data decrypted (zfs-send(8) ``-w, --raw``), so nothing is sent
    (docs/reliability.md#r38-encrypted-datasets). Upgrade the host's ZFS (OpenZFS 0.8 or later) or
    check its detected capabilities (``zbak init``)."""


class HookFailed(ZbakError):
    """A pre or post hook of an action failed (``zrepl_py.hooks``): exited non-zero, timed
    out or could not start. The hook's run is recorded failed and alerted; the message says
    whether the action ran."""
