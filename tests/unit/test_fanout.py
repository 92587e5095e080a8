"""Running a tree's datasets a few at once: who waits for whom, how many run, what is settled
when, and what stops (``runtime.fanout``, ``replication.order``)."""

from __future__ import annotations

import threading

import pytest

from zrepl_py.replication.order import MOST_OVER_SSH, default_concurrency, prerequisites
from zrepl_py.runtime.fanout import fan_out
from zrepl_py.zfs.names import DatasetName

D = DatasetName


class Recorder:
    """Work that records what ran at once, gated by events the test opens."""

    def __init__(self, keys, *, fail=()):
        self.lock = threading.Lock()
        self.running: set = set()
        self.most = 0
        self.order: list = []
        self.gates = {key: threading.Event() for key in keys}
        self.fail = set(fail)

    def __call__(self, key):
        with self.lock:
            self.running.add(key)
            self.most = max(self.most, len(self.running))
            self.order.append(key)
        self.gates[key].wait(10)
        with self.lock:
            self.running.discard(key)
        if key in self.fail:
            raise RuntimeError(f"{key} failed")
        return key.upper()


def open_all(recorder):
    for gate in recorder.gates.values():
        gate.set()


def test_no_more_than_the_concurrency_run_at_once_and_every_key_runs_once():
    keys = [f"k{i}" for i in range(20)]
    work = Recorder(keys)
    settled = []
    # Each key's gate opens once three are running or the rest are queued behind them.
    opener = threading.Thread(target=lambda: [g.set() for g in work.gates.values()])
    opener.start()
    left = fan_out(keys, work, after={}, concurrency=3, settle=settled.extend,
                   stop=lambda item: False)
    opener.join()
    assert left == []
    assert work.most <= 3
    assert sorted(work.order) == sorted(keys)
    assert sorted(item.key for item in settled) == sorted(keys)
    assert all(item.result == item.key.upper() and item.error is None for item in settled)


def test_a_key_starts_only_after_the_key_it_waits_for_has_finished():
    keys = ["root", "a", "b", "c"]
    work = Recorder(keys)
    seen_when_a_started = []

    def watch(key):
        if key in ("a", "b"):
            seen_when_a_started.append(set(work.order))
        return work(key)

    open_all(work)
    fan_out(keys, watch, after={"a": "root", "b": "root"}, concurrency=4, settle=lambda b: None,
            stop=lambda item: False)
    assert work.order[0] in ("root", "c")
    assert all("root" in seen for seen in seen_when_a_started)
    assert work.order.index("root") < work.order.index("a")
    assert work.order.index("root") < work.order.index("b")


def test_settle_runs_in_the_callers_thread_with_every_piece_finished_since_its_last_call():
    keys = ["a", "b", "c", "d"]
    threads = set()
    batches = []

    def settle(batch):
        threads.add(threading.get_ident())
        batches.append([item.key for item in batch])

    fan_out(keys, str.upper, after={}, concurrency=4, settle=settle, stop=lambda item: False)
    assert threads == {threading.get_ident()}
    assert sorted(k for batch in batches for k in batch) == keys
    assert all(batch == sorted(batch, key=keys.index) for batch in batches)



def test_idle_is_set_for_the_batches_settled_once_no_piece_runs_any_more():
    """The first piece's batch settles while the second still runs (idle unset); the
    second's batch comes once nothing runs any more (idle set)."""
    second_may_end = threading.Event()
    idle = threading.Event()
    seen = []

    def work(key):
        if key == "b":
            second_may_end.wait(10)
        return key

    def settle(batch):
        seen.append(([item.key for item in batch], idle.is_set()))
        second_may_end.set()

    fan_out(["a", "b"], work, after={}, concurrency=2, settle=settle, stop=lambda item: False,
            idle=idle)
    assert seen == [(["a"], False), (["b"], True)]

def test_after_a_stop_nothing_new_starts_running_work_finishes_and_the_rest_is_returned():
    keys = [f"k{i}" for i in range(10)]
    work = Recorder(keys, fail={"k0"})
    settled = []

    def run(key):
        if key == "k1":
            work.gates["k0"].set()  # k0 fails only once k1 runs beside it
        return work(key)

    def settle(batch):
        settled.extend(batch)
        work.gates["k1"].set()  # k1 was running when k0 failed: it finishes and is settled

    left = fan_out(keys, run, after={}, concurrency=2, settle=settle,
                   stop=lambda item: item.error is not None)
    failed = [item for item in settled if item.error is not None]
    assert [item.key for item in failed] == ["k0"] and "k0 failed" in str(failed[0].error)
    assert {item.key for item in settled} == {"k0", "k1"}
    assert left == keys[2:]


def test_a_key_waiting_for_one_never_started_is_returned_not_run():
    keys = ["a", "b", "c"]
    work = Recorder(keys, fail={"a"})
    open_all(work)
    left = fan_out(keys, work, after={"c": "b", "b": "a"}, concurrency=1,
                   settle=lambda batch: None, stop=lambda item: item.error is not None)
    assert work.order == ["a"] and left == ["b", "c"]


def test_a_settle_that_raises_cancels_the_workers_waits_for_them_and_propagates():
    keys = [f"k{i}" for i in range(6)]
    cancel = threading.Event()
    finished = []

    def work(key):
        if key != "k0":
            cancel.wait(10)  # a transfer stops when the run is cancelled
        finished.append(key)
        return key

    def settle(batch):
        raise OSError("catalog gone")

    with pytest.raises(OSError, match="catalog gone"):
        fan_out(keys, work, after={}, concurrency=3, settle=settle, stop=lambda item: False,
                cancel=cancel)
    assert cancel.is_set()
    # every piece that was running was waited for; k0's worker may have taken k3 before
    # settle raised (workers do not wait for settle), nothing started after it
    assert {"k0", "k1", "k2"} <= set(finished) <= {"k0", "k1", "k2", "k3"}


def test_a_concurrency_below_one_is_refused():
    with pytest.raises(ValueError):
        fan_out(["a"], str, after={}, concurrency=0, settle=lambda b: None, stop=lambda i: False)


def test_a_new_child_waits_for_its_nearest_covered_ancestor_unless_that_is_on_the_target():
    covered = [D("tank/r"), D("tank/r/a"), D("tank/r/a/x"), D("tank/r/b/y"), D("tank/r/c")]
    # Nothing on the target yet: each waits for the nearest covered dataset above it
    # (tank/r/b is not covered: tank/r/b/y waits for tank/r; its parent is created empty).
    assert prerequisites(covered, set()) == {
        D("tank/r"): None, D("tank/r/a"): D("tank/r"), D("tank/r/a/x"): D("tank/r/a"),
        D("tank/r/b/y"): D("tank/r"), D("tank/r/c"): D("tank/r")}
    # The root and tank/r/a are replicas already: only tank/r/a/x's parent exists; nothing
    # waits, since no dataset needs one that is still to be created.
    present = {D("tank/r"), D("tank/r/a")}
    assert set(prerequisites(covered, present).values()) == {None}
    # A child that exists on the target never waits, whatever its parent's state.
    assert prerequisites([D("tank/r"), D("tank/r/a")], {D("tank/r/a")})[D("tank/r/a")] is None


def test_the_default_concurrency_is_four_per_cpu_between_two_and_the_ssh_session_bound():
    assert default_concurrency(None) == 4
    assert default_concurrency(1) == 4
    assert default_concurrency(2) == MOST_OVER_SSH == 8
    assert default_concurrency(64) == 8
