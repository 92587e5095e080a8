"""``zbak replicate [JOB...] [--dry-run]``: bring every replica target up to date."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from zrepl_py.cli.common import (
    Invocation,
    emit_json,
    emit_table,
    for_each_job,
    json_option,
    pass_invocation,
)
from zrepl_py.errors import ExitStatus
from zrepl_py.runtime.logsetup import printable

if TYPE_CHECKING:
    from zrepl_py.replication.job import ReplicateResult
    from zrepl_py.zfs.steps import SnapRef, Step


def _step_text(step: Step) -> str:
    from zrepl_py.zfs.steps import Incremental

    kind = type(step).__name__.lower()
    if isinstance(step, Incremental):
        flag = "-I" if step.intermediates else "-i"
        return f"{kind} {flag} {step.base.name} -> {step.to.name}"
    to: SnapRef | None = getattr(step, "to", None)  # every step but AbortResume has one
    return f"{kind} {to.name}" if to is not None else kind


def _rows(result: ReplicateResult) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for target in result.targets:
        if target.method == "rsync":
            rows.append({"job": result.job, "target": target.target, "dataset": "(rsync)",
                         "plan": ", ".join(target.snapshots_synced) or "up to date",
                         "bytes": target.bytes, "error": target.error, "warnings": target.warnings})
        for d in target.datasets:
            plan = d.plan
            text = ("diverged: " + (plan.diverged or d.diverged) if d.diverged else
                    "up to date" if plan.up_to_date else
                    "; ".join(_step_text(s) for s in plan.steps) or plan.note
                    or "nothing to send")
            rows.append({"job": result.job, "target": target.target, "dataset": d.source,
                         "plan": text, "bytes": d.bytes, "reached": d.reached, "error": None,
                         "warnings": []})
        if target.error or target.warnings:
            rows.append({"job": result.job, "target": target.target, "dataset": "",
                         "plan": "FAILED" if target.error else "warning", "bytes": target.bytes,
                         "error": target.error, "warnings": target.warnings})
    return rows


@click.command("replicate")
@click.argument("jobs", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Show the plan per target and dataset; send nothing.")
@json_option
@pass_invocation
def command(inv: Invocation, jobs: tuple[str, ...], dry_run: bool, as_json: bool) -> ExitStatus:
    """Send new snapshots to every target: incremental from the newest common snapshot
    (by guid), resumable where both sides support it; never `zfs receive -F`."""
    # imported here: `zbak --help` imports every command module
    from zrepl_py.replication.job import replicate_job

    with inv.context() as ctx:
        results, status = for_each_job(ctx.select_jobs(jobs),
                                       lambda n, j: replicate_job(ctx, n, j, dry_run=dry_run))
    rows = [row for r in results for row in _rows(r)]
    limits = {r.job: r.limit for r in results if r.limit is not None}
    if as_json:
        emit_json({"dry_run": dry_run, "rows": rows,
                   "bandwidth_limits": {job: found.as_dict() for job, found in limits.items()}})
    else:
        emit_table("replication" + (" (dry run: nothing sent)" if dry_run else ""),
                   ["job", "target", "dataset", "plan", "bytes", "problem"],
                   [(r["job"], r["target"], r["dataset"], r["plan"], r["bytes"],
                     r["error"] or "; ".join(r["warnings"])) for r in rows])
        for job, found in limits.items():
            click.echo(printable(f"bandwidth limit of job {job}: {found.describe()}"))
    if status == ExitStatus.OK and any(r.failed for r in results):
        return ExitStatus.FAILED
    return status
