"""``zbak config check``: validate the config file and say so (exit 2 names key and file)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from zrepl_py.cli.common import Invocation, emit_json, json_option, pass_invocation
from zrepl_py.config.extras import require_for_config
from zrepl_py.errors import ConfigError, ExitStatus, ExtraMissing
from zrepl_py.runtime.logsetup import printable
from zrepl_py.runtime.reading import open_to_others

if TYPE_CHECKING:
    from zrepl_py.config.schema import Config


@click.group("config")
def command() -> None:
    """Work with the config file."""


@command.command("check")
@json_option
@pass_invocation
def check(inv: Invocation, as_json: bool) -> ExitStatus:
    """Validate the config; exit 0 when valid, 2 with every problem's key path when not, or
    naming the extra to install for a store or catalog whose library is missing. With
    --json, one object either way: {"config", "valid", "problems": [{"key", "message"}],
    "warnings", and when valid "jobs", "hosts", "stores", "catalog"}."""
    try:
        ctx = inv.context()
    except ConfigError as exc:
        if not as_json:
            raise
        emit_json({"config": exc.path, "valid": False,
                   "problems": [{"key": key, "message": msg} for key, msg in exc.problems],
                   "warnings": []})
        return exc.exit_status
    config = ctx.config
    try:
        require_for_config(config)
    except ExtraMissing as exc:
        if not as_json:
            raise
        emit_json({"config": str(ctx.config_path), "valid": False,
                   "problems": [{"key": user, "message": f"needs {module}: pip install"
                                 f" 'zbak[{extra}]'" + (f" ({reason})" if reason else "")}
                                for user, module, extra, reason in exc.needs],
                   "warnings": []})
        return exc.exit_status
    warnings = []
    for path in [str(ctx.config_path), *_secret_files(config)]:
        mode = open_to_others(path)
        if mode is not None:
            warnings.append(f"{path} is readable by every user (mode {mode:04o}): chmod 600 it")
    catalog = config.catalog_url.split("://")[0]
    if as_json:
        emit_json({"config": str(ctx.config_path), "valid": True, "problems": [],
                   "warnings": warnings, "jobs": list(config.jobs), "hosts": list(config.hosts),
                   "stores": list(config.stores), "catalog": catalog})
        return ExitStatus.OK
    click.echo(f"{ctx.config_path}: valid ({len(config.jobs)} job(s), {len(config.hosts)} "
               f"host(s), {len(config.stores)} store(s); catalog {catalog})")
    for warning in warnings:
        click.echo(printable(f"zbak: warning: {warning}"), err=True)
    return ExitStatus.OK


def _secret_files(config: Config) -> list[str]:
    """Every ``{ file = ... }`` secret the config names."""
    # imported here: `zbak --help` imports every command module, and pydantic costs 0.05 s
    from pydantic import BaseModel

    from zrepl_py.config.alerts import SecretRef

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
