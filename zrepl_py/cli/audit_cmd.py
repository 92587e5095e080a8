"""``zbak audit [JOB...] [--deep] [--sample PERCENT] [--receive-into POOL] [--json]``."""

from __future__ import annotations

import click

from zrepl_py.cli.common import Invocation, emit_json, for_each_job, json_option, pass_invocation
from zrepl_py.errors import ExitStatus

_COLOURS = {"error": "red", "warning": "yellow", "info": "cyan"}


def _show(finding) -> None:
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
@click.option("--sample", type=click.FloatRange(0, 100, min_open=True), metavar="PERCENT",
              help="With --deep, read only this percentage of the streams, least recently"
                   " verified first (implies --deep).")
@click.option("--receive-into", metavar="[HOST:]POOL",
              help="With --deep, test-receive each chain read into a scratch dataset"
                   " POOL/zbak-audit-RANDOM, destroyed afterwards (implies --deep).")
@json_option
@pass_invocation
def command(inv: Invocation, jobs: tuple[str, ...], deep: bool, sample: float | None,
            receive_into: str | None, as_json: bool) -> ExitStatus:
    """Check that every retained snapshot of each job is restorable: the catalog's chains and
    replica cursors, the objects in the store and their manifests, and with --deep the
    volumes' contents. Exits 4 when a warning or error is found, 75 when only cold volumes
    are still thawing."""
    from zrepl_py.audit.job import audit_job  # noqa: PLC0415 (boto3 only when auditing)

    deep = deep or sample is not None or receive_into is not None
    with inv.context() as ctx:
        results, status = for_each_job(
            ctx.select_jobs(jobs),
            lambda n, j: audit_job(ctx, n, j, deep=deep, sample=sample, receive_into=receive_into))
    findings = [f for r in results for f in r.findings]
    if as_json:
        emit_json({
            "deep": deep,
            "jobs": [{"job": r.job, "streams": r.streams, "summary": r.summary(),
                      "verified": r.verified, "bad": r.bad, "received": r.received,
                      "thawing": r.waiting, "ready_by": r.ready_by} for r in results],
            "findings": [f.as_dict() for f in findings],
        })
    else:
        for r in results:
            extra = f", {len(r.verified)} verified, {len(r.bad)} marked bad" if deep else ""
            if r.received:
                extra += f", {len(r.received)} chain(s) test-received"
            click.echo(f"job {r.job}: {r.streams} stream(s){extra}: {r.summary()}")
        for f in findings:
            _show(f)
    if status != ExitStatus.OK:
        return status
    if any(r.wrong for r in results):
        return ExitStatus.AUDIT_FINDINGS
    if any(r.waiting for r in results):
        return ExitStatus.THAW_PENDING
    return ExitStatus.OK
