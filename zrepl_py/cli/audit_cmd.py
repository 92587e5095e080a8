"""``zbak audit [JOB...] [--deep] [--sample PERCENT] [--max-duration SECONDS]
[--receive-into POOL] [--repair [--yes] [--stale-uploads-days DAYS]] [--json]``.

Plain audit is read-only (but for its run record, and with ``--deep`` the streams' verified
or bad state); ``--repair`` is the only way it changes a store, and it asks first
(docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from zrepl_py.cli.common import (
    FiniteFloat,
    Invocation,
    emit_json,
    emit_table,
    for_each_job,
    identity_option,
    json_option,
    pass_invocation,
)
from zrepl_py.cli.summary import LIMIT, all_option, count_by, names_or_count, reason_kind
from zrepl_py.errors import ExitStatus, UsageError
from zrepl_py.values.units import MAX_DURATION

if TYPE_CHECKING:
    from zrepl_py.audit.findings import Finding
    from zrepl_py.audit.job import RepairResult
    from zrepl_py.audit.restorable import Coverage

_COLOURS = {"error": "red", "warning": "yellow", "info": "cyan"}


def _show(finding: Finding) -> None:
    """One finding as a block: severity and where, the problem, the object, what to do (long
    keys and sentences stay whole, which a table of ten columns cannot do)."""
    where = [f"job {finding.job}"]
    if finding.dataset:
        where.append(f"{finding.host}:{finding.dataset}")
    if finding.store:
        where.append(f"store {finding.store}")
    if finding.target:
        where.append(f"target {finding.target}")
    if finding.chain is not None:
        where.append(f"chain {finding.chain}")
    if finding.stream is not None:
        where.append(f"stream {finding.stream}")
    severity = finding.severity.value
    click.echo()
    click.secho(f"{severity.upper()} [{finding.level}] " + ", ".join(where),
                fg=_COLOURS[severity], bold=True)
    click.echo(f"  problem:    {finding.problem}")
    if finding.key:
        click.echo(f"  object:     {finding.key}")
    click.echo(f"  what to do: {finding.action}")


@click.command("audit")
@click.argument("jobs", nargs=-1)
@click.option("--deep", is_flag=True, help="Also re-read the volumes: SHA-256, zstd frame end,"
              " the stream's own BEGIN records; marks streams verified or bad.")
@click.option("--sample", type=FiniteFloat(0, 100, min_open=True), metavar="PERCENT",
              help="With --deep, read only this percentage of the streams, least recently"
                   " verified first (implies --deep).")
@click.option("--receive-into", metavar="[HOST:]POOL",
              help="With --deep, test-receive each chain read into a scratch dataset"
                   " POOL/zbak-audit-RANDOM, destroyed afterwards (implies --deep).")
@click.option("--max-duration", type=FiniteFloat(0, MAX_DURATION.total_seconds()), metavar="SECONDS",
              help="With --deep, start no further stream after this many seconds (at least one"
                   " is read); the next run continues with the least recently verified"
                   " (implies --deep).")
@identity_option("With --deep, the")
@click.option("--repair", is_flag=True,
              help="First make the safe repairs: abort unfinished uploads older than"
                   " --stale-uploads-days, finish deleting streams a stopped prune condemned."
                   " Asks for confirmation.")
@click.option("--yes", is_flag=True, help="With --repair, do not ask (needed without a terminal).")
@click.option("--stale-uploads-days", type=FiniteFloat(0, MAX_DURATION.days), default=7.0,
              show_default=True, metavar="DAYS",
              help="With --repair, abort unfinished uploads started longer ago than this.")
@all_option
@json_option
@pass_invocation
def command(inv: Invocation, jobs: tuple[str, ...], deep: bool, sample: float | None,
            receive_into: str | None, max_duration: float | None, identity: Path | None,
            repair: bool, yes: bool, stale_uploads_days: float, show_all: bool,
            as_json: bool) -> ExitStatus:
    """Check that every retained snapshot of each job is restorable: the catalog's chains and
    replica cursors, the objects in the store and their manifests, and with --deep the
    volumes' contents. States per dataset and store which snapshots are restorable and which
    are stored but unrestorable. Read-only unless --repair (a plain audit runs beside
    archive, replicate and snapshot runs). A manifest an earlier audit read is read again
    only when the store's listing shows it changed (or after a while; --deep reads all).
    Past 100 datasets or findings, the fully restorable datasets and the findings are
    counted (--all: each). Exits 4 when a warning or error is found, 75 when only cold
    volumes are still thawing."""
    from zrepl_py.audit.deep import Deadline  # boto3 only when auditing
    from zrepl_py.audit.job import audit_job, receive_into_place, repair_job

    deep = deep or sample is not None or receive_into is not None or max_duration is not None
    if repair and not yes:
        _confirm_repair(stale_uploads_days)
    deadline = Deadline(max_duration)
    repairs: list[RepairResult] = []
    with inv.context() as ctx:
        ctx.identity = identity
        selected = ctx.select_jobs(jobs)
        if receive_into is not None:
            receive_into_place(ctx, receive_into)
        if repair:
            repairs, status = for_each_job(
                selected, lambda n, j: repair_job(ctx, n, j,
                                                  stale_upload_age=stale_uploads_days * 86400))
            if status != ExitStatus.OK:
                return status
        results, status = for_each_job(
            selected,
            lambda n, j: audit_job(ctx, n, j, deep=deep, sample=sample, receive_into=receive_into,
                                   deadline=deadline))
    findings = [f for r in results for f in r.findings]
    if as_json:
        emit_json({
            "deep": deep,
            "repair": [{"job": r.job, "aborted_uploads": r.aborted, "finished_streams": r.finished,
                        "errors": r.errors} for r in repairs],
            "jobs": [{"job": r.job, "streams": r.streams, "summary": r.summary(),
                      "manifests": {"read": r.manifests_read,
                                    "trusted": r.manifests_trusted},
                      "verified": r.verified, "bad": r.bad, "received": r.received,
                      "thawing": r.waiting, "ready_by": r.ready_by,
                      "not_read": r.skipped,
                      "coverage": [c.as_dict() for c in r.coverage]} for r in results],
            "findings": [f.as_dict() for f in findings],
        })
    else:
        for repaired in repairs:
            aborted = sum(len(v) for v in repaired.aborted.values())
            click.echo(f"job {repaired.job}: repair: aborted {aborted} unfinished upload(s),"
                       f" finished deleting {len(repaired.finished)} condemned stream(s)")
            for store, error in repaired.errors.items():
                click.echo(f"zbak: job {repaired.job}: store {store}: repair stopped: {error}",
                           err=True)
        for r in results:
            extra = f", {len(r.verified)} verified, {len(r.bad)} marked bad" if deep else ""
            if r.skipped:
                extra += f", {r.skipped} not read (--max-duration)"
            if r.received:
                extra += f", {len(r.received)} chain(s) test-received"
            if r.manifests_trusted:
                extra += (f", {r.manifests_read} manifest(s) read, {r.manifests_trusted}"
                          " unchanged since an earlier audit read them")
            click.echo(f"job {r.job}: {r.streams} stream(s){extra}: {r.summary()}")
            _show_coverage(r.coverage, show_all)
        if len(findings) > LIMIT and not show_all:
            _count_findings(findings)
        else:
            for f in findings:
                _show(f)
    if status != ExitStatus.OK:
        return status
    if any(r.errors for r in repairs):
        return ExitStatus.FAILED
    if any(r.wrong for r in results):
        return ExitStatus.AUDIT_FINDINGS
    if any(r.waiting for r in results):
        return ExitStatus.THAW_PENDING
    return ExitStatus.OK


def _show_coverage(found: Sequence[Coverage], show_all: bool) -> None:
    """One line per dataset and store; past ``LIMIT`` lines, the datasets whose every
    stored snapshot is restorable are counted in one line per store, the others each
    keep their line."""
    whole = [c for c in found if not c.unrestorable and not c.not_catalogued]
    if len(found) <= LIMIT or show_all or not whole:
        for c in found:
            click.echo(f"  {c.host}:{c.dataset} in store {c.store}: {c.line()}")
        return
    for c in found:
        if c.unrestorable or c.not_catalogued:
            click.echo(f"  {c.host}:{c.dataset} in store {c.store}: {c.line()}")
    by_store: dict[str, list[Coverage]] = {}
    for c in whole:
        by_store.setdefault(c.store, []).append(c)
    for store, covs in sorted(by_store.items()):
        snaps = sum(len(c.restorable) for c in covs)
        click.echo(f"  {len(covs):,} datasets in store {store}"
                   f" ({names_or_count(f'{c.host}:{c.dataset}' for c in covs)}): every stored"
                   f" snapshot restorable, {snaps:,} in all (--all: one line each)")


def _count_findings(findings: Sequence[Finding]) -> None:
    """Findings counted per severity, level and problem (names and numbers left out),
    with the datasets they are about."""
    emit_table(f"{len(findings):,} findings, counted (--all shows each, --json for machines)",
               ["severity", "level", "problem", "findings", "datasets"],
               [(severity, level, problem, f"{count:,}", names_or_count(seen["datasets"]))
                for (severity, level, problem), count, seen in count_by(
                   findings, lambda f: (f.severity.value, f.level, reason_kind(f.problem)),
                   {"datasets": lambda f: f.dataset or "-"})])


def _confirm_repair(stale_uploads_days: float) -> None:
    """Ask before ``--repair`` changes the store and the catalog (borg's
    ``BORG_CHECK_I_KNOW_WHAT_I_AM_DOING``): on a terminal a yes/no question, else --yes.

    Raises:
        UsageError: no terminal and no --yes, or the answer was no.
    """
    what = (f"--repair aborts unfinished uploads older than {stale_uploads_days:g} day(s) and"
            " deletes the objects and rows of streams a stopped prune condemned")
    if not sys.stdin.isatty():
        raise UsageError(f"{what}; pass --yes to confirm (no terminal to ask on). Nothing done.")
    if not click.confirm(f"{what}. Continue?", default=False):
        raise UsageError("--repair not confirmed; nothing done")
