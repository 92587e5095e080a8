"""``zbak config check``: validate the config file and say so (exit 2 names key and file)."""

from __future__ import annotations

import click
from pydantic import BaseModel

from zrepl_py.cli.common import Invocation, pass_invocation
from zrepl_py.config.extras import require_for_config
from zrepl_py.config.reading import open_to_others
from zrepl_py.config.schema import Config, SecretRef
from zrepl_py.errors import ExitStatus


@click.group("config")
def command() -> None:
    """Work with the config file."""


@command.command("check")
@pass_invocation
def check(inv: Invocation) -> ExitStatus:
    """Validate the config; exit 0 when valid, 2 with every problem's key path when not,
    or naming the extra to install for a store or catalog whose library is missing."""
    ctx = inv.context()
    config = ctx.config
    require_for_config(config)
    click.echo(f"{ctx.config_path}: valid ({len(config.jobs)} job(s), {len(config.hosts)} "
               f"host(s), {len(config.stores)} store(s); catalog {config.catalog_url.split('://')[0]})")
    for path in [ctx.config_path, *_secret_files(config)]:
        mode = open_to_others(path)
        if mode is not None:
            click.echo(f"zbak: warning: {path} is readable by every user (mode {mode:04o}):"
                       f" chmod 600 it", err=True)
    return ExitStatus.OK


def _secret_files(config: Config) -> list[str]:
    """Every ``{ file = ... }`` secret the config names."""
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, SecretRef):
            if value.file is not None:
                found.append(str(value.file))
        elif isinstance(value, BaseModel):
            for name in type(value).model_fields:
                walk(getattr(value, name))
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(config)
    return found
