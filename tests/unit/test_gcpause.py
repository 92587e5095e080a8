"""The cyclic collector during start-up (``runtime.gcpause``): off from the console entry point
until the command has loaded its modules, then on again for the command's work."""

from __future__ import annotations

import gc

import pytest

from zrepl_py.runtime import gcpause


@pytest.fixture
def collector():
    """Restore the collector's state and the frozen objects after the test."""
    was = gc.isenabled()
    yield
    gcpause._starting = False
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


def test_a_start_up_turns_the_collector_off_until_it_ends_then_freezes_what_it_made(collector):
    gc.enable()
    gcpause.begin_startup()
    assert not gc.isenabled()
    made = [object() for _ in range(10)], {"a": []}
    gcpause.end_startup()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
    assert made


def test_ending_a_start_up_twice_or_without_one_changes_nothing(collector):
    gc.enable()
    gcpause.end_startup()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gcpause.begin_startup()
    gcpause.end_startup()
    gc.disable()  # someone turned it off on purpose after the start-up
    gcpause.end_startup()
    assert not gc.isenabled()


def test_a_collector_already_off_stays_off_after_the_start_up(collector):
    gc.disable()
    gcpause.begin_startup()
    gcpause.end_startup()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0
