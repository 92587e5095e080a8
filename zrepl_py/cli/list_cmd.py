"""``zbak list snapshots|streams|datasets [JOB]``: catalog views and what each job selects,
as a table or ``--json``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from zrepl_py.cli.common import Invocation, emit_json, emit_table, json_option, pass_invocation
from zrepl_py.cli.summary import all_option, count_by, emit_long, names_or_count
from zrepl_py.errors import ExitStatus

if TYPE_CHECKING:
    from zrepl_py.catalog.rows import StreamRow


@click.group("list")
def command() -> None:
    """Show what the catalog knows, and which datasets each job selects."""


@command.command("snapshots")
@click.argument("jobs", nargs=-1)
@click.option("--all", "include_destroyed", is_flag=True, help="Include destroyed snapshots.")
@json_option
@pass_invocation
def snapshots(inv: Invocation, jobs: tuple[str, ...], include_destroyed: bool, as_json: bool) -> ExitStatus:
    """List the snapshots of each job's datasets, oldest first per dataset (createtxg order)."""
    with inv.context() as ctx:
        catalog = ctx.catalog()
        rows = []
        for name, job in ctx.select_jobs(jobs):
            source = job.source
            for snap in catalog.snapshots(host=source.host, below=str(source.dataset),
                                          include_destroyed=include_destroyed):
                rows.append((name, snap))
    if as_json:
        emit_json([{"job": job, **vars(s)} for job, s in rows])
        return ExitStatus.OK
    emit_table("snapshots", ["job", "snapshot", "guid", "createtxg", "created (UTC)", "state"],
               [(job, f"{s.dataset}@{s.name}", s.guid, s.createtxg,
                 s.creation.strftime("%Y-%m-%d %H:%M:%S"),
                 "destroyed" if s.destroyed_at else "live") for job, s in rows])
    return ExitStatus.OK


@command.command("streams")
@click.argument("jobs", nargs=-1)
@all_option
@json_option
@pass_invocation
def streams(inv: Invocation, jobs: tuple[str, ...], show_all: bool, as_json: bool) -> ExitStatus:
    """List archived streams of each job's datasets, chain by chain. More than 100 streams
    are counted per store, kind and state on a terminal (--all: every stream)."""
    from zrepl_py.snapshots.selection import covers  # loaded when run

    with inv.context() as ctx:
        catalog = ctx.catalog()
        rows: list[tuple[str, StreamRow]] = []
        for name, job in ctx.select_jobs(jobs):
            source = job.source
            covered = covers(job)
            rows.extend((name, s) for s in catalog.bulk_streams(
                host=source.host, below=str(source.dataset)) if covered(s.dataset))
    if as_json:
        emit_json({"job": job, **vars(s)} for job, s in rows)
        return ExitStatus.OK
    emit_long("streams", ["job", "dataset", "store", "id", "kind", "parent", "from", "to",
                          "stored bytes", "class", "state"],
              [(job, s.dataset, s.store, s.id, s.kind, s.parent_id or "-", s.from_name or "-",
                s.to_name, s.stored_bytes, s.storage_class, s.state) for job, s in rows],
              show_all=show_all, what="streams", summary=lambda: _stream_counts(rows))
    return ExitStatus.OK


def _stream_counts(rows: list[tuple[str, StreamRow]]
                   ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Per job, store, kind and state: the streams, the datasets and the stored bytes."""
    from zrepl_py.observe.progress import format_size

    stored: dict[tuple[str, str, str, str], int] = {}
    for job, s in rows:
        key = (job, s.store, s.kind, s.state)
        stored[key] = stored.get(key, 0) + s.stored_bytes
    return (["job", "store", "kind", "state", "streams", "stored", "datasets"],
            [(job, store, kind, state, f"{count:,}", format_size(stored[(job, store, kind, state)]),
              names_or_count(seen["datasets"]))
             for (job, store, kind, state), count, seen in count_by(
                rows, lambda r: (r[0], r[1].store, r[1].kind, r[1].state),
                {"datasets": lambda r: r[1].dataset})])


@command.command("datasets")
@click.argument("jobs", nargs=-1)
@json_option
@pass_invocation
def datasets(inv: Invocation, jobs: tuple[str, ...], as_json: bool) -> ExitStatus:
    """List each job's source tree as ZFS shows it now: every dataset the job selects, and
    every one it leaves out with the reason (exclude, select property, a replica)."""
    # imported here: `zbak list snapshots` and `zbak --help` need neither
    from zrepl_py.config.schema import replica_datasets
    from zrepl_py.snapshots.inventory import list_selection

    with inv.context() as ctx:
        rows = []
        for name, job in ctx.select_jobs(jobs):
            source = job.source
            zfs = ctx.zfs(source.host, source.dataset.pool)
            _, selection, _ = list_selection(zfs, job, replica_datasets(ctx.config, source.host))
            rows += [(name, source.host, str(d), True, "") for d in selection.selected]
            rows += [(name, source.host, str(d), False, why) for d, why in selection.skipped]
    rows.sort(key=lambda r: (r[0], r[2].split("/")))
    if as_json:
        emit_json([{"job": job, "host": host, "dataset": dataset, "selected": chosen,
                    "reason": why or None} for job, host, dataset, chosen, why in rows])
        return ExitStatus.OK
    emit_table("datasets", ["job", "host", "dataset", "selected", "why not"],
               [(job, host, dataset, "yes" if chosen else "no", why)
                for job, host, dataset, chosen, why in rows])
    return ExitStatus.OK
