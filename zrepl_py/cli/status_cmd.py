"""``zbak status [--json]``: per job, snapshots, last runs, target lag and next runs."""

from __future__ import annotations

import dataclasses

import click

from zrepl_py.cli.common import Invocation, emit_json, emit_table, json_option, pass_invocation
from zrepl_py.errors import ExitStatus
from zrepl_py.status import job_status


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


@click.command("status")
@json_option
@pass_invocation
def command(inv: Invocation, as_json: bool) -> ExitStatus:
    """Show each job's snapshots, last run per action, replica lag and next runs."""
    with inv.context() as ctx:
        catalog, now = ctx.catalog(), ctx.clock.now()
        states = [job_status(catalog, n, j, now) for n, j in ctx.select_jobs(())]
    if as_json:
        emit_json([dataclasses.asdict(s) for s in states])
        return ExitStatus.OK
    emit_table("jobs", ["job", "source", "snapshots", "newest", "next runs (UTC)"],
               [(s.job, s.source, s.snapshots, f"{s.newest or '-'} ({_when(s.newest_time)})",
                 ", ".join(f"{a} {_when(t)}" for a, t in s.next_runs.items())) for s in states])
    runs = [(s.job, r.action, r.target or "", r.result, _when(r.started_at), _when(r.ended_at),
             r.bytes, (r.error or "")[:120]) for s in states for r in s.last_runs]
    emit_table("last runs", ["job", "action", "target", "result", "started", "ended", "bytes", "error"], runs)
    targets = [(s.job, t.target, t.cursor or "never replicated",
                "-" if t.lag_seconds is None else f"{t.lag_seconds / 3600:.1f} h",
                "-" if t.lag_snapshots is None else t.lag_snapshots)
               for s in states for t in s.targets]
    if targets:
        emit_table("replication targets", ["job", "target", "cursor", "lag", "snapshots behind"], targets)
    return ExitStatus.OK
