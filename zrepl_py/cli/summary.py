"""Long human outputs become a few rows of counts
(docs/decisions.md#long-outputs-become-counts-on-a-terminal).

A table of 100,000 streams takes rich minutes to lay out and nobody reads it: past
:data:`LIMIT` rows a command prints counts per group (action and reason, dataset, state)
instead, says so, and prints every row with ``--all`` (one line per row, columns aligned)
or ``--json``. Imports nothing heavy (every command module imports it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import click

from zrepl_py.cli.common import F, emit_lines, emit_table

LIMIT = 100
"""Rows a table shows in full; past it, the summary (unless ``--all``)."""

_SNAPSHOT = re.compile(r"@[^\s,;()]+")
_PATH = re.compile(r"[^\s,;()'\"]+/[^\s,;()'\"]*")
_NUMBER = re.compile(r"\d+")


def all_option(func: F) -> F:
    """Add ``--all`` (every row, not the summary) to a command."""
    return click.option("--all", "show_all", is_flag=True,
                        help=f"Print every row even past {LIMIT} (one line each) instead of"
                             " counts per group.")(func)


@functools.lru_cache(maxsize=65536)  # 100,000 streams share a few thousand reasons
def reason_kind(reason: str) -> str:
    """``reason`` with its snapshot names, object keys and dataset paths, and numbers
    replaced, so equal reasons of many streams or snapshots count as one: ``within
    keep_chains (2 of 3)`` becomes ``within keep_chains (N of N)``, ``released by the
    verified chain @s9 (stream 41)`` becomes ``released by the verified chain @...
    (stream N)``, ``... missing from store cold: local/tank/a/...`` ends in ``...``."""
    return _NUMBER.sub("N", _PATH.sub("...", _SNAPSHOT.sub("@...", reason)))


def names_or_count(names: Iterable[Hashable]) -> str:
    """Up to three names in full, else ``N (FIRST .. LAST)`` in sorted order (as text)."""
    found = sorted({str(name) for name in names})
    if len(found) <= 3:
        return ", ".join(found)
    return f"{len(found):,} ({found[0]} .. {found[-1]})"


Group = tuple[Any, int, dict[str, set[Hashable]]]
"""``(key, rows, {name: distinct values})``: one group of ``count_by``."""


def count_by(rows: Iterable[Any], key: Callable[[Any], Hashable],
             distinct: dict[str, Callable[[Any], Hashable]]) -> list[Group]:
    """Group ``rows`` by ``key(row)``: ``(key, rows, {name: set of distinct values})`` per
    group, in key order; ``distinct`` names what to collect per group (e.g. datasets)."""
    groups: dict[Hashable, tuple[list[int], dict[str, set[Hashable]]]] = {}
    for row in rows:
        k = key(row)
        if k not in groups:
            groups[k] = ([0], {name: set() for name in distinct})
        count, seen = groups[k]
        count[0] += 1
        for name, value in distinct.items():
            seen[name].add(value(row))
    return [(k, groups[k][0][0], groups[k][1]) for k in sorted(groups, key=_sortable)]


def _sortable(key: Hashable) -> tuple[str, ...]:
    parts = key if isinstance(key, tuple) else (key,)
    return tuple("" if p is None else str(p) for p in parts)


def emit_long(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
              show_all: bool, what: str,
              summary: Callable[[], tuple[Sequence[str], Sequence[Sequence[Any]]]]) -> None:
    """``rows`` as a table while they fit :data:`LIMIT`; past it, with ``show_all`` every
    row as aligned lines, else the table ``summary()`` returns (``(columns, rows)``) under
    a title saying how many ``what`` it counts and how to see them all."""
    if len(rows) <= LIMIT:
        emit_table(title, columns, rows)
        return
    if show_all:
        click.echo(f"{title}: {len(rows):,} {what}")
        emit_lines(columns, rows)
        return
    summary_columns, summary_rows = summary()
    emit_table(f"{title}: {len(rows):,} {what}, counted (--all lists each, --json for"
               " machines)", summary_columns, summary_rows)
