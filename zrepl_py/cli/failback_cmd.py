"""``zbak failback JOB [--target HOST] [--full] [--dry-run] [--yes] [--json]``: bring the
source back from the live replica without a full resend (``failover.failback``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from zrepl_py.cli.common import Invocation, emit_json, emit_table, json_option, pass_invocation
from zrepl_py.errors import ExitStatus

if TYPE_CHECKING:
    from zrepl_py.failover.plan import FailbackPlan


def _show(plan: FailbackPlan, *, as_json: bool) -> None:
    from zrepl_py.failover.failback import describe

    rows = describe(plan)
    if as_json:
        emit_json({"job": plan.job, "target": plan.target, "source": plan.source_root,
                   "kept": plan.kept_root, "needs_full": plan.needs_full,
                   "blockers": plan.blockers, "finishing": plan.finishing,
                   "versions": plan.versions,
                   "steps": [dict(zip(("replica", "source", "what", "why"), r, strict=True))
                             for r in rows]})
        return
    when = f", failed over {plan.mark.at:%Y-%m-%d %H:%M:%SZ}" if plan.mark else ""
    emit_table(f"failback of job {plan.job} from {plan.target}{when}",
               ["replica", "source", "what", "why"], rows)
    if plan.versions:
        click.echo(plan.versions)
    if not plan.finishing:
        click.echo("first: each replica dataset read-only and unmounted, then a last snapshot "
                   "of it; last: the replica released (a replica again), the source live")
    for blocker in plan.blockers:
        click.echo(f"blocker: {blocker}", err=True)


@click.command("failback")
@click.argument("job")
@click.option("--target", "target", metavar="HOST",
              help="The target that was failed over to, when the job has several.")
@click.option("--full", is_flag=True,
              help="Send a dataset whole where the source has no snapshot in common with the "
                   "replica (an empty or replaced pool).")
@click.option("--dry-run", is_flag=True, help="Print the plan only.")
@click.option("--yes", is_flag=True, help="Do not ask before failing back.")
@json_option
@pass_invocation
def command(inv: Invocation, job: str, target: str | None, full: bool, dry_run: bool,
            yes: bool, as_json: bool) -> ExitStatus:
    """Bring JOB's source back from its failed-over replica: from the newest common snapshot
    (by guid), what the source wrote after it is kept aside (renamed and cloned back, named
    in the plan; nothing is destroyed), the source receives the replica's later snapshots
    (-I), then the replica is read-only and a replica again and the source is live. The plan
    is shown first and needs --yes (or a terminal to confirm on)."""
    from zrepl_py.failover.failback import failback_job

    declined: list[ExitStatus] = []

    def confirm(plan: FailbackPlan) -> bool:
        _show(plan, as_json=as_json)
        if dry_run or plan.blockers or yes:
            return True
        if not sys.stdin.isatty():
            click.echo("zbak: pass --yes to fail back without a terminal to confirm on",
                       err=True)
            declined.append(ExitStatus.USAGE)
            return False
        if not click.confirm("Fail back now?"):
            declined.append(ExitStatus.FAILED)
            return False
        return True

    with inv.context() as ctx:
        (name, config), = ctx.select_jobs([job])
        result = failback_job(ctx, name, config, target_name=target, full=full,
                              dry_run=dry_run, confirm=confirm)
    if result is None:
        return declined[0] if declined else ExitStatus.OK
    if not as_json:
        plan = result.plan
        kept = f"; the source as it was is kept as {plan.kept_root}" if plan.kept_root else ""
        click.echo(f"job {name} failed back from {plan.target}: {result.bytes} bytes sent"
                   f"{kept}. {plan.source_root} is live, {plan.replica_root} a read-only "
                   f"replica again: zbak replicate {name} sends what comes next")
    return ExitStatus.OK
