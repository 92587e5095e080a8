"""``[jobs.NAME]``: one source dataset (tree) and what to do with it: snapshot, replicate,
archive, drill, with hooks around each action and an optional selection by a user property."""

from __future__ import annotations

import datetime as dt
import functools
from typing import Literal

from pydantic import Field, StrictBool, field_validator, model_validator

from zrepl_py.config.archive import ArchiveConfig
from zrepl_py.config.copies import CopyConfig
from zrepl_py.config.daemon import DaemonAction
from zrepl_py.config.drill import DrillConfig
from zrepl_py.config.hosts import DatasetEndpoint, Endpoint, parse_endpoint
from zrepl_py.config.replicate import ReplicateConfig
from zrepl_py.config.retention import DEFAULT_SNAPSHOT_RETENTION, Retention
from zrepl_py.errors import CommandFailed, InvalidName
from zrepl_py.proc.executor import COMMAND_NOT_FOUND
from zrepl_py.values.fields import ByteSize, CronSchedule, Duration, Table
from zrepl_py.zfs.names import (
    DatasetName,
    check_short_name,
    check_user_property,
    check_user_property_value,
)


class SnapshotPolicy(Table):
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



HOOK_TIMEOUT_MAX = dt.timedelta(hours=24)


class HookConfig(Table):
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


class SelectConfig(Table):
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


class JobConfig(Table):
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
    copies: dict[str, CopyConfig] = Field({}, alias="copy")
    """``[jobs.NAME.copy.STORE]``: the stores ``zbak copy NAME`` copies the job's streams to
    (docs/copies.md); ``copy`` is the key (a field named ``copy`` would shadow
    ``BaseModel.copy``)."""
    drill: DrillConfig | None = None
    """Scheduled restore drills (``zbak drill``); without it the daemon drills nothing."""
    hooks: dict[DaemonAction, HookConfig] = {}
    """Pre and post commands per action (``snapshot``, ``replicate``, ``archive``, ``prune``,
    ``audit``, ``drill``)."""

    @model_validator(mode="before")
    @classmethod
    def _select_walks_the_tree(cls, data: object) -> object:
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
    def source(self) -> DatasetEndpoint:
        """The source dataset, parsed (once: commands over 100,000 streams ask per stream)."""
        return parse_endpoint(self.dataset, allow_directory=False)



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
