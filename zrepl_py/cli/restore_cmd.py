"""``zbak restore [DATASET] --to @SNAP [--into POOL/NAME] [--from SRC] [--dry-run] [--yes]``,
and with ``--path PATH... --into-dir DIR [--overwrite]`` its files only (``zrepl_py.files``)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from zrepl_py.cli.common import (
    Invocation,
    emit_json,
    emit_table,
    identity_option,
    json_option,
    pass_invocation,
)
from zrepl_py.errors import ExitStatus, UsageError, ZbakError

if TYPE_CHECKING:
    from zrepl_py.files.plan import FilePlan
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


SOURCE_KINDS = ("replica", "archive")
"""``--from`` may name a kind of source instead of one source (``restore.plan._choose``)."""


def _check_against_config(ctx: Context, dataset: str | None, to: str, from_: str | None) -> None:
    """Refuse what only the config shows is wrong, before the catalog or any process is
    touched: a ``--from`` naming no source kind, host or store of it, and a ``--to`` whose
    full snapshot name ``DATASET@NAME`` breaks the ZFS rules (too long).

    Raises:
        UsageError: ``--from`` names nothing the config has (exit 2).
        InvalidName: ``DATASET@NAME`` is not a valid snapshot name (exit 2).
    """
    from zrepl_py.config.hosts import LOCAL_HOST
    from zrepl_py.restore.gather import resolve_dataset
    from zrepl_py.zfs.names import SnapshotName

    SnapshotName.of(resolve_dataset(ctx, dataset)[1], to.removeprefix("@"))
    known = {LOCAL_HOST, *SOURCE_KINDS, *ctx.config.hosts, *ctx.config.stores}
    if from_ is not None and from_ not in known:
        raise UsageError(f"--from {from_}: no host or store of that name in {ctx.config_path}"
                         f" (expected {', '.join(sorted(known))})")


def _job(ctx: Context) -> str:
    """The job a restore's run rows are recorded under."""
    return next(iter(ctx.config.jobs), "restore")


def _record_failure(ctx: Context, target: Callable[[], str], exc: ZbakError) -> None:
    """Record a restore that failed while planning as a failed run with its alert
    (docs/decisions.md#every-failed-action-is-a-recorded-run), under the target a successful
    restore would record (``target()``: ``HOST:INTO``, or ``local:DIR`` for files). A usage
    error is the typist's, shown at once, not recorded; a catalog that cannot record is what
    failed, already reported."""
    from zrepl_py.observe.runlog import recorded_run

    if exc.exit_status == ExitStatus.USAGE:
        return
    with contextlib.suppress(ZbakError):
        with recorded_run(ctx.catalog(), ctx.clock, _job(ctx), "restore", target()):
            raise exc


def _into_target(ctx: Context, dataset: str | None, into: str | None) -> Callable[[], str]:
    """The run target of a dataset restore, ``HOST:INTO``, worked out when asked."""
    from zrepl_py.restore.gather import resolve_dataset, resolve_into

    def target() -> str:
        host, name = resolve_dataset(ctx, dataset)
        where, new = resolve_into(ctx, host, name, into)
        return f"{where}:{new}"

    return target


@click.command("restore")
@click.argument("dataset", required=False)
@click.option("--to", "to", required=True, metavar="@SNAP", help="The snapshot to restore.")
@click.option("--into", metavar="[HOST:]POOL/NAME",
              help="Create this dataset instead of DATASET (on DATASET's host unless HOST is given).")
@click.option("--from", "from_", metavar="local|HOST|STORE", help="Force a source.")
@click.option("--path", "paths", multiple=True, metavar="PATH",
              help="Restore only this file or directory, relative to the dataset's mountpoint"
                   " (repeatable; . for all); needs --into-dir.")
@click.option("--into-dir", "into_dir", metavar="DIR",
              help="With --path: the directory the files are restored into (created if"
                   " missing), under their path in the dataset.")
@click.option("--overwrite", is_flag=True,
              help="With --path: replace files that exist in --into-dir.")
@click.option("--dry-run", is_flag=True, help="Print the plan only.")
@click.option("--yes", is_flag=True, help="Do not ask before restoring.")
@identity_option()
@json_option
@pass_invocation
def command(inv: Invocation, dataset: str | None, to: str, into: str | None, from_: str | None,
            paths: tuple[str, ...], into_dir: str | None, overwrite: bool, dry_run: bool,
            yes: bool, identity: Path | None, as_json: bool) -> ExitStatus:
    """Restore DATASET (default: the only job's dataset) to snapshot @SNAP from the cheapest
    source that has it: the local pool (with --into), a replica, or the archive chain.
    Never overwrites an existing dataset. With --path, restore those files and directories
    of @SNAP into --into-dir instead, never writing outside it."""
    from zrepl_py.observe.runlog import recorded_run
    from zrepl_py.restore.execute import archive_codecs, execute_restore
    from zrepl_py.restore.gather import gather_restore
    from zrepl_py.restore.plan import plan_restore

    _check_arguments(dataset, to, into, from_)
    if paths or into_dir is not None or overwrite:
        wanted = _check_file_arguments(paths, into, into_dir)
        assert into_dir is not None
        return _files(inv, dataset, to, from_, wanted, os.path.abspath(into_dir), overwrite,
                      dry_run, yes, identity, as_json)
    with inv.context() as ctx:
        ctx.identity = identity
        _check_against_config(ctx, dataset, to, from_)
        try:
            plan = plan_restore(gather_restore(ctx, dataset, into), to, from_)
            if not dry_run and plan.chosen.source == "archive":
                archive_codecs(ctx, plan)  # the identity, before anyone is asked to go on
        except ZbakError as exc:
            if not dry_run:
                _record_failure(ctx, _into_target(ctx, dataset, into), exc)
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
        refused = _confirm(yes)
        if refused is not None:
            return refused
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


def _confirm(yes: bool) -> ExitStatus | None:
    """None to go on: ``--yes``, or the admin said yes on a terminal; else the status."""
    if yes:
        return None
    if not sys.stdin.isatty():
        click.echo("zbak: pass --yes to restore without a terminal to confirm on", err=True)
        return ExitStatus.USAGE
    return None if click.confirm("Restore now?") else ExitStatus.FAILED


def _check_file_arguments(paths: tuple[str, ...], into: str | None,
                          into_dir: str | None) -> tuple[str, ...]:
    """The requested paths (``files.paths``: relative, no ``..``), checked before anything
    is touched.

    Raises:
        UsageError: --path without --into-dir or the reverse, --overwrite alone, --into
            with --path; InvalidPath: a PATH ``files.paths`` refuses.
    """
    from zrepl_py.files.paths import covering, parse_path

    if not paths or into_dir is None:
        raise UsageError("--path, --into-dir and --overwrite go together: zbak restore DATASET"
                         " --to @SNAP --path PATH... --into-dir DIR [--overwrite]")
    if into is not None:
        raise UsageError("--into restores a whole dataset, --path files into --into-dir:"
                         " give one of them")
    if not into_dir or "\x00" in into_dir:
        raise UsageError("--into-dir must name a directory (not empty, no NUL byte)")
    return covering(parse_path(p, "--path") for p in paths)


def _files(inv: Invocation, dataset: str | None, to: str, from_: str | None,
           paths: tuple[str, ...], into_dir: str, overwrite: bool, dry_run: bool, yes: bool,
           identity: Path | None, as_json: bool) -> ExitStatus:
    """``zbak restore --path``: plan, show, confirm, restore (``files.restore``); a sealed
    store's volumes are decrypted with ``identity`` (``--identity FILE``)."""
    from zrepl_py.files.restore import plan_file_restore, restore_files
    from zrepl_py.observe.runlog import recorded_run
    from zrepl_py.restore.execute import archive_codecs

    target = f"local:{into_dir}"
    with inv.context() as ctx:
        ctx.identity = identity
        try:
            plan = plan_file_restore(ctx, dataset, to, from_, paths, into_dir,
                                     overwrite=overwrite)
            if not dry_run and plan.receive is not None:
                archive_codecs(ctx, plan.receive)  # the identity, before anyone is asked
        except ZbakError as exc:
            if not dry_run:
                _record_failure(ctx, lambda: target, exc)
            raise
        _show_file_plan(plan, dry_run, as_json)
        if dry_run:
            return ExitStatus.OK
        refused = _confirm(yes)
        if refused is not None:
            return refused
        with recorded_run(ctx.catalog(), ctx.clock, _job(ctx), "restore", target) as record:
            outcome = restore_files(ctx, plan)
            record.bytes = outcome.extracted.bytes
    if not as_json:
        click.echo(f"restored {outcome.extracted.members} file(s) and director(ies),"
                   f" {outcome.extracted.bytes} bytes, of {plan.dataset}@{plan.choice.target.name}"
                   f" into {outcome.into_dir} from {plan.choice.chosen.source}"
                   f" {plan.choice.chosen.label}")
        for line in outcome.extracted.warnings:
            click.echo(f"warning: {line}", err=True)
    return ExitStatus.OK


def _show_file_plan(plan: FilePlan, dry_run: bool, as_json: bool) -> None:
    """The file restore's plan: every source, the chosen one's way, and for the archive what
    is received into the scratch dataset and thawed first."""
    choice = plan.choice
    reason = plan.receive.reason if plan.receive is not None else choice.reason
    shown = ", ".join(repr(p) for p in plan.paths)
    rows: list[dict[str, Any]] = []
    for o in choice.options:
        chosen = o is choice.chosen
        detail, size = "", None
        received = plan.receive.chosen.path if chosen and plan.receive is not None else None
        if received is not None and o.path is not None:
            streams = " -> ".join(f"{s.kind} @{s.to_name} ({s.storage_class}, {s.stored_bytes} B)"
                                  for s in received.streams)
            detail = (f"receive {streams} into local:{plan.scratch}, read {shown} from"
                      f" {plan.read_snapshot}, then destroy it")
            if plan.discard:
                detail = f"destroy the leftover local:{plan.scratch}, {detail}"
            size = o.path.stored_bytes
        elif chosen:
            detail = f"read {shown} from {plan.read_host}:{plan.read_snapshot}"
            if plan.scratch is not None:
                detail += " (received before), then destroy it"
        elif o.path is not None:
            size = o.path.stored_bytes
        rows.append({"source": o.source, "from": o.label, "chosen": chosen, "plan": detail,
                     "bytes": size, "cost": o.cost or None,
                     "why": reason if chosen else None, "problem": o.problem})
    title = (f"restore {shown} of {plan.host}:{plan.dataset}@{choice.target.name} into"
             f" {plan.into_dir} from {choice.chosen.source} {choice.chosen.label}")
    thaw = plan.receive.thaw if plan.receive is not None else None
    if as_json:
        emit_json({"dry_run": dry_run, "plan": title, "reason": reason, "options": rows,
                   "paths": list(plan.paths), "into_dir": plan.into_dir,
                   "overwrite": plan.overwrite, "scratch": plan.scratch, "thaw": thaw})
        return
    emit_table(title, ["source", "from", "use", "plan", "stored bytes", "why / problem"],
               [(r["source"], r["from"], "yes" if r["chosen"] else "", r["plan"], r["bytes"],
                 r["why"] or r["problem"] or r["cost"]) for r in rows])
    if plan.receive is not None:
        click.echo(_thaw_text(plan.receive))
