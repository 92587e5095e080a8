"""``zbak init``: create or upgrade the catalog, then check that every host and store answers."""

from __future__ import annotations

import click

from zrepl_py.cli.common import Invocation, emit_json, emit_table, json_option, pass_invocation
from zrepl_py.errors import ExitStatus


@click.command("init")
@click.option("--no-checks", is_flag=True, help="Only migrate the catalog; dial no host or store.")
@json_option
@pass_invocation
def command(inv: Invocation, no_checks: bool, as_json: bool) -> ExitStatus:
    """Create or upgrade the catalog and check hosts, datasets and stores."""
    # imported here (SQLAlchemy, the checks): `zbak --help` imports every command module
    from zrepl_py.catalog.db import make_engine, upgrade
    from zrepl_py.checks.preflight import run_checks
    from zrepl_py.config.extras import require_for_config
    from zrepl_py.runtime.statedir import ensure_private_dir
    from zrepl_py.snapshots.inventory import selection_check

    with inv.context() as ctx:
        require_for_config(ctx.config)
        ensure_private_dir(ctx.state_dir)
        engine = make_engine(ctx.config.catalog_url)
        try:
            before, after = upgrade(engine)
        finally:
            engine.dispose()
        checks = [] if no_checks else list(run_checks(ctx, source_checks=[selection_check]))
    migrated = "up to date" if before == after else f"migrated {before or 'empty'} -> {after}"
    if as_json:
        emit_json({"catalog": {"revision": after, "previous": before},
                   "checks": [{"subject": c.subject, "ok": c.ok, "detail": c.detail}
                               for c in checks]})
    else:
        click.echo(f"catalog: {migrated} (revision {after})")
        if checks:
            emit_table("checks", ["subject", "ok", "detail"],
                       [(c.subject, "ok" if c.ok else "FAILED", c.detail) for c in checks])
    failed = {c.status for c in checks if not c.ok}
    if not failed:
        return ExitStatus.OK
    # 2 only when every failure is the config's to fix (a bucket without Object Lock)
    return ExitStatus.USAGE if failed == {ExitStatus.USAGE} else ExitStatus.FAILED
