"""What every command shares: the invocation state, output (table or JSON), job locking.

Imported by every command module and by ``zbak --version``, so it imports only click: the
config loader (pydantic), the Context (catalog, hosts) and rich load when first used.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from zrepl_py.errors import ExitStatus, ZbakError
from zrepl_py.runtime.logsetup import printable

if TYPE_CHECKING:
    from zrepl_py.config.jobs import JobConfig
    from zrepl_py.invocation.context import Context


LOG_LEVELS = ("ERROR", "WARNING", "INFO", "DEBUG")
"""The console log levels ``-q`` and ``-v`` step through, quietest first."""


@dataclasses.dataclass
class Invocation:
    """Global options of one ``zbak`` run, shared with every command through click's ``obj``.

    Attributes:
        env: the environment (``ZBAK_CONFIG``, ``ZBAK_LOG_LEVEL``).
        config_option: ``--config``, or None.
        debug: ``--debug`` was given.
        verbosity: the number of ``-v`` minus the number of ``-q``.
    """

    env: Mapping[str, str]
    config_option: str | None = None
    debug: bool = False
    verbosity: int = 0
    alerts: Any = None
    """The alert Dispatcher installed by ``context()``; ``close()`` flushes and removes it."""

    def log_level(self, default: str) -> str:
        """The console log level: DEBUG with ``--debug``, else ``default`` (one of
        ``LOG_LEVELS``; anything else counts as INFO) moved one level per ``-v`` or ``-q``."""
        if self.debug:
            return "DEBUG"
        start = LOG_LEVELS.index(default) if default in LOG_LEVELS else LOG_LEVELS.index("INFO")
        return LOG_LEVELS[min(max(start + self.verbosity, 0), len(LOG_LEVELS) - 1)]

    def setup_logging(self) -> None:
        """Log to stderr at ``log_level`` of ``$ZBAK_LOG_LEVEL`` (default INFO)."""
        from zrepl_py.runtime.logsetup import setup_logging

        setup_logging(self.log_level(self.env.get("ZBAK_LOG_LEVEL", "INFO")))

    @property
    def config_file(self) -> Path:
        """The config path after ``--config`` / ``$ZBAK_CONFIG`` / default resolution."""
        from zrepl_py.config.loading import config_path

        return config_path(self.config_option, self.env)

    def context(self) -> Context:
        """Load and validate the config and build a Context (raises ConfigError, exit 2)."""
        from zrepl_py.alerts import install
        from zrepl_py.config.loading import load_config
        from zrepl_py.invocation.context import Context

        path = self.config_file
        config = load_config(path)
        if self.alerts is None:  # failure/recovery/budget alerts from manual and cron runs too
            self.alerts = install(config.alerts)
        return Context(config=config, config_path=path)

    def close(self) -> None:
        """Deliver queued alerts and unregister the dispatcher (end of the command)."""
        if self.alerts is not None:
            self.alerts.close()
            self.alerts = None


pass_invocation = click.make_pass_decorator(Invocation)

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _invocation(ctx: click.Context) -> Invocation:
    inv = ctx.find_object(Invocation)
    assert inv is not None  # the zbak group sets it before any option is parsed
    return inv


def _config_given(ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> None:
    inv = _invocation(ctx)
    for value in values:
        if inv.config_option is not None and (os.path.abspath(inv.config_option)
                                              != os.path.abspath(value)):
            raise click.UsageError(printable(
                f"--config names two files, {inv.config_option} and {value}: give it once"
                " (before or after the command)"))
        inv.config_option = value


def _debug_given(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        inv = _invocation(ctx)
        inv.debug = True
        inv.setup_logging()


def _verbosity_given(ctx: click.Context, param: click.Parameter, count: int) -> None:
    if count:
        inv = _invocation(ctx)
        inv.verbosity += count if param.name == "verbose" else -count
        inv.setup_logging()


def global_options() -> list[click.Option]:
    """New ``--config``, ``--debug``, ``-v`` and ``-q`` options for one command (zbak takes them
    before or after the command, as zrepl, restic and pgBackRest do). Given in both places,
    ``--config`` must name the same file (else exit 2: pgBackRest refuses an option set
    twice), ``--debug`` holds if either place has it, and ``-v``/``-q`` add up."""
    return [
        click.Option(["--config"], metavar="PATH", multiple=True, expose_value=False,
                     callback=_config_given,
                     help="Config file (default: $ZBAK_CONFIG, then /etc/zbak/zbak.toml)."),
        click.Option(["--debug"], is_flag=True, expose_value=False, callback=_debug_given,
                     help="Log every command run (never secrets); tracebacks of internal errors."),
        click.Option(["-v", "--verbose"], count=True, expose_value=False,
                     callback=_verbosity_given, help="One log level more: -v from INFO to DEBUG."),
        click.Option(["-q", "--quiet"], count=True, expose_value=False,
                     callback=_verbosity_given,
                     help="One log level less and no progress bar: -q warnings and errors, -qq"
                          " errors only."),
    ]


_GIVEN: weakref.WeakSet[click.Command] = weakref.WeakSet()
"""The commands that have the global options already."""


def add_global_options(command: click.Command) -> click.Command:
    """Give ``command`` and the commands below it (a group's own ``commands``) the global
    options, once; returns ``command``."""
    if command not in _GIVEN:
        command.params.extend(global_options())
        _GIVEN.add(command)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            add_global_options(sub)
    return command


class FiniteFloat(click.FloatRange):
    """``click.FloatRange`` that also refuses ``nan`` and ``inf``
    (docs/decisions.md#bad-input-is-one-line-and-its-exit-code: every comparison with nan is false,
    so a plain range lets it through)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if number is not None and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class FilePath(click.Path):
    """``click.Path(dir_okay=False, path_type=Path)`` that refuses a NUL byte first (click
    would ``os.stat`` it and raise ValueError) and an empty value (no file has that name)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and "\x00" in value:
            self.fail("a path cannot hold a NUL byte.", param, ctx)
        if value == "":
            self.fail("a path cannot be empty.", param, ctx)
        return super().convert(value, param, ctx)


def json_option(func: F) -> F:
    """Add ``--json`` (machine output) to a command."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(func)


def identity_option(lead: str = "The") -> Callable[[F], F]:
    """Add ``--identity FILE`` (the age identity that opens a sealed store's volumes) to a
    command; ``lead`` starts its help (e.g. "With --deep, the")."""
    return click.option(
        "--identity", type=FilePath(), metavar="FILE",
        help=f"{lead} age identity that decrypts a sealed store's volumes (default: the"
             " store's [stores.NAME.age] identity_file).")


def emit_json(data: Any) -> None:
    """Print ``data`` as JSON (datetimes as ISO 8601 UTC): indented on a terminal, else on
    one line, as httpie does (``json`` indents only in pure Python, three times slower:
    1 s more for the plan of 100,000 streams,
    docs/decisions.md#catalog-commands-stay-fast-at-100000-streams). Off a terminal, lists (and
    iterators standing for lists) are written element by element, so an iterator of
    100,000 rows is never held as a whole, nor is its text."""
    if sys.stdout.isatty():
        click.echo(json.dumps(_listed(data), indent=2, default=_json_default))
        return
    out = sys.stdout
    for chunk in _json_chunks(data):
        out.write(chunk)
    out.write("\n")
    out.flush()


_PLAIN = frozenset({str, int, float, bool, type(None)})
"""Types ``_listed`` passes through without a look inside: most values of a row, so the
check is one set look-up (``zbak list streams --json`` of 100,000 streams: 2.2 million
values, 1 s of CPU less)."""


def _listed(data: Any) -> Any:
    """``data`` with its iterators (at any depth of dicts and lists) made lists."""
    if isinstance(data, dict):
        return {key: value if type(value) in _PLAIN else _listed(value)
                for key, value in data.items()}
    if isinstance(data, (list, tuple)) or _is_iterator(data):
        return [value if type(value) in _PLAIN else _listed(value) for value in data]
    return data


def _is_iterator(value: Any) -> bool:
    return hasattr(value, "__next__")


def _json_chunks(data: Any) -> Iterator[str]:
    """Compact JSON text of ``data`` in pieces: dicts and lists (or iterators) piece by
    piece, everything else through ``json.dumps`` (its C encoder)."""
    if isinstance(data, dict):
        yield "{"
        for n, (key, value) in enumerate(data.items()):
            yield ("," if n else "") + json.dumps(str(key)) + ":"
            yield from _json_chunks(value)
        yield "}"
    elif isinstance(data, (list, tuple)) or _is_iterator(data):
        yield "["
        for n, value in enumerate(data):
            if n:
                yield ","
            if isinstance(value, (dict, list, tuple)) or _is_iterator(value):
                yield json.dumps(_listed(value), default=_json_default)
            else:
                yield json.dumps(value, default=_json_default)
        yield "]"
    else:
        yield json.dumps(data, default=_json_default)


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def emit_lines(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Every row on one line, columns separated by two spaces and padded to the widest
    value (``--all``: rich needs minutes for 100,000 rows; these lines are also what grep
    and sort want). Values are printed with control characters escaped."""
    text = [[printable("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in text]) for i, c in enumerate(columns)]
    last = len(columns) - 1

    def line(values: Sequence[str]) -> str:
        return "  ".join(v if i == last else v.ljust(widths[i])
                         for i, v in enumerate(values)).rstrip()

    click.echo(line(list(columns)))
    if text:
        click.echo("\n".join(line(r) for r in text))


def emit_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a table: on a terminal with rich, boxed and fitted to the width; off one (a
    pipe, a file, cron mail) the title, then plain columns at their natural width, two
    spaces apart (widths counted in characters), with no trailing blanks and no folded
    cells, so each row is one line for grep and awk (``emit_lines``; rich is not
    imported there: 15 ms of every cron run's start-up, and it folded a title wider than
    the table).

    Cells are ``None`` (shown empty) or anything ``str()`` turns into text. Title and cells are
    never read as rich markup (``[local]`` stays, ``[/x]`` cannot raise MarkupError), and
    their control characters are escaped (``printable``).
    """
    if not sys.stdout.isatty():
        click.echo(printable(title))
        emit_lines(columns, rows)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(printable(title)), title_justify="left", show_lines=False)
    for column in columns:
        table.add_column(Text(column), overflow="fold")
    for row in rows:
        table.add_row(*(Text("" if v is None else printable(str(v))) for v in row))
    Console().print(table)


def for_each_job(jobs: Iterable[tuple[str, JobConfig]], action: Callable[[str, JobConfig], T]
                 ) -> tuple[list[T], ExitStatus]:
    """Run ``action(name, job)`` for every job, continuing past failures.

    Each failure is printed with the job's name. Returns the results of the jobs that
    succeeded and the exit status: OK, LOCKED when the only problems were locks, else the
    most severe failure's status.
    """
    results: list[T] = []
    failures: list[ExitStatus] = []
    for name, job in jobs:
        try:
            results.append(action(name, job))
        except ZbakError as exc:
            click.echo(printable(f"zbak: job {name}: {exc}"), err=True)
            failures.append(exc.exit_status)
    serious = [s for s in failures if s != ExitStatus.LOCKED]
    if serious:
        return results, serious[0]
    return results, ExitStatus.LOCKED if failures else ExitStatus.OK


_SECRET_OPTION = re.compile(
    r"^--?[a-z0-9-]*(secret|password|passwd|passphrase|token|credential|access-key|api-key"
    r"|private-key)", re.IGNORECASE)
SECRET_OPTION_HINT = (
    "secrets are never taken on the command line (argv is visible to every user in ps and "
    "/proc): S3 keys come from the standard AWS chain (AWS_* environment, ~/.aws/credentials "
    "with [stores.NAME] profile / prune_profile, instance role); other secrets from the "
    'config as { env = "NAME" } or { file = "/path" }; PostgreSQL passwords from ~/.pgpass '
    "or PGPASSWORD"
)


def refuse_secret_options(argv: Sequence[str]) -> None:
    """Refuse a secret-looking option (``--s3-secret-key``, ``--password=...``) before parsing.

    zbak has no such option; refusing it by name, with a hint, tells the user where secrets
    go instead of click's bare "No such option" (docs/reliability.md#r39-no-secrets-in-argv,
    pgBackRest's secure options). Words after ``--`` are operands and are not looked at.

    Raises:
        UsageError: an option name in ``argv`` looks like a secret (exit 2); the message names
            the option, never its value.
    """
    from zrepl_py.errors import UsageError

    for word in argv:
        if word == "--":
            return
        if word.startswith("-") and _SECRET_OPTION.match(word):
            name = word.split("=", 1)[0]
            raise UsageError(f"refusing option {name}: {SECRET_OPTION_HINT}")
