"""The protection budget turns old or large held replication bases into warnings (pure)."""

from __future__ import annotations

import datetime as dt

from zrepl_py.config.replicate import ProtectionBudget
from zrepl_py.replication.job import budget_warnings

NOW = dt.datetime(2026, 11, 21, 12, tzinfo=dt.UTC)


def held(days_old: float, used: int, name: str = "tank/a@s"):
    return (name, NOW - dt.timedelta(days=days_old), used)


def test_no_budget_means_no_warning_however_old_or_large():
    assert budget_warnings(ProtectionBudget(), [held(400, 10**15)], NOW) == []


def test_a_base_older_than_max_age_warns_and_names_it():
    budget = ProtectionBudget(max_age="14d")
    (warning,) = budget_warnings(budget, [held(15, 1, "tank/a@old"), held(1, 1)], NOW)
    assert "tank/a@old" in warning and "offline" in warning


def test_held_bytes_are_summed_across_bases_against_max_bytes():
    budget = ProtectionBudget(max_bytes="1GiB")
    assert budget_warnings(budget, [held(1, 2**29), held(1, 2**29)], NOW) == []
    (warning,) = budget_warnings(budget, [held(1, 2**29), held(1, 2**29 + 1)], NOW)
    assert str(2**30 + 1) in warning
