"""Running transfers published for ``zbak status``: one small JSON file per transfer.

The process moving a stream (a replication to one target, an archive run to one store, a
restore) writes ``<state_dir>/running/<kind>-<job>-<where>.json`` (``Slot.path``; a
replication moving several datasets to one target at once, one file per dataset,
``<kind>-<job>-<where>-<dataset>.json``): what is sent
(dataset, from/to snapshot), bytes so far, the expected bytes when known, rate (bytes/s), ETA
(seconds), start time (aware UTC) and its PID. The file is replaced atomically (a temporary
file renamed over it, rename(2)), at most once per ``Publisher.every`` seconds, and removed
when the transfer ends, successfully or not. It is not fsync-ed: it only matters while its
process lives, and a reader never sees a torn file because of the rename.

A process killed with SIGKILL leaves its file behind. ``read_running`` tells those apart by the
PID *and* the process start time recorded beside it (field 22 of /proc/PID/stat, proc(5)): a
file whose process is gone, or whose PID now belongs to another process, is stale; it is
returned as ``StaleTransfer`` and removed. The recorded process is the zbak that wrote the
file, so a live match is a zbak process (without /proc, only ``kill(pid, 0)`` is checked).
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zrepl_py.observe.progress import Estimate, ProgressReporter
from zrepl_py.runtime.owner import process_start
from zrepl_py.runtime.statedir import ensure_private_dir

if TYPE_CHECKING:  # the config (pydantic) loads only where a transfer is published
    from zrepl_py.config.schema import Config

log = logging.getLogger(__name__)

DIRECTORY = "running"
"""The sub-directory of the state dir holding the files."""

KINDS = ("replicate", "archive", "restore", "failback")
"""What a transfer can be part of."""

_NAME_MAX = 200  # bytes of a file name before it is shortened (NAME_MAX is 255 on Linux)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="@+=,._")


def process_gone(pid: int, start: int | None) -> str | None:
    """Why the process that recorded ``(pid, start)`` no longer runs, or None if it does.

    With /proc, the process must exist with the same start time (a PID reused by another
    process is not the writer); without it, ``kill(pid, 0)`` (kill(2)) must not say ESRCH.
    """
    if pid <= 0:
        return f"invalid pid {pid}"
    if os.path.isdir("/proc/self"):
        now = process_start(pid)
        if now is None:
            return f"process {pid} is gone"
        if start is not None and now != start:
            return f"pid {pid} now belongs to another process"
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"process {pid} is gone"
    except PermissionError:
        pass  # exists, owned by another user
    return None


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where one run publishes its transfers: ``<state_dir>/running/<kind>-<job>-<where>.json``.

    Attributes:
        state_dir: the config's state directory.
        kind: one of ``KINDS``.
        job: the job's name (for a restore, the job whose source holds the dataset, or ``-``).
        where: the replication target string, the archive store's name, or (restore) the
            dataset created.
        part: what tells apart the transfers one run makes at once to ``where`` (the
            source dataset), or None.
    """

    state_dir: Path
    kind: str
    job: str
    where: str
    part: str | None = None

    @property
    def path(self) -> Path:
        """The slot's file; characters other than letters, digits and ``@+=,._`` are
        %-encoded, and a name over 200 bytes is cut and suffixed with a hash."""
        name = f"{_quote(self.kind)}-{_quote(self.job)}-{_quote(self.where)}"
        if self.part is not None:
            name += f"-{_quote(self.part)}"
        if len(name) > _NAME_MAX:
            name = name[:_NAME_MAX - 17] + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]
        return Path(self.state_dir) / DIRECTORY / f"{name}.json"

    def publisher(self, **what: Any) -> Publisher:
        """A ``Publisher`` on this slot; ``what`` as ``Publisher``'s keyword arguments."""
        return Publisher(self, **what)


@dataclasses.dataclass(frozen=True)
class RunningTransfer:
    """One running transfer as its process published it (see the module doc).

    Attributes:
        kind / job / where: as in ``Slot``.
        dataset: the source dataset being sent (for a restore, the catalogued dataset).
        from_snapshot: the incremental's base snapshot (short name), None for a full.
        to_snapshot: the snapshot sent up to (short name), None when unknown.
        bytes: bytes moved so far; None when the transfer cannot count them (rsync).
        expected_bytes: the expected total in bytes, None when unknown.
        rate: bytes per second over the last seconds, None until known.
        eta_seconds: seconds left, None when unknown (no expected size or rate).
        started_at / updated_at: aware UTC.
        pid: the process moving the bytes; pid_start: its start time (``process_start``).
    """

    kind: str
    job: str
    where: str
    dataset: str
    from_snapshot: str | None
    to_snapshot: str | None
    bytes: int | None
    expected_bytes: int | None
    rate: float | None
    eta_seconds: float | None
    started_at: dt.datetime
    updated_at: dt.datetime
    pid: int
    pid_start: int | None

    def to_json(self) -> builtins.bytes:
        """Serialize (datetimes as ISO 8601 UTC)."""
        obj = dataclasses.asdict(self)
        obj["started_at"] = self.started_at.isoformat()
        obj["updated_at"] = self.updated_at.isoformat()
        return json.dumps(obj, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: builtins.bytes) -> RunningTransfer:
        """Parse ``to_json`` output.

        Raises:
            ValueError: not such a record (bad JSON, a missing field, a naive datetime).
        """
        try:
            obj = json.loads(data)
            fields = {f.name: obj[f.name] for f in dataclasses.fields(cls)}
            for key in ("started_at", "updated_at"):
                fields[key] = dt.datetime.fromisoformat(fields[key])
                if fields[key].tzinfo is None:
                    raise ValueError(f"{key} has no time zone")
            fields["pid"] = int(fields["pid"])
        except (TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"not a running-transfer record: {exc!r}") from exc
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class StaleTransfer:
    """A running-transfer file whose process is gone (or that cannot be read).

    Attributes:
        path: the file (removed by ``read_running``).
        reason: why it is stale.
        transfer: its record when it could be parsed, else None.
    """

    path: str
    reason: str
    transfer: RunningTransfer | None


class Publisher:
    """Publishes one transfer's progress to its slot's file; never raises for the file.

    Created, it writes the first record at once (bytes 0, or None when ``measured`` is
    false); ``update`` rewrites it at most every ``every`` seconds; ``close`` removes it.
    A file that cannot be written is logged once as a warning and the transfer goes on.

    Args:
        slot: where to publish.
        dataset: the source dataset sent.
        from_snapshot / to_snapshot: short snapshot names (None: full / unknown).
        total: the expected bytes, or None.
        measured: False for a transfer that cannot count its bytes (``bytes`` stays None).
        every: seconds between writes.
        clock: returns aware UTC now (default the system clock).
    """

    def __init__(self, slot: Slot, *, dataset: str, from_snapshot: str | None = None,
                 to_snapshot: str | None = None, total: int | None = None,
                 measured: bool = True, every: float = 1.0,
                 clock: Callable[[], dt.datetime] = _utcnow):
        self.slot = slot
        self.path = slot.path
        self.every = every
        self._clock = clock
        self._last_write: float | None = None
        self._warned = False
        self._closed = False
        now = clock()
        pid = os.getpid()
        self.record = RunningTransfer(
            kind=slot.kind, job=slot.job, where=slot.where, dataset=dataset,
            from_snapshot=from_snapshot, to_snapshot=to_snapshot,
            bytes=0 if measured else None, expected_bytes=total, rate=None, eta_seconds=None,
            started_at=now, updated_at=now, pid=pid, pid_start=process_start(pid),
        )
        try:
            ensure_private_dir(self.path.parent)
        except OSError as exc:
            self._warn(exc)
        self._write()

    def update(self, estimate: Estimate) -> None:
        """Record ``estimate`` (a ``observe.progress.Estimate``); written if ``every`` passed."""
        if self._closed:
            return
        self.record = dataclasses.replace(
            self.record, bytes=estimate.bytes if self.record.bytes is not None else None,
            expected_bytes=estimate.total if estimate.total is not None
            else self.record.expected_bytes,
            rate=estimate.rate, eta_seconds=estimate.eta, updated_at=self._clock())
        if self._last_write is None or time.monotonic() - self._last_write >= self.every:
            self._write()

    def _write(self) -> None:
        self._last_write = time.monotonic()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(self.record.to_json())
            os.replace(tmp, self.path)
        except OSError as exc:
            self._warn(exc)

    def _warn(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning("cannot publish transfer progress to %s: %s", self.path, exc)

    def close(self) -> None:
        """Remove the file (idempotent; later updates are ignored)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            self._warn(exc)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_running(state_dir: Path, *, remove_stale: bool = True
                 ) -> tuple[list[RunningTransfer], list[StaleTransfer]]:
    """The transfers published under ``state_dir`` whose process still runs, and the stale
    files (process gone or PID reused, or unreadable), which are removed unless
    ``remove_stale`` is false. Sorted by kind, job, where. Never raises for a file."""
    directory = Path(state_dir) / DIRECTORY
    try:
        paths = sorted(p for p in directory.iterdir()
                       if p.suffix == ".json" and not p.name.startswith("."))
    except OSError:
        return [], []
    live: list[RunningTransfer] = []
    stale: list[StaleTransfer] = []
    for path in paths:
        try:
            record = RunningTransfer.from_json(path.read_bytes())
        except FileNotFoundError:
            continue  # the transfer ended while we listed
        except (OSError, ValueError) as exc:
            stale.append(StaleTransfer(str(path), f"unreadable: {exc}", None))
        else:
            reason = process_gone(record.pid, record.pid_start)
            if reason is None:
                live.append(record)
                continue
            stale.append(StaleTransfer(str(path), reason, record))
        if remove_stale:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.debug("cannot remove stale %s: %s", path, exc)
    live.sort(key=lambda r: (r.kind, r.job, r.where))
    return live, stale


def progress_callback(label: str, total: int | None = None, *, dataset: str | None = None,
                      from_snap: str | None = None, to_snap: str | None = None,
                      publish: Slot | None = None) -> ProgressReporter:
    """Return a ``ProgressReporter`` on stderr for ``run_pipeline(progress=...)``.

    ``run_pipeline`` calls its ``finish`` (summary line) and ``close`` (stops a bar), so the
    caller need not.

    Args:
        label: what moves, e.g. ``"tank/data@x -> backup"``.
        total: the expected stream size in bytes (``zfs send -nP``), or None.
        dataset / from_snap / to_snap: what is sent (source dataset, short snapshot names;
            ``from_snap`` None for a full), for ``publish``; ``dataset`` defaults to ``label``.
        publish: when given, the reporter also publishes to this ``transfers.Slot`` for
            ``zbak status`` (file written now, removed when the reporter closes).
    """
    sink = None
    if publish is not None:
        sink = publish.publisher(dataset=dataset or label, from_snapshot=from_snap,
                                 to_snapshot=to_snap, total=total)
    return ProgressReporter(label, total=total, sink=sink)


def reporting(state_dir: Path, kind: str, job: str, where: str
              ) -> Callable[..., ProgressReporter]:
    """``progress_callback`` publishing to ``Slot(state_dir, kind, job, where, dataset)``
    (one file per dataset: a run replicates several at once): the ``progress`` factory of
    ``replication.zfs_target.Transfer``, called as ``factory(label, dataset=...,
    from_snap=..., to_snap=..., total=...)``."""

    def factory(label: str, total: int | None = None, *, dataset: str | None = None,
                **what: str | None) -> ProgressReporter:
        slot = Slot(Path(state_dir), kind, job, where, dataset)
        return progress_callback(label, total, dataset=dataset, publish=slot, **what)

    return factory


def job_of(config: Config, host: str, dataset: str) -> str:
    """The name of the first job whose source is ``dataset`` on ``host`` or an ancestor of it
    (a restore's owner in ``zbak status``); ``-`` when none is."""
    for name, job in config.jobs.items():
        root = str(job.source.dataset)
        if job.source.host == host and (dataset == root or dataset.startswith(root + "/")):
            return name
    return "-"
