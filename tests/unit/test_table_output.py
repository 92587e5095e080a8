"""Tables (``cli.common.emit_table``): off a terminal, the title and then one line per row,
columns two spaces apart at their natural width, without rich (whose absence
tests/integration/test_startup_imports.py checks); on a terminal, rich's box."""

from __future__ import annotations

import sys

from zrepl_py.cli import common


def test_off_a_terminal_each_row_is_one_plain_line_under_the_title(capsys):
    common.emit_table("snapshots taken", ["job", "snapshot", "datasets"],
                      [("one", "zbak_20261126T000000Z", 1), ("two-long-name", None, 12)])
    assert capsys.readouterr().out.splitlines() == [
        "snapshots taken",
        "job            snapshot               datasets",
        "one            zbak_20261126T000000Z  1",
        "two-long-name                         12",
    ]


def test_a_title_wider_than_the_table_stays_on_one_line(capsys):
    """rich laid the title out at the table's width, so this one came out in eleven pieces."""
    common.emit_table("a much longer title than the table is wide", ["a", "b"], [("x", "y")])
    assert capsys.readouterr().out.splitlines() == [
        "a much longer title than the table is wide", "a  b", "x  y"]


def test_cells_are_never_markup_and_control_characters_are_escaped(capsys):
    common.emit_table("[bold]t[/]", ["col [x]", "b"], [("a\tb\x1b[31m", "[/red]")])
    assert capsys.readouterr().out.splitlines() == [
        "[bold]t[/]", "col [x]       b", "a\\tb\\x1b[31m  [/red]"]


def test_a_table_without_rows_prints_its_title_and_header(capsys):
    common.emit_table("nothing", ["a", "b"], [])
    assert capsys.readouterr().out.splitlines() == ["nothing", "a  b"]


def test_on_a_terminal_rich_draws_the_box(capsys, monkeypatch):
    # A terminal, no fault (docs/reliability.md#in-process-hooks-kept).
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    common.emit_table("t", ["a"], [("x",)])
    out = capsys.readouterr().out
    assert "x" in out and any(ch in out for ch in "┃│|")
