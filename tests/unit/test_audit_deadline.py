"""The ``--max-duration`` budget of a deep audit (``audit.deep.Deadline``,
docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit)."""

from __future__ import annotations

import pytest

from zrepl_py.audit.deep import Deadline


def test_the_budget_always_lets_the_first_stream_start_then_stops_once_spent():
    """docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit: one stream per
    run at least (each run makes progress), none started after the budget is spent."""
    now = [100.0]
    deadline = Deadline(10, monotonic=lambda: now[0])
    now[0] = 500.0
    assert deadline.allows()
    deadline.started += 1
    assert not deadline.allows()
    early = Deadline(10, monotonic=lambda: now[0])
    early.started = 3
    now[0] = 509.9
    assert early.allows()
    now[0] = 510.0
    assert not early.allows()


def test_no_budget_never_stops_and_a_negative_one_is_refused():
    """docs/reliability.md#r24-verify-is-read-only-repair-is-separate-and-explicit: without
    --max-duration every chosen stream is read."""
    unbounded = Deadline(None, monotonic=lambda: 0.0)
    unbounded.started = 10**6
    assert unbounded.allows()
    with pytest.raises(ValueError):
        Deadline(-1)
