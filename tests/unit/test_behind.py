"""zrepl_py.runtime.behind: work on a stream's chunks in a helper thread, in order, a bounded
number of chunks behind the caller; errors come back to the caller."""

from __future__ import annotations

import threading

import pytest

from zrepl_py.runtime.behind import Behind


def test_the_work_runs_in_submission_order_in_another_thread_and_drain_waits_for_all():
    done: list[tuple[int, str]] = []
    with Behind("t", depth=3) as behind:
        for i in range(50):
            behind.submit(lambda i: done.append((i, threading.current_thread().name)), i)
        behind.drain()
    assert [i for i, _ in done] == list(range(50))
    assert {name for _, name in done} == {"t_0"}


def test_submit_waits_once_depth_calls_are_pending():
    release = threading.Event()
    started = threading.Event()
    submitted: list[int] = []

    def slow(i: int) -> None:
        started.set()
        release.wait(10)

    with Behind("t", depth=2) as behind:
        feeder = threading.Thread(target=lambda: [submitted.append(i) or behind.submit(slow, i)
                                                   for i in range(4)])
        feeder.start()
        started.wait(10)
        feeder.join(0.3)
        assert feeder.is_alive() and submitted == [0, 1, 2]  # the third waits: two pending
        release.set()
        feeder.join(10)
        behind.drain()
    assert submitted == [0, 1, 2, 3]


def test_an_error_is_raised_to_the_caller_and_no_later_work_runs():
    ran: list[int] = []

    def work(i: int) -> None:
        if i == 1:
            raise OSError("disk gone")
        ran.append(i)

    with Behind("t", depth=1) as behind:
        behind.submit(work, 0)
        behind.submit(work, 1)
        with pytest.raises(OSError, match="disk gone"):
            behind.submit(work, 2)
            behind.drain()
    assert ran == [0]


def test_leaving_early_cancels_what_has_not_started_and_waits_for_the_running_call():
    entered, release = threading.Event(), threading.Event()
    finished: list[int] = []

    def work(i: int) -> None:
        if i == 0:
            entered.set()
            release.wait(10)
        finished.append(i)

    with pytest.raises(RuntimeError, match="consumer failed"):
        with Behind("t", depth=3) as behind:
            for i in range(3):
                behind.submit(work, i)
            entered.wait(10)
            threading.Timer(0.2, release.set).start()
            raise RuntimeError("consumer failed")
    assert finished == [0]  # the running call ended before the block was left; 1, 2 never ran


def test_a_depth_below_one_is_refused():
    with pytest.raises(ValueError):
        Behind("t", depth=0)
