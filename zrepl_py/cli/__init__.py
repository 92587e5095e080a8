"""The ``zbak`` command line: ``main(argv, env) -> ExitStatus`` and the console entry point.

Commands are thin (docs/style.md#commands-are-thin): each module parses its options, calls one
library function and maps the result to an ExitStatus. Errors are ZbakError subclasses whose
class decides the exit code.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

import click

from zrepl_py import __version__
from zrepl_py.cli.common import Invocation, add_global_options, refuse_secret_options
from zrepl_py.errors import ExitStatus, ZbakError
from zrepl_py.runtime.gcpause import begin_startup
from zrepl_py.runtime.heap import few_arenas
from zrepl_py.runtime.logsetup import printable

log = logging.getLogger("zrepl_py")

EPILOG = "\b\nExit codes:\n" + ExitStatus.help_table()

# Command name -> module defining ``command``. Modules are imported only when their command
# runs (or --help lists them), so `zbak snapshot` does not pay for boto3 or paramiko.
COMMANDS = {
    "init": "init_cmd",
    "config": "config_cmd",
    "snapshot": "snapshot_cmd",
    "replicate": "replicate_cmd",
    "archive": "archive_cmd",
    "copy": "copy_cmd",
    "prune": "prune_cmd",
    "audit": "audit_cmd",
    "restore": "restore_cmd",
    "find": "find_cmd",
    "drill": "drill_cmd",
    "status": "status_cmd",
    "list": "list_cmd",
    "catalog": "catalog_cmd",
    "daemon": "daemon_cmd",
    "serve": "serve_cmd",
    "holds": "holds_cmd",
    "failover": "failover_cmd",
    "failback": "failback_cmd",
    "replica": "replica_cmd",
    "digest": "digest_cmd",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use (click's LazyGroup recipe)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return None
        return add_global_options(importlib.import_module(f"zrepl_py.cli.{module}").command)


@add_global_options
@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="zbak")
@click.pass_context
def cli(click_ctx: click.Context) -> None:
    """zbak: ZFS snapshots, replication and cold-storage chains under one catalog.

    --config, --debug, -v and -q go before or after the command."""
    click_ctx.obj.setup_logging()


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
        refuse_secret_options(argv)
        result = cli.main(args=list(argv), prog_name="zbak", standalone_mode=False, obj=inv)
    except click.exceptions.Exit as exc:
        return ExitStatus(exc.exit_code)
    except click.ClickException as exc:
        _show_usage_error(exc)
        return ExitStatus.USAGE
    except click.Abort as exc:
        # click turns a KeyboardInterrupt or EOFError raised in a command into Abort "from"
        # it (Command.main); its own prompts raise Abort from None.
        if isinstance(exc.__cause__, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (_terminate)
            click.echo("zbak: interrupted", err=True)
            return ExitStatus.FAILED
        if isinstance(exc.__cause__, EOFError):  # no prompt's: a defect, not the user's answer
            return _internal_error(exc.__cause__, inv.debug)
        click.echo("aborted", err=True)
        return ExitStatus.FAILED
    except ZbakError as exc:
        click.echo("zbak: " + "\n".join(printable(line) for line in exc.lines()), err=True)
        return exc.exit_status
    except KeyboardInterrupt:
        click.echo("zbak: interrupted", err=True)
        return ExitStatus.FAILED
    except Exception as exc:  # a defect of zbak's: one line, the traceback behind --debug
        return _internal_error(exc, inv.debug)
    finally:
        inv.close()
    if isinstance(result, int):
        return ExitStatus(result)
    return ExitStatus.OK


def _show_usage_error(exc: click.ClickException) -> None:
    """Show a refused command line as one line on stderr (``zbak audit: Invalid value for
    '--sample': ... (see zbak audit --help)``) instead of click's usage block: bad input gets
    one clear line (docs/decisions.md#one-line-for-a-refused-command-line). ``zbak`` or a
    group given no command still prints its help."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        exc.show()
        return
    where = exc.ctx.command_path if isinstance(exc, click.UsageError) and exc.ctx else "zbak"
    hint = f" (see {where} --help)" if isinstance(exc, click.UsageError) else ""
    click.echo(f"{where}: {printable(exc.format_message())}{hint}", err=True)


def _internal_error(exc: Exception, debug: bool) -> ExitStatus:
    """Report an exception no command expected
    (docs/decisions.md#bad-input-is-one-line-and-its-exit-code): with ``--debug`` its traceback is
    logged; without, one line says what and how to see more. Exit 1."""
    if debug:
        log.error("internal error", exc_info=exc)
    hint = "" if debug else " (run again with --debug for the traceback)"
    what = printable(f"{type(exc).__name__}: {exc}")[:500]
    click.echo(f"zbak: internal error: {what}{hint}; please report it", err=True)
    return ExitStatus.FAILED


def entry_point() -> None:
    """Console-script entry: ``sys.exit(main(sys.argv[1:]))``."""
    begin_startup()  # the collector stays off until the command has loaded its modules
    few_arenas()  # before any thread starts (runtime.heap)
    status = int(main(sys.argv[1:]))
    # main() has closed what it opened; what is left is the modules' objects. Frozen, the
    # collector's passes at interpreter exit skip them: 0.2 s less per run with SQLAlchemy,
    # pydantic and paramiko loaded (benchmarks/replication.py fixed cost).
    gc.freeze()
    sys.exit(status)
