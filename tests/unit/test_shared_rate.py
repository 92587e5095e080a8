"""One bandwidth limit shared by the pipelines running at once (``proc.ratelimit``)."""

from __future__ import annotations

import datetime as dt
import subprocess
import threading
import time

import pytest
from support.common import need_binary

from zrepl_py.clock import FixedClock
from zrepl_py.proc.ratelimit import RETRIES, UNLIMITED, SharedRate, remote_control
from zrepl_py.replication.bandwidth import follow
from zrepl_py.values.timetable import parse_timetable


class Pvs:
    """Fake pv processes: the rate each runs at, every message in order, the most they ever
    ran at together; some never answer, some miss their next few messages (a loaded host:
    ``misses[pid]``, how many)."""

    def __init__(self, deaf=()):
        self.rates: dict[int, int] = {}
        self.told: list[tuple[int, int]] = []
        self.deaf = set(deaf)
        self.misses: dict[int, int] = {}
        self.peak = 0

    def start(self, shared: SharedRate, pid: int):
        lease = shared.lease()
        self.rates[pid] = int(lease.argv[-1])  # the pv starts
        self.peak = max(self.peak, sum(self.rates.values()))
        lease.started(pid)
        return lease

    def end(self, lease, pid: int) -> None:
        del self.rates[pid]  # the pv is gone
        lease.close()

    def tell(self, pid: int, rate: int) -> bool:
        self.told.append((pid, rate))
        if pid in self.deaf or pid not in self.rates:
            return False
        if self.misses.get(pid):
            self.misses[pid] -= 1
            return False
        self.rates[pid] = rate
        self.peak = max(self.peak, sum(self.rates.values()))
        return True


def _until(condition, seconds=10) -> bool:
    """Wait until ``condition()`` holds, at most ``seconds``; whether it does."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def test_each_pipeline_starts_at_the_total_over_the_concurrency_and_gets_an_equal_share():
    pvs = Pvs()
    shared = SharedRate(1200, 4, tell=pvs.tell, raise_after=0)
    first = pvs.start(shared, 1)
    assert first.argv == ("pv", "-q", "-C", "-L", "300")
    assert pvs.rates == {1: 1200}, "alone, a pipeline gets the whole limit"
    second = pvs.start(shared, 2)
    pvs.start(shared, 3)
    assert pvs.rates == {1: 400, 2: 400, 3: 400}
    pvs.end(second, 2)
    assert pvs.rates == {1: 600, 3: 600}
    pvs.end(first, 1)
    assert pvs.rates == {3: 1200}


def test_the_running_pipelines_never_pass_the_limit_not_even_between_two_messages():
    pvs = Pvs()
    shared = SharedRate(1000, 4, tell=pvs.tell, raise_after=0)
    leases = {pid: pvs.start(shared, pid) for pid in (1, 2)}
    assert pvs.told == [(1, 1000), (1, 500), (2, 500)], "the running one is lowered first"
    leases.update({pid: pvs.start(shared, pid) for pid in (3, 4)})
    for pid in (1, 3, 2):
        pvs.end(leases[pid], pid)
    assert pvs.rates == {4: 1000}
    assert pvs.peak <= 1000


def test_a_pipeline_that_misses_the_message_keeps_its_rate_and_nobody_is_raised_past_the_limit():
    pvs = Pvs(deaf={1})
    shared = SharedRate(1000, 2, tell=pvs.tell, raise_after=0)
    first = pvs.start(shared, 1)  # starts at 500 and is never raised: it does not answer
    assert pvs.rates[1] == 500
    pvs.start(shared, 2)
    pvs.end(first, 1)
    assert pvs.rates == {2: 1000} and pvs.peak <= 1000


def test_a_pipeline_that_never_started_gives_its_part_back():
    pvs = Pvs()
    shared = SharedRate(1000, 2, tell=pvs.tell, raise_after=0)
    pvs.start(shared, 1)
    unused = shared.lease()  # its pipeline failed to start
    assert pvs.rates == {1: 500}
    unused.close()
    assert pvs.rates == {1: 1000}


def test_a_pipeline_that_ends_as_the_next_one_starts_costs_no_message():
    """A tree at full concurrency: each worker takes the next dataset's lease as soon as
    its pipeline ended. The others are raised only a moment later, by then the share is
    the same again: no message at all once the run is under way."""
    pvs = Pvs()
    shared = SharedRate(1000, 4, tell=pvs.tell, raise_after=60)
    leases = {pid: pvs.start(shared, pid) for pid in (1, 2, 3, 4)}
    before = len(pvs.told)
    for pid in range(5, 105):  # the oldest pipeline ends, the next dataset starts
        oldest = min(leases)
        pvs.end(leases.pop(oldest), oldest)
        leases[pid] = pvs.start(shared, pid)
    assert pvs.told[before:] == [], "no pv was raised and lowered again per dataset"
    assert set(pvs.rates.values()) == {250} and pvs.peak <= 1000


def test_the_pipelines_left_are_raised_a_moment_after_one_ended():
    pvs = Pvs()
    shared = SharedRate(1000, 2, tell=pvs.tell, raise_after=0.05)
    first, second = pvs.start(shared, 1), pvs.start(shared, 2)
    pvs.end(second, 2)
    assert pvs.rates == {1: 500}, "not at once"
    deadline = time.monotonic() + 10
    while pvs.rates[1] != 1000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pvs.rates == {1: 1000}
    pvs.end(first, 1)



def test_pipelines_that_end_within_a_moment_of_their_start_are_never_told_anything():
    """A tree of small datasets at concurrency 8: each pipeline ends well before it would be
    raised, so no ``pv -R`` is sent at all (one to a pv that is ending waits for it in vain,
    under the lock every other pipeline needs)."""
    pvs = Pvs()
    shared = SharedRate(8000, 8, tell=pvs.tell, raise_after=60)
    leases = {pid: pvs.start(shared, pid) for pid in range(1, 9)}
    for pid in range(9, 109):
        oldest = min(leases)
        pvs.end(leases.pop(oldest), oldest)
        leases[pid] = pvs.start(shared, pid)
    for pid in list(leases):
        pvs.end(leases.pop(pid), pid)
    assert pvs.told == [] and pvs.peak <= 8000


def test_a_pipeline_still_running_a_moment_after_its_start_is_raised_to_its_share():
    pvs = Pvs()
    shared = SharedRate(1000, 4, tell=pvs.tell, raise_after=0.05)
    first = pvs.start(shared, 1)
    assert pvs.rates == {1: 250}, "not at once"
    deadline = time.monotonic() + 10
    while pvs.rates[1] != 1000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pvs.rates == {1: 1000}
    second = pvs.start(shared, 2)  # lowers the first before it starts
    assert pvs.rates[1] == 500 and pvs.peak <= 1000
    while pvs.rates[2] != 500 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pvs.rates == {1: 500, 2: 500}
    pvs.end(first, 1)
    pvs.end(second, 2)


def test_a_start_timer_lowers_a_pv_that_missed_its_lowering_before_raising_its_own():
    pvs = Pvs()
    shared = SharedRate(1000, 4, tell=pvs.tell, raise_after=0.05)
    first = pvs.start(shared, 1)
    assert _until(lambda: pvs.rates[1] == 1000)
    pvs.misses[1] = 1
    second = pvs.start(shared, 2)  # the first misses its lowering: 1000 + 250 for a moment
    assert pvs.rates == {1: 1000, 2: 250}
    assert _until(lambda: pvs.rates[2] == 500)
    assert pvs.rates == {1: 500, 2: 500} and pvs.peak == 1250
    pvs.end(first, 1)
    pvs.end(second, 2)


def test_a_pipeline_that_misses_its_raise_after_an_end_is_raised_by_a_retry():
    """The last transfer of a run, on a loaded host: its pv misses the raise when the one
    before ended and the first retry; the next retry reaches it."""
    pvs = Pvs()
    shared = SharedRate(1000, 2, tell=pvs.tell, raise_after=0.01, retry_after=0.01)
    first, second = pvs.start(shared, 1), pvs.start(shared, 2)  # 500 each: their share
    pvs.misses[1] = 2
    pvs.end(second, 2)
    assert _until(lambda: pvs.rates[1] == 1000), "left at the share of two"
    assert pvs.told[-3:] == [(1, 1000)] * 3
    pvs.end(first, 1)


def test_a_pipeline_that_misses_its_lowering_is_lowered_by_a_retry_before_anyone_is_raised():
    pvs = Pvs()
    shared = SharedRate(1000, 4, tell=pvs.tell, raise_after=0, retry_after=0.01)
    first = pvs.start(shared, 1)
    assert pvs.rates == {1: 1000}
    pvs.misses[1] = 2  # the lowering before the second starts and the one after it started
    second = pvs.start(shared, 2)
    assert pvs.rates == {1: 1000, 2: 250}
    assert _until(lambda: pvs.rates == {1: 500, 2: 500}), "the first stayed above its share"
    assert pvs.told[-4:] == [(1, 500), (1, 500), (1, 500), (2, 500)] and pvs.peak == 1250
    pvs.end(first, 1)
    pvs.end(second, 2)


def test_a_pv_that_never_answers_is_retried_a_few_times_then_left_at_its_rate():
    pvs = Pvs(deaf={1})
    shared = SharedRate(1000, 2, tell=pvs.tell, raise_after=0.01, retry_after=0.01)
    first = pvs.start(shared, 1)
    _until(lambda: len(pvs.told) > RETRIES, seconds=5)
    time.sleep(2 ** RETRIES * 0.01 * 2)  # twice as long as the next retry would wait
    assert pvs.told == [(1, 1000)] * (1 + RETRIES), "the start timer's raise, then retries"
    assert pvs.rates == {1: 500}
    pvs.end(first, 1)


def test_a_pipeline_that_ended_is_not_retried_and_one_still_running_is():
    pvs = Pvs(deaf={1})
    shared = SharedRate(1000, 4, tell=pvs.tell, raise_after=0, retry_after=0.5)
    first = pvs.start(shared, 1)  # misses its raise: a retry is pending
    pvs.misses[2] = 2  # its raise at its start and the one when the first ended
    second = pvs.start(shared, 2)
    pvs.end(first, 1)
    closed = len(pvs.told)
    assert _until(lambda: pvs.rates[2] == 1000), "the second was not retried"
    time.sleep(1)  # the first's retry has come and gone
    assert 1 not in {pid for pid, _ in pvs.told[closed:]}
    assert [rate for pid, rate in pvs.told if pid == 2] == [500, 1000, 1000]
    pvs.end(second, 2)


def test_a_limit_or_concurrency_that_cannot_be_shared_is_refused():
    with pytest.raises(ValueError):
        SharedRate(0, 2)
    with pytest.raises(ValueError):
        SharedRate(100, 0)


def test_a_running_pv_takes_a_new_rate_from_its_remote_control_and_another_process_does_not():
    need_binary("pv", "pv")
    lease = SharedRate(1_000_000, 2).lease()
    pv = subprocess.Popen(list(lease.argv), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert remote_control(pv.pid, 2000) is True, "pv -R waits until pv read the message"
        assert remote_control(other.pid, 2000) is False
    finally:
        pv.stdin.close()
        pv.wait(10)
        other.kill()
        other.wait()


def test_a_new_total_is_divided_at_once_lowering_before_raising_and_off_is_unlimited():
    """A timetable's boundary (``set_total``, ``replication.bandwidth.follow``): the running pvs get
    the new share at once; "off" gives them ``UNLIMITED`` (``pv -R -L 0`` lifts nothing), and
    a pipeline started while off starts unlimited and is limited by the next window."""
    pvs = Pvs()
    shared = SharedRate(1200, 4, tell=pvs.tell, raise_after=0)
    first, second = pvs.start(shared, 1), pvs.start(shared, 2)
    assert pvs.rates == {1: 600, 2: 600}
    shared.set_total(400)
    assert pvs.rates == {1: 200, 2: 200} and pvs.peak == 1200
    shared.set_total(None)
    assert pvs.rates == {1: UNLIMITED, 2: UNLIMITED}
    third = pvs.start(shared, 3)
    assert third.argv[-1] == str(UNLIMITED)
    pvs.told.clear()
    shared.set_total(900)
    assert pvs.rates == {1: 300, 2: 300, 3: 300}
    assert pvs.told == [(1, 300), (2, 300), (3, 300)]
    shared.set_total(900)
    assert len(pvs.told) == 3, "the same total again sends nothing"
    for lease, pid in ((first, 1), (second, 2), (third, 3)):
        pvs.end(lease, pid)
    with pytest.raises(ValueError):
        shared.set_total(0)


def test_follow_sets_the_total_when_the_clock_crosses_a_boundary():
    """``follow`` reads the clock (an injected one, stepped by the test) and sets the total
    within its reading interval; a constant timetable starts no thread at all."""
    pvs = Pvs()
    clock = FixedClock(dt.datetime(2026, 11, 30, 7, 59, 58, tzinfo=dt.UTC))  # a Monday
    table = parse_timetable({"mon-fri 08:00-18:00": "1M", "default": "8M"})
    shared = SharedRate(table.at(clock.now()).limit, 2, tell=pvs.tell, raise_after=0)
    lease = pvs.start(shared, 1)
    assert pvs.rates == {1: 8 * 10**6}
    with follow(shared, table, clock, every=0.01):
        clock.advance(dt.timedelta(seconds=3))
        deadline = time.monotonic() + 5
        while pvs.rates[1] != 10**6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pvs.rates == {1: 10**6}
        clock.advance(dt.timedelta(hours=10))  # 18:00:01: the default again
        deadline = time.monotonic() + 5
        while pvs.rates[1] != 8 * 10**6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pvs.rates == {1: 8 * 10**6}
    pvs.end(lease, 1)
    before = threading.active_count()
    with follow(shared, parse_timetable("5M"), clock):
        assert threading.active_count() == before
