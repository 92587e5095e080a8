"""The ``zbak`` command line: ``main(argv, env) -> ExitStatus`` and the console entry point.

Commands are thin (house rule 1): each module parses its options, calls one library
function and maps the result to an ExitStatus. Errors are ZbakError subclasses whose
class decides the exit code.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Mapping, Sequence

import click

from zrepl_py import __version__
from zrepl_py.cli import (
    config_cmd,
    init_cmd,
    list_cmd,
    prune_cmd,
    replicate_cmd,
    snapshot_cmd,
    status_cmd,
)
from zrepl_py.cli.common import Invocation
from zrepl_py.errors import ExitStatus, ZbakError
from zrepl_py.logsetup import setup_logging

log = logging.getLogger("zrepl_py")

EPILOG = "\b\nExit codes:\n" + ExitStatus.help_table()


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_option", metavar="PATH",
              help="Config file (default: $ZBAK_CONFIG, then /etc/zbak/zbak.toml).")
@click.option("--debug", is_flag=True, help="Log every command run (never secrets).")
@click.version_option(__version__, prog_name="zbak")
@click.pass_context
def cli(click_ctx: click.Context, config_option: str | None, debug: bool) -> None:
    """zbak: ZFS snapshots, replication and cold-storage chains under one catalog."""
    inv: Invocation = click_ctx.obj
    inv.config_option = config_option
    inv.debug = debug
    setup_logging("DEBUG" if debug else inv.env.get("ZBAK_LOG_LEVEL", "INFO"))


for module in (init_cmd, snapshot_cmd, replicate_cmd, prune_cmd, status_cmd, list_cmd, config_cmd):
    cli.add_command(module.command)


def _terminate(signum: int, frame: object) -> None:
    # SIGTERM (systemd stop, kill) unwinds like Ctrl-C: running pipelines stop and reap
    # their stages, the run is recorded as failed, and a partial receive stays resumable.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ExitStatus:
    """Run zbak with ``argv`` (without the program name) and return the exit status."""
    inv = Invocation(env=dict(os.environ if env is None else env))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        result = cli.main(args=list(argv), prog_name="zbak", standalone_mode=False, obj=inv)
    except click.exceptions.Exit as exc:
        return ExitStatus(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return ExitStatus.USAGE
    except click.Abort:
        click.echo("aborted", err=True)
        return ExitStatus.FAILED
    except ZbakError as exc:
        click.echo(f"zbak: {exc}", err=True)
        return exc.exit_status
    except KeyboardInterrupt:
        click.echo("zbak: interrupted", err=True)
        return ExitStatus.FAILED
    if isinstance(result, int):
        return ExitStatus(result)
    return ExitStatus.OK


def entry_point() -> None:
    """Console-script entry: ``sys.exit(main(sys.argv[1:]))``."""
    sys.exit(int(main(sys.argv[1:])))
