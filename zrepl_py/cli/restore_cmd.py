"""``zbak restore [DATASET] --to @SNAP [--into POOL/NAME] [--from SRC] [--dry-run] [--yes]``."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any

import click

from zrepl_py.cli.common import Invocation, emit_json, emit_table, json_option, pass_invocation
from zrepl_py.errors import ExitStatus, UsageError, ZbakError

if TYPE_CHECKING:
    from zrepl_py.invocation.context import Context
    from zrepl_py.restore.plan import RestorePlan


def _plan_rows(plan: RestorePlan) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for o in plan.options:
        chosen = o is plan.chosen
        if o.path is not None:
            streams = [f"{s.kind} @{s.to_name} ({s.storage_class}, {s.stored_bytes} B)"
                       for s in o.path.streams]
            detail = " -> ".join(streams)
            if o.path.later:
                detail += f"; then destroy {', '.join('@' + c.name for c in o.path.later)} from the copy"
            size = o.path.stored_bytes
        elif o.snapshots:
            first, last = o.snapshots[0].name, o.snapshots[-1].name
            detail = (f"zfs send {o.dataset}@{first}" +
                      (f", then -I @{first} @{last}" if len(o.snapshots) > 1 else "") +
                      (f" from {o.host}" if o.source == "replica" else ""))
            size = None
        else:
            detail, size = "", None
        rows.append({"source": o.source, "from": o.label, "chosen": chosen,
                     "plan": detail, "bytes": size, "cost": o.cost or None,
                     "why": plan.reason if chosen else None, "problem": o.problem})
    return rows


def _thaw_text(plan: RestorePlan) -> str:
    t = plan.thaw
    if t is None:
        return "no cold objects: no thaw needed"
    return (f"thaw {t.objects} object(s), {t.bytes} bytes, tier {t.tier}: about {t.hours:g} h,"
            f" about ${t.cost_usd:.2f} in retrieval fees")


def _check_arguments(dataset: str | None, to: str, into: str | None, from_: str | None) -> None:
    """Refuse a malformed argument before the config, the catalog or any process is touched
    (docs/decisions.md#bad-input-is-one-line-and-its-exit-code: exit 2, one line).

    Raises:
        InvalidName: DATASET or --into is not ``[HOST:]POOL/NAME``, --to not a snapshot name.
        UsageError: --from is not a host or store name (or ``local``).
    """
    from zrepl_py.config.hosts import parse_endpoint
    from zrepl_py.values.names import is_config_name
    from zrepl_py.zfs.names import check_short_name

    for value in (dataset, into):
        if value is not None:
            parse_endpoint(value, allow_directory=False)
    check_short_name(to.removeprefix("@"), "--to snapshot name")
    if from_ is not None and not is_config_name(from_):
        raise UsageError(f"--from {from_!r}: expected local, a host name or a store name")


def _job(ctx: Context) -> str:
    """The job a restore's run rows are recorded under."""
    return next(iter(ctx.config.jobs), "restore")


def _record_failure(ctx: Context, dataset: str | None, into: str | None, exc: ZbakError) -> None:
    """Record a restore that failed while planning as a failed run with its alert
    (docs/decisions.md#every-failed-action-is-a-recorded-run), under the target a successful
    restore would record (``HOST:INTO``). A usage error is the typist's, shown at once, not
    recorded; a catalog that cannot record is what failed, already reported."""
    from zrepl_py.observe.runlog import recorded_run
    from zrepl_py.restore.gather import resolve_dataset, resolve_into

    if exc.exit_status == ExitStatus.USAGE:
        return
    with contextlib.suppress(ZbakError):
        host, name = resolve_dataset(ctx, dataset)
        where, new = resolve_into(ctx, host, name, into)
        with recorded_run(ctx.catalog(), ctx.clock, _job(ctx), "restore", f"{where}:{new}"):
            raise exc


@click.command("restore")
@click.argument("dataset", required=False)
@click.option("--to", "to", required=True, metavar="@SNAP", help="The snapshot to restore.")
@click.option("--into", metavar="[HOST:]POOL/NAME",
              help="Create this dataset instead of DATASET (on DATASET's host unless HOST is given).")
@click.option("--from", "from_", metavar="local|HOST|STORE", help="Force a source.")
@click.option("--dry-run", is_flag=True, help="Print the plan only.")
@click.option("--yes", is_flag=True, help="Do not ask before restoring.")
@json_option
@pass_invocation
def command(inv: Invocation, dataset: str | None, to: str, into: str | None, from_: str | None,
            dry_run: bool, yes: bool, as_json: bool) -> ExitStatus:
    """Restore DATASET (default: the only job's dataset) to snapshot @SNAP from the cheapest
    source that has it: the local pool (with --into), a replica, or the archive chain.
    Never overwrites an existing dataset."""
    from zrepl_py.observe.runlog import recorded_run
    from zrepl_py.restore.execute import execute_restore
    from zrepl_py.restore.gather import gather_restore
    from zrepl_py.restore.plan import plan_restore

    _check_arguments(dataset, to, into, from_)
    with inv.context() as ctx:
        try:
            plan = plan_restore(gather_restore(ctx, dataset, into), to, from_)
        except ZbakError as exc:
            if not dry_run:
                _record_failure(ctx, dataset, into, exc)
            raise
        rows = _plan_rows(plan)
        title = (f"restore {plan.host}:{plan.dataset}@{plan.target.name} into {plan.into_host}:{plan.into}"
                 f" from {plan.chosen.source} {plan.chosen.label}")
        if as_json:
            emit_json({"dry_run": dry_run, "plan": title, "reason": plan.reason,
                       "options": rows, "thaw": plan.thaw, "into": plan.into})
        else:
            emit_table(title, ["source", "from", "use", "plan", "stored bytes", "why / problem"],
                       [(r["source"], r["from"], "yes" if r["chosen"] else "", r["plan"],
                         r["bytes"], r["why"] or r["problem"] or r["cost"]) for r in rows])
            if plan.chosen.source == "archive":
                click.echo(_thaw_text(plan))
        if dry_run:
            return ExitStatus.OK
        if not yes:
            if not sys.stdin.isatty():
                click.echo("zbak: pass --yes to restore without a terminal to confirm on", err=True)
                return ExitStatus.USAGE
            if not click.confirm("Restore now?"):
                return ExitStatus.FAILED
        job = _job(ctx)
        with ctx.lock(f"{plan.into_host}:{plan.into}", "restore"), \
                recorded_run(ctx.catalog(), ctx.clock, job, "restore", f"{plan.into_host}:{plan.into}") as record:
            outcome = execute_restore(ctx, plan)
            record.bytes = outcome.bytes
    if not as_json:
        click.echo(f"restored {plan.dataset}@{plan.target.name} into {outcome.into}:"
                   f" {outcome.streams} stream(s), {outcome.bytes} bytes received")
        if outcome.locked:  # a raw stream of an encrypted dataset arrives without its key
            click.echo(f"{outcome.into} is encrypted and its key is not loaded: zfs load-key"
                       f" {outcome.into}, then zfs mount {outcome.into}")
        else:  # received with -u: mounting is the admin's call (it may shadow a live mount)
            click.echo(f"{outcome.into} is not mounted (received with zfs receive -u), its newest"
                       f" snapshot is @{plan.target.name}: zfs mount {outcome.into} to use it")
    return ExitStatus.OK
