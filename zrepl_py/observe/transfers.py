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

Format (docs/design.md#running-transfers): one JSON object, ``RunningTransfer``'s fields;
``expected_source`` says where ``expected_bytes`` came from (``zfs send -nP``, the full's
``referenced``, the catalog's stream sizes) and ``rate_limit`` is the bandwidth limit of the
run in force at ``updated_at`` (bytes/s, None: none). Fields added later are optional to a
reader (a file of an older zbak still reads), and a reader ignores fields it does not know.

Beside them, each run that works through several datasets (a replication to one target, an
archive run) publishes its queue, ``<state_dir>/running/queues/<kind>-<job>-<where>.json``
(``QueuedRun``): the datasets not started yet, how many ended, the limit in force; written the
same way by ``Queue``, each time a dataset starts or ends, removed at the run's end. It
lives in a sub-directory, so a reader of transfers never takes it for one.

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
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from zrepl_py.observe.progress import Estimate, ProgressReporter
from zrepl_py.runtime.owner import process_start
from zrepl_py.runtime.statedir import ensure_private_dir

if TYPE_CHECKING:  # the config (pydantic) loads only where a transfer is published
    from zrepl_py.config.schema import Config

log = logging.getLogger(__name__)

DIRECTORY = "running"
"""The sub-directory of the state dir holding the files."""
QUEUES = "queues"
"""The sub-directory of ``DIRECTORY`` holding the runs' queues."""

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
    def name(self) -> str:
        """The slot's file name: characters other than letters, digits and ``@+=,._`` are
        %-encoded, and a name over 200 bytes is cut and suffixed with a hash."""
        name = f"{_quote(self.kind)}-{_quote(self.job)}-{_quote(self.where)}"
        if self.part is not None:
            name += f"-{_quote(self.part)}"
        if len(name) > _NAME_MAX:
            name = name[:_NAME_MAX - 17] + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]
        return f"{name}.json"

    @property
    def path(self) -> Path:
        """The slot's transfer file (``name`` under ``<state_dir>/running``)."""
        return Path(self.state_dir) / DIRECTORY / self.name

    @property
    def queue_path(self) -> Path:
        """The file of the run's queue (``name`` under ``<state_dir>/running/queues``; the
        slot's ``part`` left out)."""
        whole = dataclasses.replace(self, part=None)
        return Path(self.state_dir) / DIRECTORY / QUEUES / whole.name

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
        expected_source: where ``expected_bytes`` came from: ``"send -nP"`` (OpenZFS's dry
            run), ``"referenced"`` (a full's snapshot, where zfs has no ``send -nP``),
            ``"catalog"`` (a restore's streams), None when unknown.
        rate_limit: the run's bandwidth limit in force, bytes/s; None for none.
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
    expected_source: str | None = None
    rate_limit: int | None = None

    def to_json(self) -> builtins.bytes:
        """Serialize (datetimes as ISO 8601 UTC)."""
        return _dump(self)

    @classmethod
    def from_json(cls, data: builtins.bytes) -> RunningTransfer:
        """Parse ``to_json`` output (fields with a default may be missing: see the module
        doc).

        Raises:
            ValueError: not such a record (bad JSON, a missing field, a naive datetime).
        """
        return _load(cls, data)


_Record = TypeVar("_Record", "RunningTransfer", "QueuedRun")
_TIMES = ("started_at", "updated_at")


def _dump(record: RunningTransfer | QueuedRun) -> builtins.bytes:
    obj = dataclasses.asdict(record)
    for key in _TIMES:
        obj[key] = obj[key].isoformat()
    return json.dumps(obj, sort_keys=True).encode()


def _load(cls: type[_Record], data: builtins.bytes) -> _Record:
    try:
        obj = json.loads(data)
        fields = {f.name: obj[f.name] for f in dataclasses.fields(cls)
                  if f.name in obj or f.default is dataclasses.MISSING}
        for key in _TIMES:
            fields[key] = dt.datetime.fromisoformat(fields[key])
            if fields[key].tzinfo is None:
                raise ValueError(f"{key} has no time zone")
        fields["pid"] = int(fields["pid"])
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"not a {cls.__name__} record: {exc!r}") from exc
    return cls(**fields)


@dataclasses.dataclass(frozen=True)
class QueuedRun:
    """A run's queue as its process published it (see the module doc).

    Attributes:
        kind / job / where: as in ``Slot``.
        queued: the datasets not started yet, in the order they will start (at most
            ``QUEUED_MAX``; ``waiting`` counts them all).
        waiting: how many datasets are not started yet.
        running: how many are moving now; done: how many ended (well or not).
        rate_limit: the run's bandwidth limit in force, bytes/s; None for none.
        started_at / updated_at: aware UTC.
        pid / pid_start: as in ``RunningTransfer``.
    """

    kind: str
    job: str
    where: str
    queued: list[str]
    waiting: int
    running: int
    done: int
    rate_limit: int | None
    started_at: dt.datetime
    updated_at: dt.datetime
    pid: int
    pid_start: int | None

    def to_json(self) -> builtins.bytes:
        """Serialize (datetimes as ISO 8601 UTC)."""
        return _dump(self)

    @classmethod
    def from_json(cls, data: builtins.bytes) -> QueuedRun:
        """Parse ``to_json`` output.

        Raises:
            ValueError: not such a record.
        """
        return _load(cls, data)


QUEUED_MAX = 100
"""Names of queued datasets a queue file lists at most (a tree of 10,000 waits in one run)."""


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


class _File:
    """One published file: replaced atomically (a temporary file renamed over it), at most
    every ``every`` seconds unless forced, removed by ``remove``; never raises for the file
    (the first failure is logged as a warning, the transfer goes on)."""

    def __init__(self, path: Path, every: float):
        self.path = path
        self.every = every
        self._last_write: float | None = None
        self._warned = False
        try:
            ensure_private_dir(path.parent)
        except OSError as exc:
            self._warn(exc)

    def due(self) -> bool:
        """True when ``every`` seconds passed since the last write (or none was made)."""
        return self._last_write is None or time.monotonic() - self._last_write >= self.every

    def write(self, data: builtins.bytes) -> None:
        """Replace the file's content with ``data``."""
        self._last_write = time.monotonic()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            os.replace(tmp, self.path)
        except OSError as exc:
            self._warn(exc)

    def remove(self) -> None:
        """Remove the file (gone already is fine)."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            self._warn(exc)

    def _warn(self, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning("cannot publish transfer progress to %s: %s", self.path, exc)


Limit = Callable[[], "int | None"]
"""Returns the run's bandwidth limit in force now (bytes/s; None: none)."""


def _no_limit() -> int | None:
    return None


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
        expected_source: where ``total`` came from (``RunningTransfer.expected_source``).
        measured: False for a transfer that cannot count its bytes (``bytes`` stays None).
        limit: returns the run's bandwidth limit in force (read at each write).
        every: seconds between writes.
        clock: returns aware UTC now (default the system clock).
    """

    def __init__(self, slot: Slot, *, dataset: str, from_snapshot: str | None = None,
                 to_snapshot: str | None = None, total: int | None = None,
                 expected_source: str | None = None, measured: bool = True,
                 limit: Limit = _no_limit, every: float = 1.0,
                 clock: Callable[[], dt.datetime] = _utcnow):
        self.slot = slot
        self.path = slot.path
        self._clock = clock
        self._limit = limit
        self._closed = False
        now = clock()
        pid = os.getpid()
        self.record = RunningTransfer(
            kind=slot.kind, job=slot.job, where=slot.where, dataset=dataset,
            from_snapshot=from_snapshot, to_snapshot=to_snapshot,
            bytes=0 if measured else None, expected_bytes=total, rate=None, eta_seconds=None,
            started_at=now, updated_at=now, pid=pid, pid_start=process_start(pid),
            expected_source=expected_source if total is not None else None,
            rate_limit=limit(),
        )
        self._file = _File(self.path, every)
        self._file.write(self.record.to_json())

    @property
    def every(self) -> float:
        """Seconds between two writes."""
        return self._file.every

    @every.setter
    def every(self, seconds: float) -> None:
        self._file.every = seconds

    def update(self, estimate: Estimate) -> None:
        """Record ``estimate`` (a ``observe.progress.Estimate``); written if ``every`` passed."""
        if self._closed:
            return
        self.record = dataclasses.replace(
            self.record, bytes=estimate.bytes if self.record.bytes is not None else None,
            expected_bytes=estimate.total if estimate.total is not None
            else self.record.expected_bytes,
            rate=estimate.rate, eta_seconds=estimate.eta, updated_at=self._clock())
        if self._file.due():
            self.record = dataclasses.replace(self.record, rate_limit=self._limit())
            self._file.write(self.record.to_json())

    def close(self) -> None:
        """Remove the file (idempotent; later updates are ignored)."""
        if self._closed:
            return
        self._closed = True
        self._file.remove()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Queue:
    """Publishes a run's queue (``QueuedRun``) to ``slot.queue_path``; never raises for the
    file. Written at once and each time a dataset starts or ends (a small file, not fsync-ed:
    a tree of 10,000 datasets costs 20,000 renames, about a second); removed by ``close``.
    Thread-safe (a replication's workers call it).

    Args:
        slot: the run's slot (its ``part`` is ignored).
        datasets: every dataset the run will work through, in order.
        limit: returns the run's bandwidth limit in force.
        clock: returns aware UTC now.
    """

    def __init__(self, slot: Slot, datasets: list[str], *, limit: Limit = _no_limit,
                 clock: Callable[[], dt.datetime] = _utcnow):
        self._lock = threading.Lock()
        self._waiting = list(datasets)
        self._running: set[str] = set()
        self._done = 0
        self._limit = limit
        self._clock = clock
        self._closed = False
        now = clock()
        pid = os.getpid()
        self.record = QueuedRun(kind=slot.kind, job=slot.job, where=slot.where, queued=[],
                                waiting=0, running=0, done=0, rate_limit=None, started_at=now,
                                updated_at=now, pid=pid, pid_start=process_start(pid))
        self._file = _File(slot.queue_path, 0.0)
        self._publish()

    def started(self, dataset: str) -> None:
        """``dataset`` left the queue and is moving."""
        with self._lock:
            if dataset in self._waiting:
                self._waiting.remove(dataset)
            self._running.add(dataset)
            self._publish()

    def ended(self, dataset: str) -> None:
        """``dataset`` ended (well or not, or it had nothing to send)."""
        with self._lock:
            if dataset in self._waiting:
                self._waiting.remove(dataset)
            self._running.discard(dataset)
            self._done += 1
            self._publish()

    def _publish(self) -> None:
        if self._closed:
            return
        self.record = dataclasses.replace(
            self.record, queued=self._waiting[:QUEUED_MAX], waiting=len(self._waiting),
            running=len(self._running), done=self._done, rate_limit=self._limit(),
            updated_at=self._clock())
        self._file.write(self.record.to_json())

    def close(self) -> None:
        """Remove the file (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._file.remove()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _read_live(directory: Path, cls: type[_Record], *, remove_stale: bool
               ) -> tuple[list[_Record], list[tuple[Path, str, _Record | None]]]:
    """The records of ``cls`` in ``directory`` whose process still runs, and the stale ones
    (path, why, record or None), removed unless ``remove_stale`` is false."""
    try:
        paths = sorted(p for p in directory.iterdir()
                       if p.suffix == ".json" and not p.name.startswith(".") and p.is_file())
    except OSError:
        return [], []
    live: list[_Record] = []
    stale: list[tuple[Path, str, _Record | None]] = []
    for path in paths:
        try:
            record = cls.from_json(path.read_bytes())
        except FileNotFoundError:
            continue  # the transfer ended while we listed
        except (OSError, ValueError) as exc:
            stale.append((path, f"unreadable: {exc}", None))
        else:
            reason = process_gone(record.pid, record.pid_start)
            if reason is None:
                live.append(record)
                continue
            stale.append((path, reason, record))
        if remove_stale:
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.debug("cannot remove stale %s: %s", path, exc)
    live.sort(key=lambda r: (r.kind, r.job, r.where))
    return live, stale


def read_running(state_dir: Path, *, remove_stale: bool = True
                 ) -> tuple[list[RunningTransfer], list[StaleTransfer]]:
    """The transfers published under ``state_dir`` whose process still runs, and the stale
    files (process gone or PID reused, or unreadable), which are removed unless
    ``remove_stale`` is false. Sorted by kind, job, where. Never raises for a file."""
    live, stale = _read_live(Path(state_dir) / DIRECTORY, RunningTransfer,
                             remove_stale=remove_stale)
    return live, [StaleTransfer(str(path), why, record) for path, why, record in stale]


def read_queues(state_dir: Path, *, remove_stale: bool = True) -> list[QueuedRun]:
    """The queues published under ``state_dir`` whose process still runs (stale ones are
    removed unless ``remove_stale`` is false, and logged at debug). Never raises for a
    file."""
    live, stale = _read_live(Path(state_dir) / DIRECTORY / QUEUES, QueuedRun,
                             remove_stale=remove_stale)
    for path, why, _ in stale:
        log.debug("dropped stale queue file %s: %s", path, why)
    return live


def progress_callback(label: str, total: int | None = None, *, dataset: str | None = None,
                      from_snap: str | None = None, to_snap: str | None = None,
                      expected_source: str | None = None, publish: Slot | None = None,
                      limit: Limit = _no_limit) -> ProgressReporter:
    """Return a ``ProgressReporter`` on stderr for ``run_pipeline(progress=...)``.

    ``run_pipeline`` calls its ``finish`` (summary line) and ``close`` (stops a bar), so the
    caller need not.

    Args:
        label: what moves, e.g. ``"tank/data@x -> backup"``.
        total: the expected stream size in bytes (``zfs.estimate``), or None.
        dataset / from_snap / to_snap: what is sent (source dataset, short snapshot names;
            ``from_snap`` None for a full), for ``publish``; ``dataset`` defaults to ``label``.
        expected_source: where ``total`` came from (``RunningTransfer.expected_source``).
        publish: when given, the reporter also publishes to this ``transfers.Slot`` for
            ``zbak status`` (file written now, removed when the reporter closes).
        limit: returns the run's bandwidth limit in force, for ``publish``.
    """
    sink = None
    if publish is not None:
        sink = publish.publisher(dataset=dataset or label, from_snapshot=from_snap,
                                 to_snapshot=to_snap, total=total,
                                 expected_source=expected_source, limit=limit)
    return ProgressReporter(label, total=total, sink=sink)


def reporting(state_dir: Path, kind: str, job: str, where: str, *, limit: Limit = _no_limit
              ) -> Callable[..., ProgressReporter]:
    """``progress_callback`` publishing to ``Slot(state_dir, kind, job, where, dataset)``
    (one file per dataset: a run replicates several at once) with the run's ``limit``: the
    ``progress`` factory of ``replication.zfs_target.Transfer``, called as
    ``factory(label, total, dataset=..., from_snap=..., to_snap=..., expected_source=...)``."""

    def factory(label: str, total: int | None = None, *, dataset: str | None = None,
                **what: str | None) -> ProgressReporter:
        slot = Slot(Path(state_dir), kind, job, where, dataset)
        return progress_callback(label, total, dataset=dataset, publish=slot, limit=limit,
                                 **what)

    return factory


def job_of(config: Config, host: str, dataset: str) -> str:
    """The name of the first job whose source is ``dataset`` on ``host`` or an ancestor of it
    (a restore's owner in ``zbak status``); ``-`` when none is."""
    for name, job in config.jobs.items():
        root = str(job.source.dataset)
        if job.source.host == host and (dataset == root or dataset.startswith(root + "/")):
            return name
    return "-"
