"""``--json`` output (``cli.common.emit_json``): iterators at any depth written as lists,
times as ISO 8601, the same document whether printed for a terminal (indented) or a pipe
(piece by piece)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from zrepl_py.cli import common

NOON = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)
EXPECTED = [{"job": "main", "id": 1, "host": None, "ratio": 0.5, "whole": True,
             "at": "2026-11-25T12:00:00+00:00", "keys": ["a", "b"],
             "nested": {"ids": [3, 4], "pairs": [[5, 6]]}}]


def rows():
    return iter([{"job": "main", "id": 1, "host": None, "ratio": 0.5, "whole": True,
                  "at": NOON, "keys": iter(["a", "b"]),
                  "nested": {"ids": iter([3, 4]), "pairs": (iter([5, 6]),)}}])


def test_rows_with_iterators_at_any_depth_print_as_lists_to_a_pipe(capsys):
    common.emit_json(rows())
    assert json.loads(capsys.readouterr().out) == EXPECTED


def test_rows_with_iterators_at_any_depth_print_as_lists_on_a_terminal(capsys, monkeypatch):
    # A terminal, no fault (docs/reliability.md#in-process-hooks-kept).
    monkeypatch.setattr(common.sys.stdout, "isatty", lambda: True, raising=False)
    common.emit_json(rows())
    out = capsys.readouterr().out
    assert json.loads(out) == EXPECTED
    assert "\n  " in out  # indented for a reader


@pytest.mark.parametrize("value", ["text", 7, 2.5, False, None])
def test_plain_values_pass_through_unchanged(value):
    assert common._listed({"v": value, "l": [value]}) == {"v": value, "l": [value]}
