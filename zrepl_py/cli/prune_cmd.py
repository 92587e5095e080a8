"""``zbak prune [JOB...] [--dry-run]``: apply snapshot retention, showing why each is kept."""

from __future__ import annotations

import click

from zrepl_py.cli.common import Invocation, emit_json, emit_table, for_each_job, json_option, pass_invocation
from zrepl_py.errors import ExitStatus
from zrepl_py.pruning.job import prune_job


@click.command("prune")
@click.argument("jobs", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Show the plan; destroy nothing.")
@json_option
@pass_invocation
def command(inv: Invocation, jobs: tuple[str, ...], dry_run: bool, as_json: bool) -> ExitStatus:
    """Destroy zbak snapshots the retention no longer wants; never held, cloned,
    foreign, newest or replication-base snapshots."""
    with inv.context() as ctx:
        results, status = for_each_job(
            ctx.select_jobs(jobs), lambda n, j: prune_job(ctx, n, j, dry_run=dry_run)
        )
    rows = []
    for result in results:
        for plan in result.plans.values():
            for d in plan.decisions:
                rows.append({"job": result.job, "snapshot": d.candidate.name,
                             "action": "destroy" if d.destroy else "keep",
                             "reasons": list(d.reasons)})
    outcomes = {r.job: r.outcome for r in results if r.outcome is not None}
    if as_json:
        emit_json({"dry_run": dry_run, "decisions": rows,
                   "outcome": {job: o.__dict__ for job, o in outcomes.items()}})
    else:
        emit_table("prune plan" + (" (dry run: nothing destroyed)" if dry_run else ""),
                   ["job", "snapshot", "action", "why"],
                   [(r["job"], r["snapshot"], r["action"], "; ".join(r["reasons"])) for r in rows])
        for job, outcome in outcomes.items():
            click.echo(f"{job}: destroyed {len(outcome.destroyed)}, skipped {len(outcome.skipped)}, "
                       f"failed {len(outcome.failed)}")
            for name, why in outcome.skipped + outcome.failed:
                click.echo(f"  kept {name}: {why}")
    if any(o.failed for o in outcomes.values()) and status == ExitStatus.OK:
        return ExitStatus.FAILED
    return status
