"""``zbak prune [JOB...] [--dry-run] [--accept-early-delete-fee]``: apply retention to source
snapshots, replica snapshots and archive chains, showing why each thing is kept."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import click

from zrepl_py.cli.common import Invocation, emit_json, for_each_job, json_option, pass_invocation
from zrepl_py.cli.summary import LIMIT, all_option, count_by, emit_long, names_or_count, reason_kind
from zrepl_py.errors import ExitStatus

if TYPE_CHECKING:
    from zrepl_py.catalog.rows import StreamRow
    from zrepl_py.pruning.archive import ArchivePruneResult, DatasetChains
    from zrepl_py.pruning.job import PruneResult
    from zrepl_py.pruning.source import PruneOutcome


def _stream_label(s: StreamRow) -> str:
    if s.kind == "full":
        return f"full @{s.to_name}"
    return f"incremental @{s.from_name} -> @{s.to_name}"


def _recheck_text(d: DatasetChains, full_id: int) -> str:
    """What happens or happened to the releasing chain ``full_id`` of dataset result ``d``:
    ``will re-check N objects ...`` on a dry run, the re-check's result after a real one."""
    releasers = d.plan.releasers if d.plan is not None else ()
    name = next((f"@{c[0].to_name} " for c in releasers if c[0].id == full_id), "")
    if d.outcome is None:
        return (f"will re-check {d.recheck_planned.get(full_id, 0)} objects of the releasing"
                f" chain {name}(stream {full_id}) before deleting")
    for check in d.outcome.rechecks:
        if check.full == full_id:
            return f"re-check of the releasing chain {name}(stream {full_id}): {check.summary()}"
    return f"re-check of the releasing chain {name}(stream {full_id}): not run"


def _stream_rows(result: PruneResult) -> Iterator[dict[str, Any]]:
    """One row per archived stream: kept (with reasons), deleted, or finished; a deleted
    one names the chain that releases it and its re-check (planned or done)."""
    for archive in result.stores:
        yield from _store_rows(result.job, archive)


def _store_rows(job: str, archive: ArchivePruneResult) -> Iterator[dict[str, Any]]:
    """``_stream_rows`` of one store."""
    for d in archive.datasets:
        base = {"job": job, "store": archive.store, "dataset": d.dataset}
        if d.plan is None:
            yield {**base, "stream_id": None, "stream": "", "state": "", "action": "error",
                   "reasons": [d.error or ""]}
            continue
        for s in d.plan.unfinished:
            yield {**base, "stream_id": s.id, "stream": _stream_label(s), "state": s.state,
                   "storage_class": s.storage_class, "action": "finish delete",
                   "reasons": ["condemned by an earlier prune that did not finish"]}
        releaser = {dec.stream.id: c.released_by[0].id for c in d.plan.to_delete
                    for dec in c.streams}
        marked_bad = {i for c in d.outcome.rechecks for i in c.bad_streams} if d.outcome else set()
        deleted = set(d.outcome.deleted) if d.outcome is not None else set()
        kept = d.outcome.kept if d.outcome is not None else {}  # a copy relied on was gone
        texts: dict[int, str] = {}  # one re-check text per releasing chain, not per stream
        chained = [(c.full.id, dec) for c in d.plan.chains for dec in c.streams]
        for chain, decision in chained + [(None, dec) for dec in d.plan.orphans]:
            s = decision.stream
            by = releaser.get(s.id)
            action = "delete" if decision.delete else "keep"
            reasons = list(decision.reasons)
            if s.id in kept:
                action, reasons = "keep", [*reasons, kept[s.id]]
            elif decision.delete and d.outcome is not None and s.id not in deleted:
                action = "delete stopped"  # the plan's delete did not happen (see the error)
            if by is not None and by not in texts:
                texts[by] = _recheck_text(d, by)
            yield {**base, "stream_id": s.id, "chain": chain, "stream": _stream_label(s),
                   "state": "bad" if s.id in marked_bad else s.state,
                   "storage_class": s.storage_class, "action": action,
                   "reasons": reasons, "released_by": by,
                   "recheck": texts.get(by) if by is not None else None}


def _version_rows(result: PruneResult) -> list[dict[str, Any]]:
    """One row per version of a catalogued key the catalog does not know, in each store
    that keeps versions (``pruning.unknown_versions``): kept until its lock lapses, or
    deleted (``delete`` on a dry run, ``deleted`` once done)."""
    rows: list[dict[str, Any]] = []
    for store in result.stores:
        if store.versions is None:
            continue
        done = set(store.versions.deleted)
        for d in store.versions.decisions:
            s = d.stray
            action = "keep" if not d.delete else (
                "deleted" if (s.key, s.version_id) in done else "delete")
            rows.append({"job": result.job, "store": store.store, "key": s.key,
                         "version_id": s.version_id, "delete_marker": s.marker,
                         "stream_id": s.stream_id, "written": s.written.isoformat(),
                         "retain_until": s.retain_until.isoformat() if s.retain_until else None,
                         "action": action, "reasons": [d.reason]})
    return rows


def _replica_rows(result: PruneResult) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for r in result.replicas:
        if r.error:
            rows.append({"job": result.job, "target": r.target, "snapshot": "", "action": "error",
                         "reasons": [r.error]})
        for plan in r.plans.values():
            for d in plan.decisions:
                rows.append({"job": result.job, "target": r.target, "snapshot": d.candidate.name,
                             "action": "destroy" if d.destroy else "keep",
                             "reasons": list(d.reasons)})
    return rows


@click.command("prune")
@click.argument("jobs", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Show the plan; destroy and delete nothing.")
@click.option("--accept-early-delete-fee", is_flag=True,
              help="Delete archive chains even when a stream is younger than its storage"
                   " class's minimum duration (S3 bills the rest of the minimum).")
@all_option
@json_option
@pass_invocation
def command(inv: Invocation, jobs: tuple[str, ...], dry_run: bool, accept_early_delete_fee: bool,
            show_all: bool, as_json: bool) -> ExitStatus:
    """Destroy zbak snapshots the retention no longer wants on the source and on ZFS
    replica targets (never held, cloned, foreign, newest, replication-base or archive-base
    snapshots), and delete whole archive chains the archive retention no longer wants
    (only once a newer full is verified within reverify_after, and after that newer chain
    is re-checked against the catalog right before; never a damaged chain). Plans of more
    than 100 snapshots or streams are shown as counts per action and reason (--all: every
    row)."""
    from zrepl_py.pruning.job import prune_job  # command modules load lazily

    with inv.context() as ctx:
        results, status = for_each_job(
            ctx.select_jobs(jobs),
            lambda n, j: prune_job(ctx, n, j, dry_run=dry_run,
                                   accept_early_delete_fee=accept_early_delete_fee))
    rows: list[dict[str, Any]] = []
    for result in results:
        for plan in result.plans.values():
            for d in plan.decisions:
                rows.append({"job": result.job, "snapshot": d.candidate.name,
                             "action": "destroy" if d.destroy else "keep",
                             "reasons": list(d.reasons)})
    # A generator for --json (written row by row), a list for the tables.
    streams = (row for r in results for row in _stream_rows(r))
    replica = [row for r in results for row in _replica_rows(r)]
    versions = [row for r in results for row in _version_rows(r)]
    outcomes = {r.job: r.outcome for r in results if r.outcome is not None}
    if as_json:
        emit_json({
            "dry_run": dry_run, "decisions": rows,
            "outcome": {job: o.__dict__ for job, o in outcomes.items()},
            "replica": replica,
            "replica_outcome": {r.job: {t.target: t.outcome.__dict__ for t in r.replicas
                                        if t.outcome is not None} for r in results},
            "streams": streams,
            "versions": versions,
            "archive": {r.job: _archive_summary(r.archive) for r in results if r.archive},
            "stores": {r.job: {s.store: _archive_summary(s) for s in r.stores}
                       for r in results if r.stores},
        })
    else:
        _print_tables(rows, replica, list(streams), outcomes, results, dry_run, show_all)
        _print_versions(versions, dry_run, show_all)
    _report_errors(results)
    if status == ExitStatus.OK and any(r.failed for r in results):
        return ExitStatus.FAILED
    return status


def _archive_summary(archive: ArchivePruneResult) -> dict[str, Any]:
    return {
        "store": archive.store, "error": archive.error,
        "datasets": {d.dataset: {
            "damaged": d.damaged, "error": d.error,
            "deleted": d.outcome.deleted if d.outcome else [],
            "finished": d.outcome.finished if d.outcome else [],
            "kept": d.outcome.kept if d.outcome else {},
            "object_deletes": d.outcome.objects if d.outcome else 0,
            "stopped": d.outcome.error if d.outcome else None,
            "rechecks": _rechecks(d),
        } for d in archive.datasets},
    }


def _rechecks(d: DatasetChains) -> list[dict[str, Any]]:
    """Per releasing chain: the objects planned, and after a real run the result."""
    done = {c.full: c for c in d.outcome.rechecks} if d.outcome else {}
    found = []
    for full_id, planned in d.recheck_planned.items():
        entry = {"stream_id": full_id, "objects": planned, "result": "planned"}
        check = done.get(full_id)
        if check is not None:
            entry.update(objects=check.objects, reread=check.reread,
                         result="ok" if check.ok else "mismatch", summary=check.summary(),
                         bad_streams=check.bad_streams,
                         mismatches=[{"stream_id": m.stream_id, "key": m.key,
                                      "problem": m.problem} for m in check.mismatches])
        elif d.outcome is not None:
            entry["result"] = "not run"
        found.append(entry)
    return found


def _why(row: dict[str, Any]) -> tuple[str, ...]:
    """The kinds of a plan row's reasons (its re-check line last), for the summary."""
    kinds = tuple(map(reason_kind, row["reasons"]))
    return kinds + (reason_kind(row["recheck"]),) if row.get("recheck") else kinds


def _dataset_of(snapshot: str) -> str:
    return snapshot.partition("@")[0]


def _print_tables(rows: list[dict[str, Any]], replica: list[dict[str, Any]], streams: list[dict[str, Any]],
                  outcomes: dict[str, PruneOutcome], results: Sequence[PruneResult],
                  dry_run: bool, show_all: bool) -> None:
    note = " (dry run: nothing destroyed)" if dry_run else ""
    emit_long("prune plan" + note, ["job", "snapshot", "action", "why"],
              [(r["job"], r["snapshot"], r["action"], "; ".join(r["reasons"])) for r in rows],
              show_all=show_all, what="snapshots", summary=lambda: (
                  ["job", "action", "why", "snapshots", "datasets"],
                  [(job, action, "; ".join(why), count, names_or_count(seen["datasets"]))
                   for (job, action, why), count, seen in count_by(
                      rows, lambda r: (r["job"], r["action"], _why(r)),
                      {"datasets": lambda r: _dataset_of(r["snapshot"])})]))
    if replica:
        emit_long("replica prune plan" + note, ["job", "target", "snapshot", "action", "why"],
                  [(r["job"], r["target"], r["snapshot"], r["action"], "; ".join(r["reasons"]))
                   for r in replica],
                  show_all=show_all, what="snapshots", summary=lambda: (
                      ["job", "target", "action", "why", "snapshots", "datasets"],
                      [(job, target, action, "; ".join(why), count,
                        names_or_count(seen["datasets"]))
                       for (job, target, action, why), count, seen in count_by(
                          replica, lambda r: (r["job"], r["target"], r["action"], _why(r)),
                          {"datasets": lambda r: _dataset_of(r["snapshot"])})]))
    if streams:
        emit_long("archive chains" + (" (dry run: nothing deleted)" if dry_run else ""),
                  ["job", "store", "dataset", "stream", "state", "action", "why"],
                  [(r["job"], r["store"], r["dataset"], r["stream"], r["state"], r["action"],
                    "; ".join(r["reasons"] + ([r["recheck"]] if r.get("recheck") else [])))
                   for r in streams],
                  show_all=show_all, what="streams", summary=lambda: (
                      ["job", "store", "action", "why", "streams", "chains", "datasets"],
                      [(job, store, action, "; ".join(why), count, len(seen["chains"]),
                        names_or_count(seen["datasets"]))
                       for (job, store, action, why), count, seen in count_by(
                          streams, lambda r: (r["job"], r["store"], r["action"], _why(r)),
                          {"datasets": lambda r: r["dataset"],
                           "chains": lambda r: (r["dataset"], r["chain"])})]))
    for job, outcome in outcomes.items():
        _print_outcome(job, outcome)
    for result in results:
        for target in result.replicas:
            if target.outcome is not None:
                _print_outcome(f"{result.job} -> {target.target}", target.outcome)
        for store in result.stores:
            _print_archive_lines(result.job, store, show_all)


def _print_versions(versions: list[dict[str, Any]], dry_run: bool, show_all: bool) -> None:
    """The table of :func:`_version_rows` (none: no table)."""
    if not versions:
        return
    emit_long("versions the catalog does not know" + (" (dry run: nothing deleted)"
                                                       if dry_run else ""),
              ["job", "store", "key", "version", "action", "why"],
              [(r["job"], r["store"], r["key"], r["version_id"], r["action"],
                "; ".join(r["reasons"])) for r in versions],
              show_all=show_all, what="versions", summary=lambda: (
                  ["job", "store", "action", "why", "versions"],
                  [(job, store, action, "; ".join(why), count)
                   for (job, store, action, why), count, _ in count_by(
                      versions, lambda r: (r["job"], r["store"], r["action"], _why(r)), {})]))


def _print_outcome(where: str, o: PruneOutcome) -> None:
    """What destroying did on the source or one target: the counts, then a line per
    snapshot that stayed (skipped, failed, or kept by the floor of the host's zbak serve,
    which is the host's choice and no failure)."""
    floor = f", kept (floor) {len(o.kept_by_floor)}" if o.kept_by_floor else ""
    click.echo(f"{where}: destroyed {len(o.destroyed)}{floor}, skipped {len(o.skipped)},"
               f" failed {len(o.failed)}")
    for name, why in o.kept_by_floor:
        click.echo(f"  kept (floor) {name}: {why}")
    for name, why in o.skipped + o.failed:
        click.echo(f"  kept {name}: {why}")


def _print_archive_lines(job: str, archive: ArchivePruneResult, show_all: bool) -> None:
    """Per dataset, the re-check of each releasing chain and what was deleted; past
    ``LIMIT`` datasets (without ``show_all``) one total line, and a line of its own only
    for each dataset whose re-check or delete did not go through."""
    datasets = archive.datasets
    many = len(datasets) > LIMIT and not show_all
    planned = checked = objects = deleted = finished = 0
    for d in datasets:
        trouble = d.outcome is not None and (d.outcome.error or d.outcome.mismatch)
        for full_id in d.recheck_planned:
            planned += 1
            objects += d.recheck_planned[full_id]
            if not many or trouble:
                click.echo(f"{job} -> {archive.store}: {d.dataset}: " + _recheck_text(d, full_id))
        if d.outcome is None:
            continue
        checked += len(d.outcome.rechecks)
        deleted += len(d.outcome.deleted)
        finished += len(d.outcome.finished)
        if not many or trouble:
            click.echo(f"{job} -> {archive.store}: {d.dataset}: deleted"
                       f" {len(d.outcome.deleted)} stream(s)"
                       + (f", finished {len(d.outcome.finished)} left by an earlier prune"
                          if d.outcome.finished else ""))
    if not many:
        return
    real = any(d.outcome is not None for d in datasets)
    click.echo(f"{job} -> {archive.store}: {len(datasets):,} datasets: "
               + (f"re-checked {checked:,} of {planned:,} releasing chain(s), deleted"
                  f" {deleted:,} stream(s), finished {finished:,} left by an earlier prune"
                  if real else f"will re-check {objects:,} objects of {planned:,} releasing"
                  " chain(s) before deleting") + " (--all: per dataset)")


def _report_errors(results: Sequence[PruneResult]) -> None:
    """Every target and store failure on stderr, whatever the output format."""
    for result in results:
        for target in result.replicas:
            if target.error:
                click.echo(f"zbak: job {result.job}: target {target.target}: {target.error}",
                           err=True)
        for archive in result.stores:
            _report_store_errors(result.job, archive)


def _report_store_errors(job: str, archive: ArchivePruneResult) -> None:
    """``_report_errors`` of one store."""
    if archive.error:
        click.echo(f"zbak: job {job}: store {archive.store}: {archive.error}", err=True)
    if archive.versions is not None and archive.versions.error:
        click.echo(f"zbak: job {job}: store {archive.store}: deleting versions the catalog"
                   f" does not know stopped: {archive.versions.error}; run zbak prune again",
                   err=True)
    for d in archive.datasets:
        problem = d.problem
        if problem:
            then = "" if d.plan is not None and d.plan.refused or (
                d.outcome is not None and d.outcome.mismatch) else (
                "; run zbak prune again to finish")
            click.echo(f"zbak: job {job}: store {archive.store}: {d.dataset}: {problem}" + then,
                       err=True)
