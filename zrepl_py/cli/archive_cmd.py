"""``zbak archive [JOB...] [--full] [--dry-run]``: write the next stream(s) of each chain."""

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

if TYPE_CHECKING:
    from zrepl_py.archive.job import ArchiveResult


def _rows(result: ArchiveResult) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for d in result.datasets:
        written = {id(p): w for p, w in d.written}
        if not d.plan.streams:
            rows.append({"job": result.job, "store": result.store, "dataset": d.dataset,
                         "stream": "", "reason": d.plan.note, "bytes": 0, "volumes": "",
                         "error": d.error})
        for planned in d.plan.streams:
            w = written.get(id(planned))
            base = planned.from_snap  # set for every incremental (archive.planner)
            what = (f"full @{planned.to_snap.name}" if planned.kind == "full" or base is None
                    else f"incremental -I @{base.name} -> @{planned.to_snap.name}")
            volumes = ""
            if w is not None:
                volumes = ("adopted" if w.adopted else
                           f"{w.volumes_written} written" + (f", {w.volumes_skipped} resumed"
                                                             if w.volumes_skipped else ""))
            rows.append({"job": result.job, "store": result.store, "dataset": d.dataset,
                         "stream": what, "reason": planned.reason,
                         "bytes": w.stored_bytes if w else 0, "raw_bytes": w.raw_bytes if w else 0,
                         "volumes": volumes, "error": None if w else d.error})
    return rows


@click.command("archive")
@click.argument("jobs", nargs=-1)
@click.option("--full", "force_full", is_flag=True, help="Start a new chain with a full stream.")
@click.option("--dry-run", is_flag=True, help="Show the streams each chain needs; write nothing.")
@json_option
@pass_invocation
def command(inv: Invocation, jobs: tuple[str, ...], force_full: bool, dry_run: bool,
            as_json: bool) -> ExitStatus:
    """Write the next zstd-compressed send stream(s) of each job's chain to its store:
    a full when the chain policy (full_every, max_chain_length, max_chain_bytes) or --full
    asks, else an incremental (zfs send -I) from the chain's last snapshot."""
    from zrepl_py.archive.job import archive_job  # boto3 only when archiving

    with inv.context() as ctx:
        archived = [(n, j) for n, j in ctx.select_jobs(jobs) if j.archive is not None or jobs]
        results, status = for_each_job(
            archived, lambda n, j: archive_job(ctx, n, j, force_full=force_full, dry_run=dry_run))
    rows = [row for r in results for row in _rows(r)]
    if as_json:
        emit_json({"dry_run": dry_run, "rows": rows})
    else:
        emit_table("archive" + (" (dry run: nothing written)" if dry_run else ""),
                   ["job", "store", "dataset", "stream", "why", "stored bytes", "volumes", "problem"],
                   [(r["job"], r["store"], r["dataset"], r["stream"], r["reason"], r["bytes"],
                     r["volumes"], r["error"]) for r in rows])
    if status == ExitStatus.OK and any(r.failed for r in results):
        return ExitStatus.FAILED
    return status
