"""``zbak failover JOB [--target HOST] [--planned] [--dry-run] [--json]``: make the job's
replica the live dataset (``failover.failover``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from zrepl_py.cli.common import Invocation, emit_json, emit_table, json_option, pass_invocation
from zrepl_py.errors import ExitStatus

if TYPE_CHECKING:
    from zrepl_py.failover.plan import FailoverPlan, Promotion


def _steps(step: Promotion) -> str:
    parts = [name for flag, name in ((step.set_mark, "mark failed over"),
                                     (step.hold, f"hold @{step.mark.base}"),
                                     (step.readonly_off, "readonly=off"),
                                     (step.mountpoint is not None, f"mountpoint={step.mountpoint}"),
                                     (step.canmount_on, "canmount=on"),
                                     (step.mount, "mount")) if flag]
    return ", ".join(parts) or "done"


def _show(plan: FailoverPlan, *, as_json: bool) -> None:
    mark = plan.mark
    title = (f"failover of job {plan.job} to {plan.target} "
             f"({'planned' if mark.planned else 'unplanned'}, "
             f"{mark.at:%Y-%m-%d %H:%M:%SZ})")
    if as_json:
        emit_json({"job": plan.job, "target": plan.target, "at": mark.at,
                   "planned": mark.planned, "problems": plan.problems, "notes": plan.notes,
                   "datasets": [{"dataset": p.dataset, "steps": _steps(p), "where": p.where,
                                 "base": p.mark.base} for p in plan.promotions]})
        return
    emit_table(title, ["replica", "steps", "then"],
               [(p.dataset, _steps(p), p.where) for p in plan.promotions])
    for note in plan.notes:
        click.echo(f"note: {note}")
    for problem in plan.problems:
        click.echo(f"problem: {problem}", err=True)


@click.command("failover")
@click.argument("job")
@click.option("--target", "target", metavar="HOST",
              help="The target to fail over to, when the job has several (its host, or the "
                   "target as written in targets).")
@click.option("--planned", is_flag=True,
              help="The source is reachable: make it read-only and send what the replica "
                   "lacks first, so nothing is lost.")
@click.option("--dry-run", is_flag=True, help="Print the plan only.")
@json_option
@pass_invocation
def command(inv: Invocation, job: str, target: str | None, planned: bool, dry_run: bool,
            as_json: bool) -> ExitStatus:
    """Make JOB's replica the live dataset: marked failed over (replication refuses to write
    to it from then on), its newest snapshot held as the way back, writable, mounted at
    failover_mountpoint or the source's recorded mountpoint. Works without the source; with
    --planned the source is made read-only and caught up first. zbak failback brings the
    source back."""
    from zrepl_py.failover.failover import failover_job

    with inv.context() as ctx:
        (name, config), = ctx.select_jobs([job])
        plan = failover_job(ctx, name, config, target_name=target, planned=planned,
                            dry_run=dry_run, show=lambda p: _show(p, as_json=as_json))
    if not dry_run and not as_json:
        root = next((p for p in plan.promotions if p.dataset == plan.replica_root), None)
        where = root.where if root is not None else ""
        click.echo(f"job {name} failed over to {plan.target}: {plan.replica_root} is live "
                   f"({where}). zbak replicate {name} refuses to write to it until zbak "
                   f"failback {name}")
    return ExitStatus.OK
