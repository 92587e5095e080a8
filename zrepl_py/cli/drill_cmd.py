"""``zbak drill [JOB...] [--from SOURCE] [--json]``: restore each source's newest snapshot into
scratch, check it against the source, record the recovery time (``zrepl_py.drill``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from zrepl_py.cli.common import (
    Invocation,
    emit_json,
    emit_table,
    for_each_job,
    identity_option,
    json_option,
    pass_invocation,
)
from zrepl_py.errors import ExitStatus

if TYPE_CHECKING:
    from zrepl_py.drill.job import DrillResult


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _rows(result: DrillResult) -> list[dict[str, Any]]:
    rows = []
    for source in result.sources:
        row = dataclasses.asdict(source.row)
        del row["id"]
        row["datasets_restored"] = [dataclasses.asdict(i) for i in source.items]
        row["swept"] = list(source.swept.destroyed)
        row["left"] = list(source.swept.left)
        rows.append(row)
    return rows


@click.command("drill")
@click.argument("jobs", nargs=-1)
@click.option("--from", "from_", metavar="SOURCE",
              help="Drill only this source: a store, a replica target (HOST:POOL/PATH) or"
                   " the replicas on a host.")
@identity_option()
@json_option
@pass_invocation
def command(inv: Invocation, jobs: tuple[str, ...], from_: str | None, identity: Path | None,
            as_json: bool) -> ExitStatus:
    """Restore the newest restorable snapshot of each store and replica of each job (all
    jobs by default) into a scratch dataset, check its guid and every file against the
    source snapshot, destroy the scratch and record when, the result, the recovery time
    and the bytes. Exit 1 when a drill failed (alerted), 75 while a cold store's thaw is
    pending ([jobs.NAME.drill] thaw = true), else 0."""
    from zrepl_py.drill.job import drill_job

    with inv.context() as ctx:
        ctx.identity = identity
        results, status = for_each_job(ctx.select_jobs(jobs),
                                       lambda n, j: drill_job(ctx, n, j, from_=from_))
    rows = [row for r in results for row in _rows(r)]
    if as_json:
        emit_json({"drills": rows})
    else:
        emit_table("drill", ["job", "source", "result", "snapshot", "recovery time", "bytes",
                             "files compared", "thaw", "why"],
                   [(r["job"], r["source"], r["result"], r["snapshot"], _seconds(r["seconds"]),
                     r["bytes"], r["files"], r["thaw"], r["detail"]) for r in rows])
        for r in rows:
            for name in r["swept"]:
                click.echo(f"destroyed {name}: the scratch of a drill that was killed")
            for what in r["left"]:
                click.echo(f"left {what}")
    if status != ExitStatus.OK:
        return status
    if any(r.failed for r in results):
        return ExitStatus.FAILED
    if any(r.pending for r in results):
        return ExitStatus.THAW_PENDING
    return ExitStatus.OK
