"""``zbak config check``: validate the config file and say so (exit 2 names key and file)."""

from __future__ import annotations

import click

from zrepl_py.cli.common import Invocation, pass_invocation
from zrepl_py.errors import ExitStatus


@click.group("config")
def command() -> None:
    """Work with the config file."""


@command.command("check")
@pass_invocation
def check(inv: Invocation) -> ExitStatus:
    """Validate the config; exit 0 when valid, 2 with every problem's key path when not."""
    ctx = inv.context()
    config = ctx.config
    click.echo(f"{ctx.config_path}: valid ({len(config.jobs)} job(s), {len(config.hosts)} "
               f"host(s), {len(config.stores)} store(s); catalog {config.catalog_url.split('://')[0]})")
    return ExitStatus.OK
