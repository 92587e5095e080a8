"""``zbak catalog rebuild STORE [--merge] [--not-after TIME] [--json]``: the catalog's
streams from the manifests."""

from __future__ import annotations

import datetime as dt

import click

from zrepl_py.cli.common import Invocation, emit_json, emit_table, json_option, pass_invocation
from zrepl_py.errors import ExitStatus, UsageError
from zrepl_py.values.units import parse_moment


@click.group("catalog")
def command() -> None:
    """Maintain the catalog itself."""


@command.command("rebuild")
@click.argument("store")
@click.option("--merge", is_flag=True,
              help="Add only the streams the catalog lacks (the store already has some).")
@click.option("--not-after", "not_after", metavar="TIME",
              help="Read the store as it stood at TIME (ISO 8601, UTC unless it names an"
                   " offset, or a duration before now like 2d): later versions are ignored"
                   " and listed as untrusted (after an intrusion).")
@json_option
@pass_invocation
def rebuild(inv: Invocation, store: str, merge: bool, not_after: str | None,
            as_json: bool) -> ExitStatus:
    """Re-create the streams, volumes and carried snapshots of STORE from the manifests in it
    (after the catalog was lost; run `zbak init` first on an empty database). Rebuilt streams
    are unverified: run `zbak audit --deep` afterwards."""
    from zrepl_py.catalog.rebuild import rebuild_store  # boto3 only here
    try:
        cutoff = None if not_after is None else parse_moment(not_after, dt.datetime.now(dt.UTC))
    except ValueError as exc:
        raise UsageError(f"--not-after: {exc}") from None
    with inv.context() as ctx:
        backend = ctx.store(store)
        result = rebuild_store(ctx.catalog(), backend, store, merge=merge,
                               concurrency=ctx.config.stores[store].upload_concurrency,
                               not_after=cutoff)
    untrusted = [(v.info.key, v.version_id, "delete marker" if v.marker else "version",
                  v.info.modified) for v in result.untrusted]
    if as_json:
        emit_json({"store": store, "manifests": result.manifests, "added": result.added,
                   "present": result.present,
                   "skipped": [{"key": s.key, "why": s.why} for s in result.skipped],
                   "lost": result.lost, "not_after": cutoff,
                   "untrusted": [{"key": key, "version_id": version, "kind": kind,
                                  "last_modified": when}
                                 for key, version, kind, when in untrusted]})
    else:
        if cutoff is not None:
            click.echo(f"store {store} read as it stood at {cutoff:%Y-%m-%d %H:%M:%S} UTC:"
                       f" {len(untrusted)} later version(s) and delete marker(s) ignored as"
                       " untrusted")
        if untrusted:
            emit_table("untrusted (written after --not-after)",
                       ["key", "version id", "kind", "last modified"],
                       [(*row[:3], f"{row[3]:%Y-%m-%d %H:%M:%S} UTC") for row in untrusted])
        click.echo(f"store {store}: {result.manifests} manifest(s), {len(result.added)} stream(s)"
                   f" added, {len(result.present)} already in the catalog,"
                   f" {len(result.skipped)} skipped")
        if result.skipped:
            emit_table("skipped manifests", ["manifest", "why"],
                       [(s.key, s.why) for s in result.skipped])
            click.echo("the streams skipped cannot be restored from this store; `zbak audit` lists"
                       " per dataset which snapshots it can still restore and what to do")
    return ExitStatus.FAILED if result.skipped else ExitStatus.OK
