"""``zbak catalog rebuild STORE [--merge] [--json]``: the catalog's streams from the manifests."""

from __future__ import annotations

import click

from zrepl_py.cli.common import Invocation, emit_json, emit_table, json_option, pass_invocation
from zrepl_py.errors import ExitStatus


@click.group("catalog")
def command() -> None:
    """Maintain the catalog itself."""


@command.command("rebuild")
@click.argument("store")
@click.option("--merge", is_flag=True,
              help="Add only the streams the catalog lacks (the store already has some).")
@json_option
@pass_invocation
def rebuild(inv: Invocation, store: str, merge: bool, as_json: bool) -> ExitStatus:
    """Re-create the streams, volumes and carried snapshots of STORE from the manifests in it
    (after the catalog was lost; run `zbak init` first on an empty database). Rebuilt streams
    are unverified: run `zbak audit --deep` afterwards."""
    from zrepl_py.catalog.rebuild import rebuild_store  # boto3 only here
    with inv.context() as ctx:
        backend = ctx.store(store)
        result = rebuild_store(ctx.catalog(), backend, store, merge=merge,
                               concurrency=ctx.config.stores[store].upload_concurrency)
    if as_json:
        emit_json({"store": store, "manifests": result.manifests, "added": result.added,
                   "present": result.present,
                   "skipped": [{"key": s.key, "why": s.why} for s in result.skipped]})
    else:
        click.echo(f"store {store}: {result.manifests} manifest(s), {len(result.added)} stream(s)"
                   f" added, {len(result.present)} already in the catalog,"
                   f" {len(result.skipped)} skipped")
        if result.skipped:
            emit_table("skipped manifests", ["manifest", "why"],
                       [(s.key, s.why) for s in result.skipped])
            click.echo("the streams skipped cannot be restored from this store; `zbak audit` lists"
                       " per dataset which snapshots it can still restore and what to do")
    return ExitStatus.FAILED if result.skipped else ExitStatus.OK
