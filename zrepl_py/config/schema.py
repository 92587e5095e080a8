"""The config schema: frozen pydantic models, validated once at load (see README "Config").

Every section and key of DESIGN.md's Config section lives here with its default. Unknown
keys are errors (``extra="forbid"``) so a typo never silently disables a safety setting.
Cross-references (a job naming a host or store that is not defined) are checked by
``Config.reference_problems`` so the loader can name the exact key path.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fnmatch
import functools
import ipaddress
import re
import zoneinfo
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    field_validator,
    model_validator,
)

from zrepl_py.config.names import is_config_name
from zrepl_py.config.units import parse_cron, parse_duration, parse_size
from zrepl_py.errors import CommandFailed, InvalidEndpoint, InvalidName
from zrepl_py.proc import mbuffer
from zrepl_py.proc.executor import COMMAND_NOT_FOUND
from zrepl_py.zfs.names import (
    DatasetName,
    check_short_name,
    check_user_property,
    check_user_property_value,
)
from zrepl_py.zfs.properties import ReceiveProperties
from zrepl_py.zfs.properties import check_name as check_property
from zrepl_py.zfs.properties import check_value as check_property_value

Duration = Annotated[dt.timedelta, BeforeValidator(parse_duration)]
ByteSize = Annotated[int, BeforeValidator(parse_size)]
CronSchedule = Annotated[str, BeforeValidator(parse_cron)]

LOCAL_HOST = "local"
"""Host name that means this machine; it needs no ``[hosts.local]`` section."""


DEFAULT_STATE_DIR = Path("/var/lib/zbak")
S3_STORAGE_CLASSES = (
    "STANDARD",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER_IR",
    "GLACIER",
    "DEEP_ARCHIVE",
)
StorageClass = Literal[
    "STANDARD",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER_IR",
    "GLACIER",
    "DEEP_ARCHIVE",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where a dataset or directory lives: ``HOST:POOL/PATH``, ``HOST:/dir`` or ``POOL/PATH``.

    Attributes:
        host: a ``[hosts.NAME]`` key, or ``"local"`` for this machine.
        dataset: the ZFS dataset, or None for a directory endpoint (rsync targets).
        directory: the absolute directory for rsync targets, else None.
    """

    host: str
    dataset: DatasetName | None
    directory: str | None

    @property
    def is_local(self) -> bool:
        """True when the endpoint is on this machine."""
        return self.host == LOCAL_HOST

    def __str__(self) -> str:
        where = self.dataset if self.dataset is not None else self.directory
        return f"{self.host}:{where}"


def parse_endpoint(value: object, *, allow_directory: bool) -> Endpoint:
    """Parse ``HOST:POOL/PATH`` / ``HOST:/dir`` / ``POOL/PATH`` into an Endpoint.

    The text before the first ``:`` is a host when it holds no ``/``; a pool whose name
    contains ``:`` must therefore be written with an explicit host, e.g. ``local:p:x/y``.

    Raises:
        InvalidEndpoint (a ValueError, exit 2): bad host name, invalid dataset name, or a
            directory where not allowed.
    """
    if not isinstance(value, str) or not value:
        raise InvalidEndpoint("expected 'HOST:POOL/PATH' or 'POOL/PATH'")
    host, sep, rest = value.partition(":")
    if not sep or "/" in host:
        host, rest = LOCAL_HOST, value
    if not is_config_name(host):
        raise InvalidEndpoint(f"invalid host name {host!r}")
    if rest.startswith("/"):
        if not allow_directory:
            raise InvalidEndpoint(f"{value!r}: a directory is only allowed as an rsync target")
        if "\x00" in rest or "\n" in rest:
            raise InvalidEndpoint(f"{value!r}: directory has control characters")
        return Endpoint(host, None, rest.rstrip("/") or "/")
    try:
        return Endpoint(host, DatasetName(rest), None)
    except InvalidName as exc:
        raise InvalidEndpoint(str(exc)) from None


class CatalogConfig(_Model):
    """``[catalog]``: where the SQL catalog lives."""

    url: str | None = None
    """SQLAlchemy URL; None means ``sqlite:///<state_dir>/catalog.sqlite``. A password is
    never in this file: libpq reads it from ``~/.pgpass`` or ``PGPASSWORD``."""

    @field_validator("url")
    @classmethod
    def _no_password(cls, value: str | None) -> str | None:
        # user:password@host (RFC 3986 userinfo) or ?password= in the query (libpq keyword).
        if value is not None and (re.match(r"^[^:/]+://[^/@?#]*:[^/@?#]*@", value)
                                  or re.search(r"[?&]password=", value, re.IGNORECASE)):
            raise ValueError("a password must not be in the config file: put it in ~/.pgpass"
                             " (mode 0600) or PGPASSWORD, and write the URL without it")
        return value

    @field_validator("url")
    @classmethod
    def _sqlite_or_postgresql(cls, value: str | None) -> str | None:
        # The catalog's migrations and SQL are written for these two (DESIGN: [catalog]).
        if value is not None and not re.match(r"^(sqlite|postgresql)(\+\w+)?://", value):
            raise ValueError(f"{value.split('://', 1)[0]!r} is no catalog database zbak"
                             " supports: use sqlite:////ABSOLUTE/PATH or postgresql://HOST/DB")
        return value


class HostConfig(_Model):
    """``[hosts.NAME]``: an SSH-reachable machine with ZFS (or a directory for rsync)."""

    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    identity_file: Path | None = None
    known_hosts: Path | None = None
    """known_hosts file; None means ``<state_dir>/known_hosts``. Checking is always strict."""
    trust_on_first_use: StrictBool = False
    """Accept and record an unknown host key once; a changed key is refused regardless."""
    zfs: str = "zfs"
    zpool: str = "zpool"
    sudo: StrictBool = False
    connect_timeout: Duration = dt.timedelta(seconds=15)
    ciphers: list[str] | None = None
    """SSH ciphers for the ``ssh`` binary (data path, rsync), most preferred first
    (ssh_config(5) ``Ciphers``). None: AES-GCM first where this machine's CPU has AES
    instructions, else ssh's own order (``proc.openssh.data_ciphers``); []: ssh's own order."""

    @field_validator("ciphers")
    @classmethod
    def _ciphers(cls, values: list[str] | None) -> list[str] | None:
        # Names only: a comma or space would splice more ciphers or options into -o Ciphers=.
        for value in values or []:
            if not re.fullmatch(r"[a-z0-9][a-z0-9@.+-]{0,63}", value):
                raise ValueError(f"invalid cipher name {value!r} (see ssh -Q cipher)")
        if values is not None and len(set(values)) != len(values):
            raise ValueError("ciphers are listed twice")
        return values

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        # A hostname, IPv4 or IPv6 literal; never something ssh could read as an option.
        if not re.fullmatch(r"[A-Za-z0-9_.:%\[\]-]{1,253}", value) or value.startswith("-"):
            raise ValueError(f"invalid host address {value!r}")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}\$?", value):
            raise ValueError(f"invalid user name {value!r} (POSIX user names only)")
        return value


class StorageClasses(_Model):
    """Storage class per stream kind; manifests are always STANDARD (restorable metadata)."""

    full: StorageClass = "STANDARD"
    incremental: StorageClass = "STANDARD"


class StoreEncryption(_Model):
    """Server-side encryption options passed to S3 (never a key in the config)."""

    sse: Literal["AES256", "aws:kms"] = "AES256"
    kms_key_id: str | None = None


class StoreConfig(_Model):
    """``[stores.NAME]``: an object store (``s3://bucket/prefix``) or a directory (``file:///dir``)."""

    url: str
    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    """AWS profile name from the standard credential chain; keys are never in this file."""
    prune_profile: str | None = None
    """AWS profile whose credential makes every delete of this store (chain pruning, clean-up
    of partial uploads), so ``profile`` may be a writer without ``s3:DeleteObject``
    (RELIABILITY 42). None: ``profile`` deletes too. S3 stores only."""
    storage_class: StorageClasses = StorageClasses()
    volume_size: ByteSize = 1024**3
    """Bytes per stored volume object; 1 GiB keeps any stream far inside S3 limits."""
    upload_concurrency: int = Field(4, ge=1, le=64)
    encryption: StoreEncryption | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value.startswith("file:///"):
            return value
        if re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", value):
            return value
        raise ValueError("expected 's3://bucket[/prefix]' or 'file:///absolute/dir'")

    @model_validator(mode="after")
    def _prune_profile(self) -> StoreConfig:
        if self.prune_profile is not None and not self.url.startswith("s3://"):
            raise ValueError("prune_profile applies to s3:// stores only")
        return self


class Retention(_Model):
    """Count-per-period retention (sanoid/restic style); applies to zbak's own snapshots only.

    Each count keeps the newest snapshot of that many most recent periods that have one.
    Hourly buckets are UTC hours; daily and longer ones follow ``timezone``'s calendar.
    """

    keep_last: int = Field(0, ge=0)
    keep_within: Duration | None = None
    hourly: int = Field(0, ge=0)
    daily: int = Field(0, ge=0)
    weekly: int = Field(0, ge=0)
    monthly: int = Field(0, ge=0)
    yearly: int = Field(0, ge=0)
    timezone: str = "UTC"

    @field_validator("timezone")
    @classmethod
    def _tz(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r} (use an IANA name like 'Europe/Vienna')")
        return value


DEFAULT_SNAPSHOT_RETENTION = Retention(keep_last=3, hourly=24, daily=14, weekly=8, monthly=12)


class SnapshotPolicy(_Model):
    """``[jobs.NAME.snapshot]``: when to snapshot, how to name, what to keep on the source."""

    schedule: CronSchedule | None = "0 * * * *"
    prefix: str = "zbak"
    retention: Retention = DEFAULT_SNAPSHOT_RETENTION
    min_change: ByteSize = 0
    """Bytes a dataset must have had written (its ``written`` property, zfsprops(7)) since
    its newest snapshot, when that snapshot is one of this job's, to get a new one
    (zfs-autobackup's ``--min-change``); 0: every dataset is snapshotted every time. Needs
    the ``written`` property (OpenZFS); where the host lacks it, every dataset is
    snapshotted and the run says why (``zrepl_py.snapshots.take``)."""

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        try:
            return check_short_name(value, "snapshot prefix")
        except InvalidName as exc:
            raise ValueError(str(exc)) from None


class ProtectionBudget(_Model):
    """Alert when held replication bases grow past these limits instead of filling the pool."""

    max_age: Duration | None = None
    max_bytes: ByteSize | None = None


@dataclasses.dataclass(frozen=True)
class FreeSpaceFloor:
    """A free-space floor: exactly one of ``bytes`` or ``percent`` is set.

    Attributes:
        bytes: the floor in bytes.
        percent: the floor as a percentage (0 < p < 100) of the pool's usable size, which
            ``zrepl_py.checks.health`` takes as ``used + available`` of the pool's root dataset.
    """

    bytes: int | None = None
    percent: float | None = None

    def floor_bytes(self, size_bytes: int) -> int:
        """The floor in bytes for a pool of ``size_bytes`` usable bytes."""
        if self.bytes is not None:
            return self.bytes
        return int(size_bytes * (self.percent or 0.0) / 100)

    def __str__(self) -> str:
        return f"{self.bytes} bytes" if self.bytes is not None else f"{self.percent:g}%"


def parse_free_floor(value: object) -> FreeSpaceFloor:
    """Parse ``min_free``: ``"10%"`` (percent of the pool), or a size (``"20G"``, bytes).

    Raises:
        ValueError: not a size or a percentage in (0, 100).
    """
    if isinstance(value, FreeSpaceFloor):
        return value
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            percent = float(value.strip()[:-1])
        except ValueError:
            raise ValueError(f"expected a percentage like '10%', got {value!r}") from None
        if not 0 < percent < 100:
            raise ValueError(f"a free-space percentage must be between 0 and 100, got {value!r}")
        return FreeSpaceFloor(percent=percent)
    return FreeSpaceFloor(bytes=parse_size(value))


MinFree = Annotated[FreeSpaceFloor, PlainValidator(parse_free_floor)]


class ReplicaProperties(_Model):
    """``[jobs.NAME.replicate.properties]``: the dataset properties a replica gets.

    ``send`` adds ``zfs send -p`` (recordsize, compression, atime, xattr, user properties...
    arrive, so a failover replica behaves as its source). ``set`` is applied on receive over
    the defaults ``zfs.properties.DEFAULT_SET`` (``canmount = "noauto"``, ``readonly =
    "on"``); ``exclude`` replaces ``DEFAULT_EXCLUDE`` (mountpoint, sharenfs, sharesmb,
    refreservation). Names and values are checked here (``zfs.properties``), so a bad one is
    a config error and never reaches a process.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    send: StrictBool = True
    assign: dict[str, str] = Field(default_factory=dict, alias="set")
    exclude: list[str] | None = None
    """None: ``DEFAULT_EXCLUDE`` (less what ``set`` sets)."""

    # InvalidProperty is a ValueError: pydantic reports it under the key that holds it.
    @field_validator("assign")
    @classmethod
    def _assign(cls, values: dict[str, str]) -> dict[str, str]:
        for name, value in values.items():
            check_property_value(check_property(name), value)
        return values

    @field_validator("exclude")
    @classmethod
    def _exclude(cls, names: list[str] | None) -> list[str] | None:
        for name in names or ():
            check_property(name)
        return names

    @model_validator(mode="after")
    def _together(self) -> ReplicaProperties:
        self.receive()  # a property both set and excluded; canmount=on with mountpoint
        return self

    def receive(self) -> ReceiveProperties:
        """The effective ``-o``/``-x`` of a receive (``ReceiveProperties.of``)."""
        return ReceiveProperties.of(self.assign, self.exclude)


_PATTERN = re.compile(r"[A-Za-z0-9_.: *?\[\]!-]{1,255}")


class SnapshotFilter(_Model):
    """``[jobs.NAME.replicate.snapshot_filter."TARGET"]``: which source snapshots are sent
    to one target, by short name (syncoid's ``--include-snaps``/``--exclude-snaps``, with
    shell-style globs, fnmatch(3) rules, case-sensitive, instead of regular expressions).

    A snapshot is sent when ``include`` is empty or one of its patterns matches, and no
    pattern of ``exclude`` matches. The replication base (the newest common snapshot, which
    carries the hold and the cursor) is used whatever the filter says; it is already on the
    target (``zrepl_py.replication.planner``).
    """

    include: list[str] = []
    exclude: list[str] = []

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, values: list[str]) -> list[str]:
        for value in values:
            if not _PATTERN.fullmatch(value):
                raise ValueError(f"pattern {value!r}: 1-255 characters of snapshot names "
                                 "(A-Z a-z 0-9 _ . : - space) and the globs * ? [ ] !")
        return values

    @property
    def active(self) -> bool:
        """True when the filter can leave a snapshot out."""
        return bool(self.include or self.exclude)

    def admits(self, short: str) -> bool:
        """True when the snapshot ``short`` (the part after ``@``) passes the filter."""
        if self.include and not any(fnmatch.fnmatchcase(short, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(short, p) for p in self.exclude)

    def __str__(self) -> str:
        parts = [f"include {self.include}"] if self.include else []
        parts += [f"exclude {self.exclude}"] if self.exclude else []
        return ", ".join(parts) or "everything"


NO_FILTER = SnapshotFilter()
"""The filter of a target without one: every snapshot passes."""


class ReplicateConfig(_Model):
    """``[jobs.NAME.replicate]``: targets and how to send to them."""

    targets: list[str] = Field(min_length=1)
    schedule: CronSchedule | None = "15 * * * *"
    method: Literal["auto", "zfs", "rsync"] = "auto"
    compression: Literal["none", "zstd"] = "none"
    bandwidth_limit: ByteSize | None = None
    """Bytes per second on the wire, shared by the transfers running at once; None for
    unlimited."""
    concurrency: int | None = Field(default=None, ge=1, le=64)
    """Datasets replicated at once to each target; None: sized to this machine
    (``replication.order.default_concurrency``)."""
    receive_buffer: ByteSize = 64 * 1024 * 1024
    """Bytes of an mbuffer(1) right before ``zfs receive`` on the receiving host, when the
    stream crosses ssh and that host has mbuffer (``replication.stages``); 0: none."""
    on_divergence: Literal["stop", "rollback"] = "stop"
    retention: Retention | None = None
    """Retention of zbak snapshots on the target; None keeps every received snapshot."""
    protection_budget: ProtectionBudget = ProtectionBudget()
    properties: ReplicaProperties = ReplicaProperties()
    """What the replicas' properties are (send them, set, exclude)."""
    min_free: MinFree | None = None
    """Free-space floor of each ZFS target's pool (``zrepl_py.checks.health``): bytes (``"20G"``)
    or a percentage of the pool's usable size (``"10%"``); a target pool with less free
    space is not sent to (the target's run fails saying so). None: no floor."""
    snapshot_filter: dict[str, SnapshotFilter] = {}
    """Per target (the key is the target as written in ``targets``): which snapshots are
    sent there (``SnapshotFilter``); a target without an entry gets every snapshot."""

    @field_validator("receive_buffer")
    @classmethod
    def _receive_buffer(cls, value: int) -> int:
        if value and not mbuffer.MIN_BYTES <= value <= mbuffer.MAX_BYTES:
            raise ValueError("receive_buffer must be 0 (none) or 1MiB to 16GiB")
        return value

    @field_validator("targets")
    @classmethod
    def _targets(cls, values: list[str]) -> list[str]:
        for value in values:
            parse_endpoint(value, allow_directory=True)
        if len(set(values)) != len(values):
            raise ValueError("targets are listed twice")
        return values

    @model_validator(mode="after")
    def _filters_name_targets(self) -> ReplicateConfig:
        for key in self.snapshot_filter:
            if key not in self.targets:
                raise ValueError(f"snapshot_filter.{key!r}: not one of targets "
                                 f"({', '.join(self.targets)}); write it as in targets")
        return self

    def endpoints(self) -> list[Endpoint]:
        """The targets, parsed."""
        return [parse_endpoint(t, allow_directory=True) for t in self.targets]

    def filter_for(self, target: Endpoint | str) -> SnapshotFilter:
        """The snapshot filter of ``target`` (an Endpoint, or its ``str``: how cursors name
        it), ``NO_FILTER`` when it has none."""
        wanted = str(target) if isinstance(target, Endpoint) else target
        for key, found in self.snapshot_filter.items():
            if str(parse_endpoint(key, allow_directory=True)) == wanted:
                return found
        return NO_FILTER


# Minimum storage duration per S3 storage class: an object deleted (or overwritten) earlier
# is billed as if stored that long ("early delete fee"). AWS S3 user guide, "Comparing the
# Amazon S3 storage classes" (docs.aws.amazon.com/AmazonS3/latest/userguide/
# storage-class-intro.html#sc-compare) and https://aws.amazon.com/s3/pricing/: STANDARD_IA
# and ONEZONE_IA 30 days, GLACIER_IR and GLACIER (Flexible Retrieval) 90 days, DEEP_ARCHIVE
# 180 days; STANDARD none; INTELLIGENT_TIERING none since AWS dropped its 30-day minimum in
# September 2021 ("Amazon S3 Intelligent-Tiering ... no minimum storage duration", AWS What's
# New, 2021-09-02). Override per class under [jobs.NAME.archive] min_storage_duration.
DEFAULT_MIN_STORAGE_DURATION: dict[str, dt.timedelta] = {
    "STANDARD": dt.timedelta(0),
    "STANDARD_IA": dt.timedelta(days=30),
    "ONEZONE_IA": dt.timedelta(days=30),
    "INTELLIGENT_TIERING": dt.timedelta(0),
    "GLACIER_IR": dt.timedelta(days=90),
    "GLACIER": dt.timedelta(days=90),
    "DEEP_ARCHIVE": dt.timedelta(days=180),
}


class ArchiveConfig(_Model):
    """``[jobs.NAME.archive]``: the chain policy and retention for one store.

    Retention (``zbak prune``, ``zrepl_py.pruning.chain_plan``) deletes whole chains only:
    the ``keep_chains`` newest chains are kept; with ``max_age``, a chain whose newest stream
    is older than that is no longer protected by ``keep_chains``; a chain is deleted only when
    a newer, undamaged full verified within ``reverify_after`` exists (its objects are
    checked against the catalog again right before the first delete), and (unless
    ``--accept-early-delete-fee``) only when none of its streams is younger than its class's
    ``min_storage_duration``.
    """

    store: str
    schedule: CronSchedule | None = "30 2 * * *"
    full_every: Duration = dt.timedelta(days=30)
    max_chain_length: int = Field(30, ge=1)
    max_chain_bytes: ByteSize | None = None
    keep_chains: int = Field(2, ge=1)
    max_age: Duration | None = None
    """A chain whose newest stream is older than this may be deleted even within
    ``keep_chains`` (never the newest verified chain); None: age deletes nothing."""
    min_storage_duration: dict[StorageClass, Duration] = {}
    """Overrides of DEFAULT_MIN_STORAGE_DURATION per storage class, e.g. ``{ GLACIER = "90d" }``."""
    reverify_after: Duration = Field(dt.timedelta(days=30), gt=dt.timedelta(0))
    """How long a stream's ``verified`` mark (``zbak audit --deep``) lets its chain release
    older chains; after that the chain releases nothing until re-verified (issue 15: bytes
    verified once can rot later)."""
    storage_class: StorageClasses | None = None
    """Overrides the store's classes for this job."""
    compression_level: int = Field(3, ge=1, le=22)

    def min_storage(self, storage_class: str) -> dt.timedelta:
        """The minimum storage duration of ``storage_class``: the override, else S3's
        default, else zero for a class S3 does not name (``file://`` reports STANDARD)."""
        found = self.min_storage_duration.get(storage_class)  # type: ignore[call-overload]
        if found is not None:
            return found
        return DEFAULT_MIN_STORAGE_DURATION.get(storage_class, dt.timedelta(0))

    def min_storage_durations(self) -> dict[str, dt.timedelta]:
        """Every known class's minimum storage duration, overrides applied."""
        return {cls: self.min_storage(cls) for cls in S3_STORAGE_CLASSES}


DAEMON_ACTIONS = ("snapshot", "replicate", "archive", "prune", "audit")
"""What ``zbak daemon`` schedules, in the order it runs a job's actions that are due together."""
DaemonAction = Literal["snapshot", "replicate", "archive", "prune", "audit"]
HOOK_TIMEOUT_MAX = dt.timedelta(hours=24)


class HookConfig(_Model):
    """``[jobs.NAME.hooks.ACTION]``: commands run before and after one action of the job
    (``zrepl_py.hooks``).

    ``pre`` and ``post`` are argv lists (the program by absolute path, then its arguments;
    no shell unless the admin writes ``["/bin/sh", "-c", "..."]``). ``post`` always runs,
    also after a failed ``pre`` or action (zrepl #392). ``timeout`` bounds each command;
    ``on_pre_failure`` says whether a failing ``pre`` stops the action (``abort``) or the
    action runs anyway (``continue``, the default of zrepl's ``err_is_fatal`` and sanoid's
    ``no_inconsistent_snapshot``).
    """

    pre: list[str] | None = None
    post: list[str] | None = None
    timeout: Duration = dt.timedelta(seconds=30)
    on_pre_failure: Literal["continue", "abort"] = "continue"

    @field_validator("pre", "post")
    @classmethod
    def _argv(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("a command needs at least the program: [\"/path/to/program\", ...]")
        if not value[0].startswith("/"):
            raise ValueError(f"the program {value[0]!r} must be an absolute path (the daemon's"
                             " PATH is not a login shell's)")
        for arg in value:
            if "\x00" in arg:
                raise ValueError("a command's arguments cannot hold a NUL byte")
        return value

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: dt.timedelta) -> dt.timedelta:
        if not dt.timedelta(seconds=1) <= value <= HOOK_TIMEOUT_MAX:
            raise ValueError("a hook's timeout must be 1s to 24h")
        return value


class SelectConfig(_Model):
    """``[jobs.NAME.select]``: the datasets of the job's tree chosen by a ZFS user property
    (zfs-autobackup's model; rules in ``zrepl_py.snapshots.selection``).

    A dataset is selected when its value of ``property`` (set on it, or inherited from an
    ancestor: zfsprops(7) "User Properties" are inherited) equals ``value``; any other value
    (``false`` by convention) leaves it and every descendant inheriting that value out. A
    value ``zfs receive`` set (source ``received``, or inherited from a received one) marks
    a replica and is never selected unless ``exclude_received = false``.
    """

    property: str
    value: str = "true"
    exclude_received: StrictBool = True

    @field_validator("property")
    @classmethod
    def _property(cls, value: str) -> str:
        try:
            return check_user_property(value)
        except InvalidName as exc:
            raise ValueError(str(exc)) from None

    @field_validator("value")
    @classmethod
    def _value(cls, value: str) -> str:
        try:
            check_user_property_value(value, "select value")
        except InvalidName as exc:
            raise ValueError(str(exc)) from None
        if value == "false":
            raise ValueError("'false' is the value that leaves a dataset out; select with"
                             " another value (e.g. 'true' or the job's name)")
        return value

    def __str__(self) -> str:
        return f"{self.property}={self.value}"


class JobConfig(_Model):
    """``[jobs.NAME]``: one source dataset (tree) and what to do with it."""

    dataset: str
    recursive: StrictBool = False
    exclude: list[str] = []
    """Child datasets (relative to ``dataset``, or absolute) left out of a recursive job."""
    select: SelectConfig | None = None
    """Select the tree's datasets by a user property; implies ``recursive = true``."""
    snapshot: SnapshotPolicy = SnapshotPolicy()
    replicate: ReplicateConfig | None = None
    archive: ArchiveConfig | None = None
    hooks: dict[DaemonAction, HookConfig] = {}
    """Pre and post commands per action (``snapshot``, ``replicate``, ``archive``, ``prune``,
    ``audit``)."""

    @model_validator(mode="before")
    @classmethod
    def _select_walks_the_tree(cls, data):
        # A property selection looks at every dataset below `dataset`: recursive unless said.
        if isinstance(data, dict) and data.get("select") is not None and "recursive" not in data:
            data = {**data, "recursive": True}
        return data

    @model_validator(mode="after")
    def _select_is_recursive(self) -> JobConfig:
        if self.select is not None and not self.recursive:
            raise ValueError("select looks at every dataset below dataset: recursive = false"
                             " contradicts it (leave recursive out)")
        return self

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        parse_endpoint(value, allow_directory=False)
        return value

    @field_validator("exclude")
    @classmethod
    def _exclude(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                DatasetName(value) if "/" in value else check_short_name(value, "exclude")
            except InvalidName as exc:
                raise ValueError(str(exc)) from None
        return values

    @functools.cached_property
    def source(self) -> Endpoint:
        """The source dataset, parsed (once: commands over 100,000 streams ask per stream)."""
        return parse_endpoint(self.dataset, allow_directory=False)


def replica_datasets(config: Config, host: str) -> dict[DatasetName, str]:
    """ZFS replica targets of every job on ``host`` (a config host name, ``local`` for this
    machine): ``{target dataset: "job J -> TARGET"}`` (pure). Whatever is received there is
    a replica, never a source a recursive walk may select (``snapshots.selection``)."""
    found: dict[DatasetName, str] = {}
    for name, job in config.jobs.items():
        for target in job.replicate.endpoints() if job.replicate else []:
            if target.dataset is not None and target.host == host:
                found.setdefault(target.dataset, f"job {name} -> {target}")
    return found


def _inside_source(job: JobConfig, target: Endpoint) -> str | None:
    """Why ``target`` replicates ``job`` into itself, or None (pure).

    A target in the source's own tree on the same host (issue 18 item 4): the first run
    receives into the tree, the next ``zfs snapshot -r`` snapshots the replica too, and
    every later run finds the replica diverged. Hosts compare by their config name
    (``local`` whether written or not); the same dataset name on another host is fine.
    """
    source = job.source
    if target.dataset is None or target.host != source.host:
        return None
    where = "on this machine" if source.is_local else f"on host {source.host}"
    if target.dataset == source.dataset:
        return (f"the target is the source dataset {source.dataset} itself {where}: "
                "replicate to another dataset or host")
    if job.recursive and target.dataset.startswith(f"{source.dataset}/"):
        return (f"the target {target.dataset} is inside the recursive source "
                f"{source.dataset} {where}: each snapshot would include the replica and "
                "every later run would stop as diverged; replicate outside the source tree "
                "(e.g. another pool) or to another host")
    return None


class ThawPrice(_Model):
    """What retrieving (thawing) cold objects costs at one class and tier, in USD."""

    per_gb: float = Field(ge=0)
    per_1000_requests: float = Field(ge=0)


# AWS S3 pricing, us-east-1, retrieval from S3 Glacier Flexible Retrieval ("GLACIER") and
# S3 Glacier Deep Archive (https://aws.amazon.com/s3/pricing/, "Requests & data retrievals");
# Deep Archive has no Expedited tier. Override under [restore.prices.CLASS.TIER].
DEFAULT_THAW_PRICES: dict[str, dict[str, ThawPrice]] = {
    "GLACIER": {
        "Expedited": ThawPrice(per_gb=0.03, per_1000_requests=10.0),
        "Standard": ThawPrice(per_gb=0.01, per_1000_requests=0.05),
        "Bulk": ThawPrice(per_gb=0.0, per_1000_requests=0.025),
    },
    "DEEP_ARCHIVE": {
        "Standard": ThawPrice(per_gb=0.02, per_1000_requests=0.10),
        "Bulk": ThawPrice(per_gb=0.0025, per_1000_requests=0.025),
    },
}


class RestoreConfig(_Model):
    """``[restore]``: how cold objects are thawed and where downloaded volumes wait."""

    thaw_tier: Literal["Expedited", "Standard", "Bulk"] = "Standard"
    thaw_days: int = Field(7, ge=1, le=365)
    """Days a thawed copy stays readable (S3 RestoreObject ``Days``)."""
    spool_dir: Path | None = None
    """Where volumes from remote stores are verified before receive; default STATE_DIR/spool."""
    download_concurrency: int = Field(4, ge=1, le=64)
    prices: dict[str, dict[str, ThawPrice]] = {}
    """Overrides of DEFAULT_THAW_PRICES, per storage class and tier."""

    def price(self, storage_class: str, tier: str) -> ThawPrice | None:
        """The price of thawing ``storage_class`` at ``tier`` (None: not a cold class/tier)."""
        found = self.prices.get(storage_class, {}).get(tier)
        return found or DEFAULT_THAW_PRICES.get(storage_class, {}).get(tier)


class SecretRef(_Model):
    """Where a secret comes from: ``{ env = "NAME" }`` or ``{ file = "/path" }``, exactly one.

    The value itself is never written in the config (house rule 7); it is read when first
    needed (``load``), so ``zbak config check`` does not need the secret present.
    """

    env: str | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError('give exactly one of env = "NAME" or file = "/path"')
        if self.env is not None:  # a secret's variable never reaches zfs/ssh/rsync children
            from zrepl_py.proc.childenv import register_secret_env

            register_secret_env(self.env)
        return self

    def load(self):
        """Read the secret and return it as a ``zrepl_py.config.secret.Secret``.

        Raises:
            SecretUnavailable: the variable is unset or the file cannot be read (the message
                names the variable or file, never a value).
        """
        from zrepl_py.config.secret import Secret
        from zrepl_py.errors import SecretUnavailable

        try:
            return Secret.from_env(self.env) if self.env is not None else Secret.from_file(self.file)
        except KeyError:
            raise SecretUnavailable(f"environment variable {self.env} is not set") from None
        except OSError as exc:
            raise SecretUnavailable(f"cannot read secret file {self.file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise SecretUnavailable(f"secret file {self.file} is not UTF-8 text") from None


ALERT_KINDS = ("failure", "recovery", "stale", "budget", "degraded")
AlertKind = Literal["failure", "recovery", "stale", "budget", "degraded"]
StaleAction = Literal["snapshot", "replicate", "archive", "prune", "audit"]


class WebhookConfig(_Model):
    """``[alerts.webhook]``: POST each alert as JSON to ``url``.

    ``url`` may be a ``SecretRef`` (chat webhooks carry their token in the URL); header
    values are always ``SecretRef`` (``{ Authorization = { env = "ZBAK_HOOK_AUTH" } }``).
    """

    url: str | SecretRef
    headers: dict[str, SecretRef] = {}
    timeout: Duration = dt.timedelta(seconds=10)

    @field_validator("url")
    @classmethod
    def _url(cls, value):
        if isinstance(value, str) and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError("expected an http:// or https:// URL")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict) -> dict:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
                raise ValueError(f"invalid HTTP header name {name!r}")
        return value


class EmailConfig(_Model):
    """``[alerts.email]``: send each alert as a mail through an SMTP server (smtplib).

    ``starttls`` upgrades a plain connection (port 587); ``ssl`` connects with TLS from the
    start (SMTPS, port 465). Certificates are verified against the system CAs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    host: str
    port: int = Field(587, ge=1, le=65535)
    starttls: StrictBool = True
    ssl: StrictBool = False
    sender: str = Field(alias="from")
    to: list[str] = Field(min_length=1)
    username: str | None = None
    password: SecretRef | None = None
    timeout: Duration = dt.timedelta(seconds=30)

    @field_validator("sender", "to")
    @classmethod
    def _addresses(cls, value):
        for address in [value] if isinstance(value, str) else value:
            if not re.fullmatch(r"[^@\s<>,]+@[^@\s<>,]+", address):
                raise ValueError(f"invalid mail address {address!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> EmailConfig:
        if self.ssl and self.starttls:
            raise ValueError("ssl (SMTPS) and starttls exclude each other: set starttls = false")
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        if self.password is not None and not (self.ssl or self.starttls or _loopback(self.host)):
            raise ValueError(f"the SMTP password would cross the network to {self.host} in"
                             " clear text: set starttls = true (or ssl = true), or relay"
                             " through a server on 127.0.0.1")
        return self


class AppriseConfig(_Model):
    """``[alerts.apprise]``: each alert to every service named by an apprise URL
    (ntfy, Telegram, Slack, Matrix, Pushover, ...; needs ``zbak[apprise]``).

    Each URL is a ``SecretRef`` (``{ env = "NAME" }`` or ``{ file = "/path" }``): apprise URLs
    carry the service's token, so they are never written in the file nor logged.
    """

    urls: list[SecretRef] = Field(min_length=1)


def _loopback(host: str) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ``::1`` (RFC 1122, RFC 4291)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class AlertsConfig(_Model):
    """``[alerts]``: where alerts go and when staleness is alerted (see zrepl_py/alerts).

    ``stale_after`` maps an action to how long it may go without a successful run before a
    ``stale`` alert (checked by the daemon; only for actions a job schedules). ``repeat_after``
    is the shortest time between two alerts of the same kind for the same job, action and
    target (a recovery always goes out and re-arms its failure alert).
    """

    webhook: WebhookConfig | None = None
    email: EmailConfig | None = None
    apprise: AppriseConfig | None = None
    stale_after: dict[StaleAction, Duration] = {
        "replicate": dt.timedelta(hours=26),
        "archive": dt.timedelta(hours=50),
    }
    repeat_after: Duration = dt.timedelta(hours=24)
    events: list[AlertKind] = list(ALERT_KINDS)


class MetricsConfig(_Model):
    """``[metrics]``: Prometheus exposition (see zrepl_py/status/metrics.py).

    ``listen`` (``HOST:PORT``) makes ``zbak daemon`` serve ``/metrics``; ``textfile`` is a
    node_exporter textfile-collector file rewritten atomically after every run.
    """

    listen: str | None = None
    textfile: Path | None = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected HOST:PORT, e.g. '127.0.0.1:9811'")
        return value

    @field_validator("textfile")
    @classmethod
    def _textfile(cls, value: Path | None) -> Path | None:
        if value is not None and (not value.is_absolute() or value.suffix != ".prom"):
            raise ValueError("expected an absolute path ending in .prom (node_exporter reads only those)")
        return value

    def listen_address(self) -> tuple[str, int] | None:
        """``listen`` split into ``(host, port)`` (brackets of an IPv6 literal removed)."""
        if self.listen is None:
            return None
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)




class DaemonConfig(_Model):
    """``[daemon]``: how ``zbak daemon`` schedules and logs (``zrepl_py.daemon``).

    Every job gets one trigger per action: ``snapshot``, ``replicate`` and ``archive`` from
    the job's ``schedule`` keys (an action whose section is missing or whose schedule is
    unset is not scheduled); ``prune`` and ``audit`` from ``prune_schedule`` and
    ``audit_schedule`` here, for every job (unset: not scheduled). Schedules are five-field
    crontab lines in UTC. ``every`` replaces an action's cron schedule for every job by a
    fixed interval (``{ snapshot = "5s", replicate = "10s" }``): for demos and tests;
    interval runs fall on whole multiples of the interval counted from 2000-01-01T00:00Z,
    so a restart does not shift them.

    A run missed while the daemon was down (its next-run time is kept in the catalog
    database) runs once at start-up, however many were missed (coalesced), unless it is
    more than ``misfire_grace_time`` late (unset: always caught up).
    """

    name: str | None = None
    """Names this daemon's schedule table (``zbak_schedule_<name>``) in a catalog several
    daemons share (a PostgreSQL fleet): each daemon needs its own. Unset: ``zbak_schedule``."""
    prune_schedule: CronSchedule | None = "0 4 * * *"
    audit_schedule: CronSchedule | None = "0 5 * * 0"
    every: dict[DaemonAction, Duration] = {}
    misfire_grace_time: Duration | None = None
    """How late a missed run may still start; unset: any missed run is caught up once."""
    stop_timeout: Duration = dt.timedelta(seconds=30)
    """On SIGTERM, how long running actions get to stop (they are sent SIGTERM at once and
    stop their transfers) before they are killed."""
    log_format: Literal["human", "json"] = "human"
    """``json``: one JSON object per line (time, level, logger, message, job, action)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z0-9_]{1,40}", value):
            raise ValueError("use lower-case letters, digits and '_' (max 40): it names a table")
        return value

    @field_validator("every")
    @classmethod
    def _every(cls, value: dict) -> dict:
        for action, interval in value.items():
            if interval < dt.timedelta(seconds=1):
                raise ValueError(f"every.{action}: an interval must be at least 1 second")
        return value


class Config(_Model):
    """The whole config file."""

    state_dir: Path = DEFAULT_STATE_DIR
    """Catalog (SQLite default), locks and known_hosts live here (mode 0700)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    catalog: CatalogConfig = CatalogConfig()
    hosts: dict[str, HostConfig] = {}
    stores: dict[str, StoreConfig] = {}
    jobs: dict[str, JobConfig] = {}
    restore: RestoreConfig = RestoreConfig()
    alerts: AlertsConfig = AlertsConfig()
    metrics: MetricsConfig = MetricsConfig()
    daemon: DaemonConfig = DaemonConfig()

    @field_validator("state_dir")
    @classmethod
    def _absolute_state_dir(cls, value: Path) -> Path:
        # Relative, it would follow the working directory: cron, systemd and a shell would
        # each find another catalog, locks and known_hosts.
        if not value.is_absolute():
            raise ValueError(f"{str(value)!r} is relative: give an absolute path"
                             f" (default {DEFAULT_STATE_DIR})")
        return value

    @field_validator("hosts", "stores", "jobs")
    @classmethod
    def _names(cls, value: dict) -> dict:
        for name in value:
            if not is_config_name(name):
                raise ValueError(f"name {name!r}: use letters, digits, '_', '.', '-' (max 64)")
        return value

    @field_validator("hosts")
    @classmethod
    def _no_local_host(cls, value: dict) -> dict:
        if LOCAL_HOST in value:
            raise ValueError(f"host name {LOCAL_HOST!r} is reserved for this machine")
        return value

    @property
    def catalog_url(self) -> str:
        """The SQLAlchemy URL of the catalog, with the SQLite default filled in."""
        return self.catalog.url or f"sqlite:///{self.state_dir / 'catalog.sqlite'}"

    def reference_problems(self) -> list[tuple[str, str]]:
        """Return ``(key_path, message)`` for every host or store a job names but nobody defines."""
        problems: list[tuple[str, str]] = []

        def need_host(host: str, key: str) -> None:
            if host != LOCAL_HOST and host not in self.hosts:
                problems.append((key, f"host {host!r} is not defined under [hosts]"))

        for name, job in self.jobs.items():
            need_host(job.source.host, f"jobs.{name}.dataset")
            if job.replicate:
                for i, target in enumerate(job.replicate.endpoints()):
                    need_host(target.host, f"jobs.{name}.replicate.targets[{i}]")
                    key = f"jobs.{name}.replicate.targets[{i}]"
                    if target.directory is not None and job.replicate.method == "zfs":
                        problems.append((key, "a directory target needs method 'rsync' or 'auto'"))
                    if target.directory is None and job.replicate.method == "rsync":
                        problems.append((key, "method 'rsync' needs a directory target (HOST:/dir)"))
                    if target.directory is not None and job.recursive:
                        problems.append((key, "an rsync directory target copies one dataset: "
                                              "use a ZFS target or one job per dataset"))
                    inside = _inside_source(job, target)
                    if inside is not None:
                        problems.append((key, inside))
            if job.archive and job.archive.store not in self.stores:
                problems.append(
                    (f"jobs.{name}.archive.store",
                     f"store {job.archive.store!r} is not defined under [stores]")
                )
        return problems


def no_zfs_fallback(job: JobConfig, target: Endpoint, error: CommandFailed) -> Endpoint | None:
    """The directory method ``auto`` rsyncs into when probing ``target``'s ZFS failed with
    ``error`` because the host has no zfs (exit 127): ``/POOL/PATH`` on that host, for a
    non-recursive job (an rsync target copies one dataset). None: no fallback, the error
    stands (another failure, method ``zfs``, or a recursive job).
    """
    assert job.replicate is not None and target.dataset is not None
    if job.replicate.method != "auto" or error.returncode != COMMAND_NOT_FOUND or job.recursive:
        return None
    return Endpoint(target.host, None, f"/{target.dataset}")
