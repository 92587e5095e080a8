"""The failover state zbak records on the datasets themselves (PURE; docs/design.md#zfs-properties-and-holds-zbak-sets).

The master's catalog may be gone or stale when it matters (a dead master, a master whose
disks come back with last week's catalog), so the state lives where every host sees it:

- ``zbak:failover`` on each replica dataset a failover promoted (``FailoverMark``): replication
  refuses to receive into, or roll back, a dataset carrying it, whatever a catalog says
  (docs/decisions.md#failed-over-is-recorded-on-the-replica). Cleared by the last step of a
  failback.
- ``zbak:failover-source`` on a source dataset that is not live (``SourceMark``): made
  read-only by a planned failover, or being brought back by a failback. It keeps its own
  ``readonly`` from before, which the failback's last step puts back.
- ``zbak:source-mountpoint`` on a replica: the source's mountpoint, recorded by replication
  (the root always, a child only where its source's mountpoint is set on it rather than
  inherited; the user property is inherited like any other), the default mountpoint of a
  failover.
- the hold ``zbak:<job>:failover`` on the replica snapshot that was newest at failover (the
  way back without a full resend), released by the failback's last step.

Values are ``key=value`` fields joined by ``;``: no ZFS name, job name or time holds a ``;``
or ``=``, so the text splits one way only.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from zrepl_py.errors import InvalidName
from zrepl_py.values.names import is_config_name
from zrepl_py.zfs.names import DatasetName, check_hold_tag, check_short_name

FAILOVER_PROPERTY = "zbak:failover"
SOURCE_PROPERTY = "zbak:failover-source"
MOUNTPOINT_PROPERTY = "zbak:source-mountpoint"
MARK_PROPERTIES = (FAILOVER_PROPERTY, SOURCE_PROPERTY)

KEPT_INFIX = "-before-failback-"
"""Between a source dataset's name and the failover's time in the name of the dataset that
keeps what the source wrote after the common snapshot."""

_TIME = "%Y-%m-%dT%H:%M:%SZ"
_UNSET = "-"
_READONLY = ("on", "off")


class InvalidMark(InvalidName, ValueError):
    """A ``zbak:failover`` or ``zbak:failover-source`` value zbak did not write (or a field
    out of range): nothing is done on its word."""


def _fields(text: str, what: str, keys: tuple[str, ...]) -> dict[str, str]:
    found: dict[str, str] = {}
    for part in text.split(";"):
        key, sep, value = part.partition("=")
        if not sep or key not in keys or key in found:
            raise InvalidMark(f"{what} {text[:200]!r}: not a value zbak writes "
                              f"({';'.join(f'{k}=...' for k in keys)})")
        found[key] = value
    return found


def _time(value: str, what: str) -> dt.datetime:
    try:
        return dt.datetime.strptime(value, _TIME).replace(tzinfo=dt.UTC)
    except ValueError:
        raise InvalidMark(f"{what}: time {value!r} is not YYYY-MM-DDTHH:MM:SSZ") from None


def _job(value: str, what: str) -> str:
    if not is_config_name(value):
        raise InvalidMark(f"{what}: {value!r} is not a job name")
    return value


def _whole_seconds(at: dt.datetime) -> dt.datetime:
    if at.tzinfo is None:
        raise ValueError("a failover time must be aware UTC")
    return at.astimezone(dt.UTC).replace(microsecond=0)


@dataclasses.dataclass(frozen=True)
class FailoverMark:
    """``zbak:failover`` of one replica dataset: it was made live by a failover.

    Attributes:
        at: when the failover began (aware UTC, whole seconds); the same on every dataset
            of one failover, and the time in the kept-aside dataset's name (``kept_name``).
        job: the job failed over.
        planned: ``zbak failover --planned`` (the source was frozen and caught up first).
        base: short name of the replica snapshot held with ``hold_tag(job)`` as the way
            back (its newest at failover); None when the replica had no snapshot.

    Raises:
        InvalidMark: a bad job or base name (on construction).
    """

    at: dt.datetime
    job: str
    planned: bool = False
    base: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", _whole_seconds(self.at))
        _job(self.job, "failover mark")
        if self.base is not None:
            try:
                check_short_name(self.base, "failover base snapshot")
            except InvalidName as exc:
                raise InvalidMark(str(exc)) from None

    def value(self) -> str:
        """The property value (see the module doc)."""
        fields = [f"at={self.at.strftime(_TIME)}", f"job={self.job}",
                  f"planned={'yes' if self.planned else 'no'}"]
        if self.base is not None:
            fields.append(f"base={self.base}")
        return ";".join(fields)

    @classmethod
    def parse(cls, text: str) -> FailoverMark:
        """Read a ``zbak:failover`` value.

        Raises:
            InvalidMark: ``text`` is not a value ``value`` writes.
        """
        what = FAILOVER_PROPERTY
        found = _fields(text, what, ("at", "job", "planned", "base"))
        if "at" not in found or "job" not in found or found.get("planned") not in ("yes", "no"):
            raise InvalidMark(f"{what} {text[:200]!r}: at, job and planned=yes|no are needed")
        return cls(_time(found["at"], what), _job(found["job"], what),
                   found["planned"] == "yes", found.get("base"))

    @property
    def stamp(self) -> str:
        """``at`` as ``YYYYMMDDTHHMMSSZ`` (for names)."""
        return self.at.strftime("%Y%m%dT%H%M%SZ")


@dataclasses.dataclass(frozen=True)
class SourceMark:
    """``zbak:failover-source`` of one source dataset: not live, because a planned failover
    froze it or a failback is bringing it back.

    Attributes:
        at: when it was marked (aware UTC, whole seconds).
        job: the job.
        readonly: its own ``readonly`` before zbak set it ``on`` (``"on"``/``"off"`` set on
            it, None: inherited), put back when it goes live again.
    """

    at: dt.datetime
    job: str
    readonly: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", _whole_seconds(self.at))
        _job(self.job, "failover source mark")
        if self.readonly not in (None, *_READONLY):
            raise InvalidMark(f"failover source mark: readonly {self.readonly!r} is not on, "
                              "off or -")

    def value(self) -> str:
        """The property value (see the module doc)."""
        return ";".join([f"at={self.at.strftime(_TIME)}", f"job={self.job}",
                         f"readonly={self.readonly or _UNSET}"])

    @classmethod
    def parse(cls, text: str) -> SourceMark:
        """Read a ``zbak:failover-source`` value.

        Raises:
            InvalidMark: ``text`` is not a value ``value`` writes.
        """
        what = SOURCE_PROPERTY
        found = _fields(text, what, ("at", "job", "readonly"))
        if set(found) != {"at", "job", "readonly"}:
            raise InvalidMark(f"{what} {text[:200]!r}: at, job and readonly are needed")
        return cls(_time(found["at"], what), _job(found["job"], what),
                   None if found["readonly"] == _UNSET else found["readonly"])


def hold_tag(job: str) -> str:
    """The hold on a replica's way back: ``zbak:<job>:failover`` (no replication target is
    written without a ``:``, so it never equals ``zbak:<job>:<target>``)."""
    return check_hold_tag(f"zbak:{_job(job, 'hold tag')}:failover")


def kept_name(dataset: DatasetName, mark: FailoverMark) -> DatasetName:
    """Where a failback keeps the source dataset ``dataset`` as it was (what it wrote after
    the common snapshot): ``DATASET-before-failback-YYYYMMDDTHHMMSSZ``, a sibling, outside
    the job's tree.

    Raises:
        InvalidName: ``dataset`` is a pool (its root dataset cannot be renamed), or the
            name would be longer than ZFS allows.
    """
    if "/" not in dataset:
        raise InvalidName(f"{dataset} is a pool's root dataset, which cannot be renamed: "
                          "a failback cannot keep its later writes aside")
    return DatasetName(f"{dataset}{KEPT_INFIX}{mark.stamp}")
