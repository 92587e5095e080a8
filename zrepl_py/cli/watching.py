"""``zbak status --watch``: refresh ``status.watch`` every ``--interval`` seconds until Ctrl-C.

On a terminal the view is redrawn in place (rich ``Live``, as ``zrepl status`` does); off
one (a pipe, a file) each refresh is printed in full as plain tables after a blank line, so
a log of it reads top to bottom; with ``--json`` each refresh is one JSON document (one line
off a terminal: JSON Lines). Ctrl-C (SIGINT) ends it with exit 0.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from zrepl_py.cli.common import emit_json, emit_table
from zrepl_py.errors import ExitStatus
from zrepl_py.runtime.logsetup import printable

if TYPE_CHECKING:
    from rich.console import Group

    from zrepl_py.invocation.context import Context
    from zrepl_py.status.watch import Section, WatchView


def _renderable(view: WatchView) -> Group:
    """The view as rich tables, one per section, cells never read as markup."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from zrepl_py.status.watch import sections

    tables = []
    for title, columns, rows in sections(view):
        table = Table(title=Text(printable(title)), title_justify="left")
        for column in columns:
            table.add_column(Text(column), overflow="ellipsis", no_wrap=True)
        for row in rows:
            table.add_row(*(Text("" if v is None else printable(str(v))) for v in row))
        if not rows:
            table.caption = "none running"
        tables.append(table)
    return Group(*tables)


def _plain(found: list[Section]) -> None:
    click.echo("")
    for title, columns, rows in found:
        emit_table(title, columns, rows)
    sys.stdout.flush()


def watch(ctx: Context, jobs: Sequence[str], *, interval: float, as_json: bool) -> ExitStatus:
    """Show ``status.watch.gather`` every ``interval`` seconds until interrupted.

    Raises:
        UsageError: an unknown job name.
        CatalogError: the catalog cannot be read.
    """
    from zrepl_py.status.watch import as_json as view_json
    from zrepl_py.status.watch import gather, sections

    pause = threading.Event()  # never set: a wait that Ctrl-C interrupts at once
    try:
        if as_json or not sys.stdout.isatty():
            while True:
                view = gather(ctx, jobs)
                if as_json:
                    emit_json(view_json(view))
                    sys.stdout.flush()
                else:
                    _plain(sections(view))
                pause.wait(interval)
        from rich.live import Live

        with Live(_renderable(gather(ctx, jobs)), auto_refresh=False) as live:
            while True:
                pause.wait(interval)
                live.update(_renderable(gather(ctx, jobs)), refresh=True)
    except KeyboardInterrupt:
        return ExitStatus.OK
