"""What ``zbak status --watch`` shows at one moment: the transfers running now, the runs'
queues, the last run per job and action, and the bandwidth limits in force.

Everything comes from the files running processes publish under ``<state_dir>/running``
(``observe.transfers``: read each refresh, a few small files) and one catalog query for the
last runs; no host is dialled, so a refresh every second costs next to nothing. ``sections``
turns a ``WatchView`` into the tables the terminal shows, ``as_json`` into the document
``--json`` prints per refresh: the transfer records are the ones ``zbak status --json`` lists
under each job's ``transfers``, field for field.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zrepl_py.observe.progress import format_eta, format_rate, format_size
from zrepl_py.observe.transfers import QueuedRun, RunningTransfer, read_queues, read_running
from zrepl_py.values.timetable import InForce, rate_text

if TYPE_CHECKING:
    from zrepl_py.catalog.rows import RunRow
    from zrepl_py.config.schema import Config
    from zrepl_py.invocation.context import Context

Section = tuple[str, list[str], list[tuple[Any, ...]]]
"""``(title, columns, rows)`` of one table."""


@dataclasses.dataclass(frozen=True)
class WatchView:
    """One refresh of ``zbak status --watch``.

    Attributes:
        at: when it was read (aware UTC).
        transfers: running transfers of the chosen jobs (``read_running``).
        queues: the runs' queues (``read_queues``).
        last_runs: the newest run per job, action and target (``Catalog.last_runs``).
        limits: per job, the bandwidth limits that exist in it, in force at ``at``:
            ``replicate`` (the job's ``[replicate] bandwidth_limit``) and ``store NAME``
            (the uploads to its archive store).
    """

    at: dt.datetime
    transfers: list[RunningTransfer]
    queues: list[QueuedRun]
    last_runs: list[RunRow]
    limits: dict[str, dict[str, InForce]]


def job_limits(config: Config, name: str, at: dt.datetime) -> dict[str, InForce]:
    """The bandwidth limits of job ``name`` in force at ``at`` (see ``WatchView.limits``);
    those never limited (``"off"`` all week) are left out."""
    job = config.jobs[name]
    found: dict[str, InForce] = {}
    if job.replicate is not None and job.replicate.bandwidth_limit.limited:
        found["replicate"] = job.replicate.bandwidth_limit.at(at)
    if job.archive is not None:
        store = config.stores[job.archive.store].bandwidth_limit
        if store.limited:
            found[f"store {job.archive.store}"] = store.at(at)
    return found


def gather(ctx: Context, names: Sequence[str] = ()) -> WatchView:
    """Read one ``WatchView`` of the jobs ``names`` (all when empty).

    Raises:
        UsageError: an unknown job name.
        CatalogError: the catalog cannot be read.
    """
    chosen = [name for name, _ in ctx.select_jobs(names)]
    transfers, _ = read_running(ctx.state_dir)
    queues = read_queues(ctx.state_dir)
    runs = ctx.catalog().last_runs() if chosen else []
    at = ctx.clock.now()
    wanted = set(chosen)
    return WatchView(
        at=at, transfers=[t for t in transfers if t.job in wanted],
        queues=[q for q in queues if q.job in wanted],
        last_runs=[r for r in runs if r.job in wanted],
        limits={name: job_limits(ctx.config, name, at) for name in chosen})


def _size(value: int | None) -> str:
    return "-" if value is None else format_size(value)


def _when(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def _limit(value: int | None) -> str:
    return rate_text(value)


def eta_text(transfer: RunningTransfer) -> str:
    """The ETA as shown: ``H:MM:SS``, ``unknown`` without an expected size (an incremental
    on zfs-fuse, an rsync), ``?`` until the rate is known."""
    if transfer.expected_bytes is None:
        return "unknown"
    return format_eta(transfer.eta_seconds)


def sent_text(transfer: RunningTransfer) -> str:
    """``DATASET@FROM -> @TO`` (``DATASET@TO`` for a full)."""
    if transfer.from_snapshot:
        return f"{transfer.dataset}@{transfer.from_snapshot} -> @{transfer.to_snapshot or '?'}"
    return f"{transfer.dataset}@{transfer.to_snapshot or '?'}"


def _percent(transfer: RunningTransfer) -> str:
    if transfer.bytes is None or not transfer.expected_bytes:
        return "-"
    return f"{min(100.0, 100 * transfer.bytes / transfer.expected_bytes):.0f}%"


def sections(view: WatchView) -> list[Section]:
    """The tables of one refresh: transfers (always, empty or not), queues, last runs and
    bandwidth limits (when there are any)."""
    found: list[Section] = [(
        f"transfers at {_when(view.at)}",
        ["job", "kind", "target/store", "sending", "done", "expected", "%", "rate", "ETA",
         "limit"],
        [(t.job, t.kind, t.where, sent_text(t), _size(t.bytes), _size(t.expected_bytes),
          _percent(t), "-" if t.rate is None else format_rate(t.rate), eta_text(t),
          _limit(t.rate_limit)) for t in view.transfers])]
    if view.queues:
        found.append(("queued", ["job", "kind", "target/store", "running", "waiting", "done",
                                 "next"],
                      [(q.job, q.kind, q.where, q.running, q.waiting, q.done,
                        ", ".join(q.queued[:3]) + (", ..." if q.waiting > 3 else ""))
                       for q in view.queues]))
    if view.last_runs:
        found.append(("last runs", ["job", "action", "target", "result", "started", "ended",
                                    "bytes", "error"],
                      [(r.job, r.action, r.target or "", r.result, _when(r.started_at),
                        _when(r.ended_at), r.bytes, (r.error or "")[:80])
                       for r in view.last_runs]))
    limits = [(job, what, in_force.describe())
              for job, by_what in view.limits.items() for what, in_force in by_what.items()]
    if limits:
        found.append(("bandwidth limits in force", ["job", "for", "limit"], limits))
    return found


def as_json(view: WatchView) -> dict[str, Any]:
    """The refresh as ``--json`` prints it: ``{"at", "transfers", "queues", "last_runs",
    "bandwidth_limits": {job: {what: {"limit", "window", "until"}}}}`` (datetimes become
    ISO 8601 in ``cli.common.emit_json``)."""
    return {
        "at": view.at,
        "transfers": [dataclasses.asdict(t) for t in view.transfers],
        "queues": [dataclasses.asdict(q) for q in view.queues],
        "last_runs": [dataclasses.asdict(r) for r in view.last_runs],
        "bandwidth_limits": {job: {what: in_force.as_dict() for what, in_force in
                                   by_what.items()} for job, by_what in view.limits.items()},
    }
