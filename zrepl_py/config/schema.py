"""The config schema: frozen pydantic models, validated once at load (see README "Config").

Every section and key of DESIGN.md's Config section lives here with its default. Unknown
keys are errors (``extra="forbid"``) so a typo never silently disables a safety setting.
Cross-references (a job naming a host or store that is not defined) are checked by
``Config.reference_problems`` so the loader can name the exact key path.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import zoneinfo
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from zrepl_py.config.units import ByteSize, CronSchedule, Duration
from zrepl_py.errors import InvalidName
from zrepl_py.zfs.names import DatasetName, check_short_name

_CONFIG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
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
        ValueError: bad host name, invalid dataset name, or a directory where not allowed.
    """
    if not isinstance(value, str) or not value:
        raise ValueError("expected 'HOST:POOL/PATH' or 'POOL/PATH'")
    host, sep, rest = value.partition(":")
    if not sep or "/" in host:
        host, rest = LOCAL_HOST, value
    if not _CONFIG_NAME.match(host):
        raise ValueError(f"invalid host name {host!r}")
    if rest.startswith("/"):
        if not allow_directory:
            raise ValueError(f"{value!r}: a directory is only allowed as an rsync target")
        if "\x00" in rest or "\n" in rest:
            raise ValueError(f"{value!r}: directory has control characters")
        return Endpoint(host, None, rest.rstrip("/") or "/")
    try:
        return Endpoint(host, DatasetName(rest), None)
    except InvalidName as exc:
        raise ValueError(str(exc)) from None


class CatalogConfig(_Model):
    """``[catalog]``: where the SQL catalog lives."""

    url: str | None = None
    """SQLAlchemy URL; None means ``sqlite:///<state_dir>/catalog.sqlite``."""


class HostConfig(_Model):
    """``[hosts.NAME]``: an SSH-reachable machine with ZFS (or a directory for rsync)."""

    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    identity_file: Path | None = None
    known_hosts: Path | None = None
    """known_hosts file; None means ``<state_dir>/known_hosts``. Checking is always strict."""
    trust_on_first_use: bool = False
    """Accept and record an unknown host key once; a changed key is refused regardless."""
    zfs: str = "zfs"
    zpool: str = "zpool"
    sudo: bool = False
    connect_timeout: Duration = dt.timedelta(seconds=15)

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


class ReplicateConfig(_Model):
    """``[jobs.NAME.replicate]``: targets and how to send to them."""

    targets: list[str] = Field(min_length=1)
    schedule: CronSchedule | None = "15 * * * *"
    method: Literal["auto", "zfs", "rsync"] = "auto"
    compression: Literal["none", "zstd"] = "none"
    bandwidth_limit: ByteSize | None = None
    """Bytes per second on the wire; None for unlimited."""
    on_divergence: Literal["stop", "rollback"] = "stop"
    retention: Retention | None = None
    """Retention of zbak snapshots on the target; None keeps every received snapshot."""
    protection_budget: ProtectionBudget = ProtectionBudget()

    @field_validator("targets")
    @classmethod
    def _targets(cls, values: list[str]) -> list[str]:
        for value in values:
            parse_endpoint(value, allow_directory=True)
        if len(set(values)) != len(values):
            raise ValueError("targets are listed twice")
        return values

    def endpoints(self) -> list[Endpoint]:
        """The targets, parsed."""
        return [parse_endpoint(t, allow_directory=True) for t in self.targets]


class ArchiveConfig(_Model):
    """``[jobs.NAME.archive]``: the chain policy and retention for one store."""

    store: str
    schedule: CronSchedule | None = "30 2 * * *"
    full_every: Duration = dt.timedelta(days=30)
    max_chain_length: int = Field(30, ge=1)
    max_chain_bytes: ByteSize | None = None
    keep_chains: int = Field(2, ge=1)
    max_age: Duration | None = None
    storage_class: StorageClasses | None = None
    """Overrides the store's classes for this job."""
    compression_level: int = Field(3, ge=1, le=22)


class JobConfig(_Model):
    """``[jobs.NAME]``: one source dataset (tree) and what to do with it."""

    dataset: str
    recursive: bool = False
    exclude: list[str] = []
    """Child datasets (relative to ``dataset``, or absolute) left out of a recursive job."""
    snapshot: SnapshotPolicy = SnapshotPolicy()
    replicate: ReplicateConfig | None = None
    archive: ArchiveConfig | None = None

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

    @property
    def source(self) -> Endpoint:
        """The source dataset, parsed."""
        return parse_endpoint(self.dataset, allow_directory=False)


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

    @field_validator("hosts", "stores", "jobs")
    @classmethod
    def _names(cls, value: dict) -> dict:
        for name in value:
            if not _CONFIG_NAME.match(name):
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
            if job.archive and job.archive.store not in self.stores:
                problems.append(
                    (f"jobs.{name}.archive.store",
                     f"store {job.archive.store!r} is not defined under [stores]")
                )
        return problems
