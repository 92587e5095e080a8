"""``zbak status [JOB...] [--json] [--offline] [--prom-textfile PATH]``: per job and target,
last success, lag, chain lengths, how far each copy lags, held bytes, running runs, transfers
in progress (bytes, expected bytes, rate, ETA, PID), next scheduled runs and the last drill per
source."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from zrepl_py.cli.common import (
    FilePath,
    FiniteFloat,
    Invocation,
    emit_json,
    emit_table,
    json_option,
    pass_invocation,
)
from zrepl_py.cli.summary import all_option, count_by, emit_long
from zrepl_py.errors import ExitStatus, UsageError, ZbakError

if TYPE_CHECKING:
    from zrepl_py.catalog.rows import FailoverRow
    from zrepl_py.status.report import ChainStatus, JobStatus


def _when(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def _size(value: int | None) -> str:
    from zrepl_py.observe.progress import format_size

    return "-" if value is None else format_size(value)


def _rate(value: float | None) -> str:
    from zrepl_py.observe.progress import format_rate

    return "-" if value is None else format_rate(value)


def _run_counts(runs: list[tuple[Any, ...]]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Per job, action and result: how many targets, the oldest and newest start."""
    starts: dict[tuple[Any, ...], list[str]] = {}
    for run in runs:
        starts.setdefault(run[:2] + (run[3],), []).append(run[4])
    return (["job", "action", "result", "targets", "oldest start", "newest start"],
            [(job, action, result, f"{count:,}", min(starts[(job, action, result)]),
              max(starts[(job, action, result)]))
             for (job, action, result), count, _ in count_by(
                runs, lambda r: (r[0], r[1], r[3]), {})])


def _chain_counts(chains: list[tuple[str, ChainStatus]]
                  ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Per job and store: datasets, streams of the current chains, chains, stored bytes,
    the oldest current full and the newest stream."""
    columns = ["job", "store", "datasets", "streams", "chains", "stored", "oldest full",
               "newest stream"]
    groups: dict[tuple[str, str], list[ChainStatus]] = {}
    for job, c in chains:
        groups.setdefault((job, c.store), []).append(c)
    return columns, [
        (job, store, f"{len(found):,}", f"{sum(c.length for c in found):,}",
         f"{sum(c.chains for c in found):,}", _size(sum(c.stored_bytes for c in found)),
         _when(min(c.full_time for c in found)), _when(max(c.newest_time for c in found)))
        for (job, store), found in sorted(groups.items())]


def _failed_over(row: FailoverRow | None) -> str:
    """A target's state: ``replica``, or when and how it was failed over."""
    if row is None:
        return "replica"
    return (f"FAILED OVER {_when(row.failed_over_at)} ({'planned' if row.planned else 'unplanned'}"
            "): zbak failback")


def _drill_rows(states: list[JobStatus]) -> list[tuple[Any, ...]]:
    """The last drill per job and source, with the last success's end."""
    rows = []
    for s in states:
        ok = {d.source: d for d in s.drill_successes}
        for d in s.drills:
            last = ok.get(d.source)
            rows.append((s.job, d.source, d.result, _when(d.ended_at), d.snapshot or "-",
                         "-" if d.seconds is None else f"{d.seconds:.1f} s", _size(d.bytes),
                         "-" if d.files is None else d.files,
                         _when(last.ended_at) if last else "never",
                         (d.detail or "")[:120]))
    return rows


def _copy_rows(states: list[JobStatus]) -> list[tuple[Any, ...]]:
    """How far each copy lags (``copying.lag``): the streams and bytes the store lacks, the
    age of the oldest (``LAGGING`` past its max lag) and the newest stream in each store."""
    rows = []
    for s in states:
        for c in s.copies:
            lag = "-" if not c.streams else (
                f"{_age(c.lag_seconds)} (since {_when(c.oldest_missing)})"
                + (" LAGGING" if c.lagging else ""))
            rows.append((s.job, c.store, c.source, f"{c.streams:,}", _size(c.bytes), lag,
                         _age(c.max_lag), f"{c.newest or '-'} ({_when(c.newest_time)})",
                         f"{c.target_newest or '-'} ({_when(c.target_newest_time)})"))
    return rows


def _age(seconds: float | None) -> str:
    from zrepl_py.observe.progress import format_span

    return "-" if seconds is None else format_span(seconds)


@click.command("status")
@click.argument("jobs", nargs=-1)
@json_option
@click.option("--offline", is_flag=True,
              help="Read the catalog only: do not ask the source hosts for held bytes.")
@click.option("--prom-textfile", type=FilePath(), default=None,
              help="Also write the Prometheus metrics to this .prom file (atomically).")
@click.option("--check", is_flag=True,
              help="Only judge health (catalog only): one status line; exit 0 OK, 1 WARNING,"
                   " 2 CRITICAL, 3 UNKNOWN (Nagios plugin codes).")
@click.option("--watch", is_flag=True,
              help="Refresh until Ctrl-C: running transfers (bytes, rate, ETA, limit), the"
                   " runs' queues, the last run per job and the bandwidth limits in force;"
                   " in place on a terminal, else one block (or JSON line) per refresh.")
@click.option("--interval", type=FiniteFloat(min=0.2, max=3600), default=1.0,
              show_default=True, help="Seconds between two refreshes of --watch.")
@all_option
@pass_invocation
def command(inv: Invocation, jobs: tuple[str, ...], as_json: bool, offline: bool,
            prom_textfile: Path | None, check: bool, watch: bool, interval: float,
            show_all: bool) -> int:
    """Show, per job and target: last success, lag (time and snapshots), archive chain
    lengths, how far each copy lags (streams and bytes a copy store lacks, the age of the
    oldest), bytes held by zbak's holds, runs in progress, each running transfer (what is
    sent, bytes done and expected, rate, ETA, start, PID), the next scheduled runs and the
    last restore drill of each store and replica (result, recovery time, last success).
    Past 100 datasets, runs and chains are counted per job, action and store (--all: each).

    With --check: exit 2 CRITICAL when a job's newest run of an action or hook failed, an
    action is stale past [alerts] stale_after, or the newest audit found problems; 1
    WARNING when a newest run ended partial or a copy lags past its max_lag; 3 UNKNOWN
    when the config or catalog cannot be read; else 0 OK."""
    if watch:
        if check or prom_textfile is not None:
            raise UsageError("--watch shows what runs now: run --check and --prom-textfile"
                             " without it")
        from zrepl_py.cli.watching import watch as watching

        with inv.context() as ctx:
            return watching(ctx, jobs, interval=interval, as_json=as_json)
    if check:
        if prom_textfile is not None:
            raise UsageError("--check reads the catalog only: run --prom-textfile without it")
        return _check(inv, jobs, as_json)
    from zrepl_py.status.report import job_statuses
    from zrepl_py.status.watch import eta_text, sent_text

    with inv.context() as ctx:
        states = job_statuses(ctx, jobs, offline=offline)
        if prom_textfile is not None:
            from zrepl_py.status.metrics import write_textfile

            try:
                write_textfile(ctx, prom_textfile, states=states)
            except OSError as exc:
                raise UsageError(f"cannot write --prom-textfile {prom_textfile}:"
                                 f" {exc.strerror or exc}") from None
    if as_json:
        emit_json([dataclasses.asdict(s) for s in states])
        return ExitStatus.OK
    emit_table("jobs", ["job", "source", "snapshots", "newest", "held", "next runs (UTC)"],
               [(s.job, s.source, s.snapshots, f"{s.newest or '-'} ({_when(s.newest_time)})",
                 s.held_error or _size(s.held_bytes),
                 ", ".join(f"{a} {_when(t)}" for a, t in s.next_runs.items())) for s in states])
    runs = [(s.job, r.action, r.target or "", r.result, _when(r.started_at), _when(r.ended_at),
             r.bytes, (r.error or "")[:120]) for s in states for r in s.last_runs]
    emit_long("last runs", ["job", "action", "target", "result", "started", "ended", "bytes",
                            "error"], runs, show_all=show_all, what="runs",
              summary=lambda: _run_counts(runs))
    targets = [(s.job, t.target, t.cursor or "never replicated", _age(t.lag_seconds),
                "-" if t.lag_snapshots is None else t.lag_snapshots, _when(t.last_success),
                t.last_result or "-", _failed_over(t.failed_over))
               for s in states for t in s.targets]
    if targets:
        emit_table("replication targets", ["job", "target", "cursor", "lag", "snapshots behind",
                                           "last success", "last result", "state"], targets)
    chains = [(s.job, c.dataset, c.store, c.length, c.chains, _size(c.stored_bytes),
               _when(c.full_time), f"{c.newest} ({_when(c.newest_time)})")
              for s in states for c in s.chains]
    if chains:
        emit_long("archive chains", ["job", "dataset", "store", "streams", "chains", "stored",
                                     "full written", "newest"], chains,
                  show_all=show_all, what="datasets",
                  summary=lambda: _chain_counts([(s.job, c) for s in states for c in s.chains]))
    copies = _copy_rows(states)
    if copies:
        emit_table("copies", ["job", "store", "from", "lacks", "bytes", "lag", "max lag",
                              "newest in from", "newest in store"], copies)
    drills = _drill_rows(states)
    if drills:
        emit_table("drills", ["job", "source", "result", "ended", "snapshot", "recovery time",
                              "bytes", "files", "last success", "why"], drills)
    running = [(s.job, r.action, r.target or "", _when(r.started_at), _age(r.seconds))
               for s in states for r in s.running]
    if running:
        emit_table("running", ["job", "action", "target", "started", "for"], running)
    transfers = [(s.job, t.kind, t.where, sent_text(t), _size(t.bytes),
                  _size(t.expected_bytes), _rate(t.rate), eta_text(t), _when(t.started_at),
                  t.pid) for s in states for t in s.transfers]
    if transfers:
        emit_table("transfers", ["job", "kind", "target/store", "sending", "done", "expected",
                                 "rate", "ETA", "started", "pid"], transfers)
    limits = [(s.job, what, in_force.describe()) for s in states
              for what, in_force in s.bandwidth_limits.items()]
    if limits:
        emit_table("bandwidth limits in force", ["job", "for", "limit"], limits)
    stale = [(s.job, g.transfer.kind if g.transfer else "-", g.transfer.where if g.transfer
              else "-", g.reason) for s in states for g in s.stale_transfers]
    if stale:
        emit_table("stale transfer files (removed)", ["job", "kind", "target/store", "why"],
                   stale)
    return ExitStatus.OK


def _check(inv: Invocation, jobs: tuple[str, ...], as_json: bool) -> int:
    """``--check``: the status line (or JSON) and the Nagios code (``status.check``)."""
    from zrepl_py.runtime.logsetup import printable
    from zrepl_py.status.check import as_dict, check, unknown

    try:
        with inv.context() as ctx:
            selected = [name for name, _ in ctx.select_jobs(jobs)]
            problems = check(ctx.catalog(), ctx.config, ctx.clock, selected)
    except Exception as exc:  # a check that cannot be made is UNKNOWN, not 1
        lines = exc.lines() if isinstance(exc, ZbakError) else [
            f"internal error: {type(exc).__name__}: {exc}"]
        report = unknown("; ".join(line.strip() for line in lines if line.strip()))
    else:
        report = as_dict(problems, len(selected))
    if as_json:
        emit_json(report)
    else:
        click.echo(printable(report["summary"]))
        for problem in report["problems"]:
            click.echo(printable(f"{problem['status']}: {problem['message']}"))
    return int(report["code"])
