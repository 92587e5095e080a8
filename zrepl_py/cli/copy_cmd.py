"""``zbak copy [JOB...] [--to STORE] [--from STORE] [--dry-run] [--json]``: copy every
stream the target store lacks (docs/copies.md)."""

from __future__ import annotations

from pathlib import Path

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


@click.command("copy")
@click.argument("jobs", nargs=-1)
@click.option("--from", "source", metavar="STORE",
              help="The store to copy from (default: the job's archive store).")
@click.option("--to", "target", metavar="STORE",
              help="The store to copy to (default: every [jobs.NAME.copy.STORE]).")
@click.option("--dry-run", is_flag=True, help="Show the streams the target lacks; copy nothing.")
@identity_option("Re-encoding for a store of another codec chain: the")
@json_option
@pass_invocation
def command(inv: Invocation, jobs: tuple[str, ...], source: str | None, target: str | None,
            dry_run: bool, identity: Path | None, as_json: bool) -> ExitStatus:
    """Copy each job's streams that store --to (default: each store of the job's
    [jobs.NAME.copy.STORE] tables) lacks from store --from (default: the copy's from, else
    the job's archive store), oldest first, volume by volume: each volume is checked on arrival (SHA-256 and size against the catalog)
    before the catalog records the copy. A copy interrupted at any point resumes on the next
    run; a stream marked bad is never copied. Into a store of another codec chain (sealed
    and plain, other age recipients) each volume is re-encoded; a sealed source then needs
    --identity."""
    from zrepl_py.copying.job import copy_job, copy_rows, known_stores  # boto3 when copying

    with inv.context() as ctx:
        ctx.identity = identity
        known_stores(ctx, source, target)  # even when no job has a copy to make
        chosen = [(n, j) for n, j in ctx.select_jobs(jobs)
                  if jobs or j.copies or (target is not None and j.archive is not None)]
        done, status = for_each_job(chosen, lambda n, j: copy_job(
            ctx, n, j, source=source, target=target, dry_run=dry_run))
    results = [r for each in done for r in each]
    rows = copy_rows(results)
    if as_json:
        emit_json({"dry_run": dry_run, "rows": rows})
    else:
        emit_table("copy" + (" (dry run: nothing copied)" if dry_run else ""),
                   ["job", "from", "to", "dataset", "stream", "result", "codec",
                    "stored bytes", "volumes", "problem"],
                   [(r["job"], r["from"], r["to"], r["dataset"], r["stream"], r["result"],
                     r["codec"], r["bytes"], r["volumes"], r["problem"]) for r in rows])
    if status == ExitStatus.OK and any(r.failed for r in results):
        return ExitStatus.FAILED
    return status
