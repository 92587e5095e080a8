"""``[jobs.NAME.replicate]``: targets, how to send to them, what their replicas keep and get."""

from __future__ import annotations

import dataclasses
import fnmatch
import posixpath
import re
from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    field_validator,
    model_validator,
)

from zrepl_py.config.hosts import Endpoint, parse_endpoint
from zrepl_py.config.retention import Retention
from zrepl_py.proc import mbuffer
from zrepl_py.values.fields import BandwidthLimit, ByteSize, CronSchedule, Duration, Table
from zrepl_py.values.timetable import Timetable
from zrepl_py.values.units import parse_size
from zrepl_py.zfs.properties import ReceiveProperties
from zrepl_py.zfs.properties import check_name as check_property
from zrepl_py.zfs.properties import check_value as check_property_value


class ProtectionBudget(Table):
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


class ReplicaProperties(Table):
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


class SnapshotFilter(Table):
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


class ReplicateConfig(Table):
    """``[jobs.NAME.replicate]``: targets and how to send to them."""

    targets: list[str] = Field(min_length=1)
    schedule: CronSchedule | None = "15 * * * *"
    method: Literal["auto", "zfs", "rsync"] = "auto"
    compression: Literal["none", "zstd"] = "none"
    bandwidth_limit: BandwidthLimit = Timetable()
    """Bytes per second on the wire, shared by the transfers running at once, or a weekly
    timetable of limits in UTC (``values.timetable``); ``Timetable()`` (``"off"``): none."""
    concurrency: int | None = Field(default=None, ge=1, le=64)
    """Datasets replicated at once to each target; None: sized to this machine
    (``replication.order.default_concurrency``)."""
    receive_buffer: ByteSize = 64 * 1024 * 1024
    """Bytes of an mbuffer(1) right before ``zfs receive`` on the receiving host, when the
    stream crosses ssh and that host has mbuffer (``transport.stages``); 0: none."""
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
    failover_mountpoint: str | None = None
    """Where ``zbak failover`` mounts the replica of the job's dataset (its children below
    it, as on the source): an absolute path, ``none`` or ``legacy``; None: the source's
    mountpoint recorded at the last replication (``values.failover.MOUNTPOINT_PROPERTY``)."""

    @field_validator("failover_mountpoint")
    @classmethod
    def _failover_mountpoint(cls, value: str | None) -> str | None:
        if value is None or value in ("none", "legacy"):
            return value
        if not value.startswith("/") or posixpath.normpath(value) != value or value == "/" \
                or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError(f"{value!r}: a normalised absolute path other than / (no '..', "
                             "no trailing '/'), or none, or legacy")
        return value

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
