"""zrepl_py.runtime.prefetch: results computed ahead in a background thread, each taken once."""

from __future__ import annotations

import threading
import time

import pytest

from zrepl_py.errors import HostUnreachable
from zrepl_py.runtime.prefetch import Prefetch


def test_a_prefetched_result_is_taken_once_and_a_second_take_computes_afresh():
    done = threading.Event()

    def first():
        done.set()
        return "prefetched"

    prefetch = Prefetch([("a", first)])
    done.wait(5)
    assert prefetch.take("a", lambda: "fresh") == "prefetched"
    assert prefetch.take("a", lambda: "fresh") == "fresh"


def test_taking_a_result_still_being_computed_waits_for_it_instead_of_computing_twice():
    started, release = threading.Event(), threading.Event()
    calls = []

    def slow():
        started.set()
        release.wait(5)
        calls.append("background")
        return 1

    prefetch = Prefetch([("slow", slow)])
    started.wait(5)
    threading.Timer(0.05, release.set).start()
    assert prefetch.take("slow", lambda: calls.append("here") or 2) == 1
    assert calls == ["background"]


def test_a_task_not_started_yet_is_cancelled_and_computed_by_the_taker():
    release = threading.Event()
    ran = []
    prefetch = Prefetch([("block", lambda: release.wait(5)),
                         ("later", lambda: ran.append("background") or "background")])
    assert prefetch.take("later", lambda: "taker") == "taker"
    release.set()
    prefetch.take("block", lambda: None)
    assert ran == []


def test_the_error_of_a_prefetched_task_is_raised_to_the_taker():
    def unreachable():
        raise HostUnreachable("backup: connection refused")

    prefetch = Prefetch([("host", unreachable)])
    with pytest.raises(HostUnreachable, match="connection refused"):
        prefetch.take("host", lambda: "never used")


def test_close_skips_the_tasks_not_started():
    release = threading.Event()
    ran = []
    prefetch = Prefetch([("block", lambda: release.wait(5)), ("next", lambda: ran.append(1))])
    prefetch.close()
    release.set()
    assert prefetch.take("next", lambda: "computed") == "computed"
    time.sleep(0.2)  # time enough for the thread to reach "next", had it not been skipped
    assert ran == []
