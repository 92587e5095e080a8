"""``zbak snapshot [JOB...]``: take each job's snapshot now."""

from __future__ import annotations

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


@click.command("snapshot")
@click.argument("jobs", nargs=-1)
@json_option
@pass_invocation
def command(inv: Invocation, jobs: tuple[str, ...], as_json: bool) -> ExitStatus:
    """Take a PREFIX_YYYYMMDDTHHMMSSZ snapshot of each job's datasets (all jobs by default);
    with min_change, datasets written less than that since the job's last snapshot are left
    as they are."""
    # imported here, as in every command module: `zbak --help` imports them all
    from zrepl_py.snapshots.job import snapshot_job

    with inv.context() as ctx:
        results, status = for_each_job(ctx.select_jobs(jobs), lambda n, j: snapshot_job(ctx, n, j))
    if as_json:
        emit_json([{"job": r.job, "source": r.source, "snapshot": r.taken.short,
                    "datasets": list(r.datasets), "atomic": r.taken.atomic,
                    "unchanged": [{"dataset": d, "reason": why} for d, why in r.unchanged],
                    "notes": list(r.notes)} for r in results])
    elif results:
        emit_table("snapshots taken", ["job", "snapshot", "datasets", "unchanged", "atomic"],
                   [(r.job, r.taken.short if r.datasets else "-", len(r.datasets),
                     len(r.unchanged), "yes" if r.taken.atomic else "no") for r in results])
    return status
