"""``zbak holds list [JOB...]`` and ``zbak holds release-stale [JOB...] [--dry-run]``: zbak's
own holds on the jobs' source snapshots, and releasing the ones no owner needs any more
(``pruning.holds``;
docs/reliability.md#r23-interrupted-initial-replication-leaves-no-unbounded-holds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    from zrepl_py.config.jobs import JobConfig
    from zrepl_py.invocation.context import Context
    from zrepl_py.pruning.holds import HoldRow, Released
    from zrepl_py.zfs.client import Zfs


@click.group("holds")
def command() -> None:
    """zbak's holds (zbak:JOB:TARGET, zbak:JOB:archive:STORE) on the jobs' source snapshots."""


def _rows(ctx: Context, name: str, job: JobConfig) -> tuple[Zfs, list[HoldRow]]:
    from zrepl_py.checks.source import source_errors
    from zrepl_py.invocation.context import lock_key
    from zrepl_py.pruning.holds import classify, held_snapshots

    source = job.source
    catalog = ctx.catalog()
    with ctx.lock(lock_key(job), "holds"), source_errors(ctx, name, job):
        zfs = ctx.zfs(source.host, source.dataset.pool)
        held, guids = held_snapshots(zfs, job)
        rows = classify(name, held, source.host, ctx.config.jobs, catalog.cursors(),
                        catalog.streams(host=source.host), guids)
    return zfs, rows


@command.command("list")
@click.argument("jobs", nargs=-1)
@json_option
@pass_invocation
def list_holds(inv: Invocation, jobs: tuple[str, ...], as_json: bool) -> ExitStatus:
    """List the holds on each job's source snapshots: current (a replication or archive
    base: kept), stale (release-stale releases it), foreign (never touched). Where zfs cannot
    list hold tags (zfs-fuse) the tags zbak would use are shown as candidates."""
    with inv.context() as ctx:
        results, status = for_each_job(ctx.select_jobs(jobs),
                                       lambda n, j: (n, _rows(ctx, n, j)[1]))
    rows = [{"job": job, **row.__dict__} for job, found in results for row in found]
    if as_json:
        emit_json({"holds": rows})
    else:
        emit_table("holds", ["job", "snapshot", "tag", "status", "why"],
                   [(r["job"], r["snapshot"], r["tag"] + ("" if r["listed"] else " (candidate)"),
                     r["status"], r["reason"]) for r in rows])
    return status


@command.command("release-stale")
@click.argument("jobs", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Show what would be released; release nothing.")
@json_option
@pass_invocation
def release(inv: Invocation, jobs: tuple[str, ...], dry_run: bool, as_json: bool) -> ExitStatus:
    """Release each job's stale holds: those of a job, target or store no longer configured,
    and those not on the owner's current base. A current base is never released."""
    from zrepl_py.pruning.holds import release_stale

    def one(ctx: Context, name: str, job: JobConfig) -> tuple[str, list[Released]]:
        zfs, rows = _rows(ctx, name, job)
        return name, release_stale(zfs, rows, dry_run=dry_run)

    with inv.context() as ctx:
        results, status = for_each_job(ctx.select_jobs(jobs), lambda n, j: one(ctx, n, j))
    rows = [{"job": job, "snapshot": r.row.snapshot, "tag": r.row.tag, "reason": r.row.reason,
             "released": r.done, "error": r.error} for job, done in results for r in done]
    if as_json:
        emit_json({"dry_run": dry_run, "released": rows})
    else:
        title = "stale holds" + (" (dry run: nothing released)" if dry_run else " released")
        emit_table(title, ["job", "snapshot", "tag", "why", "result"],
                   [(r["job"], r["snapshot"], r["tag"], r["reason"],
                     r["error"] or ("released" if r["released"] else "would release"))
                    for r in rows])
    if status == ExitStatus.OK and any(r["error"] for r in rows):
        return ExitStatus.FAILED
    return status
