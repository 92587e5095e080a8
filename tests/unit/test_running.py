"""Running-transfer files (``zrepl_py.observe.transfers``): written atomically and throttled by the
process moving the bytes, removed when it ends, and dropped as stale by ``zbak status`` when
their process is gone or their PID belongs to another process."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import subprocess
import sys

from zrepl_py.observe.progress import Estimate
from zrepl_py.observe.transfers import (
    Publisher,
    Queue,
    QueuedRun,
    RunningTransfer,
    Slot,
    process_gone,
    process_start,
    read_queues,
    read_running,
)

UTC = dt.UTC
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def record(pid: int, pid_start: int | None, **over) -> RunningTransfer:
    fields = dict(kind="replicate", job="j", where="local:bak/r", dataset="src/d",
                  from_snapshot="a", to_snapshot="b", bytes=10, expected_bytes=None, rate=None,
                  eta_seconds=None, started_at=T0, updated_at=T0, pid=pid, pid_start=pid_start)
    fields.update(over)
    return RunningTransfer(**fields)


def plant(state_dir, rec: RunningTransfer) -> Slot:
    slot = Slot(state_dir, rec.kind, rec.job, rec.where)
    slot.path.parent.mkdir(parents=True, exist_ok=True)
    slot.path.write_bytes(rec.to_json())
    return slot


def exited_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_file_whose_process_has_exited_is_dropped_reported_stale_and_removed(tmp_path):
    gone = plant(tmp_path, record(exited_pid(), 12345, job="dead"))
    mine = plant(tmp_path, record(os.getpid(), process_start(os.getpid()), job="alive"))

    live, stale = read_running(tmp_path)

    assert [r.job for r in live] == ["alive"]
    (dropped,) = stale
    assert dropped.path == str(gone.path) and "is gone" in dropped.reason
    assert dropped.transfer is not None and dropped.transfer.job == "dead"
    assert not gone.path.exists() and mine.path.exists()
    assert read_running(tmp_path) == (live, []), "reported once: the file is gone"


def test_a_pid_now_held_by_another_process_is_stale_not_shown(tmp_path):
    # Same PID, another start time: the PID was reused by a process that is not the writer.
    plant(tmp_path, record(os.getpid(), process_start(os.getpid()) + 1))
    live, (dropped,) = read_running(tmp_path)
    assert live == [] and "another process" in dropped.reason
    assert process_gone(os.getpid(), process_start(os.getpid())) is None


def test_an_unreadable_file_is_stale_and_a_half_written_temporary_is_ignored(tmp_path):
    directory = tmp_path / "running"
    directory.mkdir()
    (directory / "replicate-j-x.json").write_text("{not json")
    (directory / ".replicate-j-y.json.77.tmp").write_text("{")
    live, (dropped,) = read_running(tmp_path, remove_stale=False)
    assert live == [] and dropped.transfer is None and "unreadable" in dropped.reason
    assert (directory / "replicate-j-x.json").exists(), "remove_stale=False keeps it"
    assert read_running(tmp_path / "nothing-here") == ([], [])


def test_a_publisher_writes_at_once_then_at_most_once_per_interval_and_removes_on_close(tmp_path):
    slot = Slot(tmp_path, "archive", "j", "cold")
    clock = iter(T0 + dt.timedelta(seconds=s) for s in range(100))
    with Publisher(slot, dataset="src/d", to_snapshot="s1", total=100, every=3600,
                   clock=lambda: next(clock)) as pub:
        first = RunningTransfer.from_json(slot.path.read_bytes())
        assert first == dataclasses.replace(pub.record)
        assert (first.bytes, first.expected_bytes, first.from_snapshot) == (0, 100, None)
        assert first.started_at == T0 and first.pid == os.getpid()
        pub.update(Estimate(40, 2.0, 20.0, 3.0, 100))
        assert RunningTransfer.from_json(slot.path.read_bytes()).bytes == 0, "throttled"
        assert pub.record.bytes == 40 and pub.record.eta_seconds == 3.0
        pub.every = 0
        pub.update(Estimate(60, 3.0, 20.0, 2.0, 100))
        written = RunningTransfer.from_json(slot.path.read_bytes())
        assert (written.bytes, written.rate, written.eta_seconds) == (60, 20.0, 2.0)
        assert written.updated_at > written.started_at
        assert [p.name for p in slot.path.parent.iterdir()] == [slot.path.name], "no temporaries"
        assert oct(slot.path.stat().st_mode & 0o777) == "0o600"
    assert not slot.path.exists()
    pub.update(Estimate(70, 4.0, 20.0, 1.0, 100))
    assert not slot.path.exists(), "no update after close brings the file back"


def test_an_unmeasured_transfer_publishes_unknown_bytes(tmp_path):
    slot = Slot(tmp_path, "replicate", "j", "local:/srv/copy")
    with slot.publisher(dataset="src/d", to_snapshot="s1", measured=False):
        (shown,), _ = read_running(tmp_path)
        assert shown.bytes is None and shown.expected_bytes is None


def test_a_publisher_that_cannot_write_warns_once_and_the_transfer_goes_on(tmp_path, caplog):
    (tmp_path / "running").write_text("a file where the directory should be")
    with caplog.at_level(logging.WARNING):
        pub = Publisher(Slot(tmp_path, "replicate", "j", "t"), dataset="d")
        pub.every = 0
        pub.update(Estimate(1, 1.0, None, None, None))
        pub.close()
    assert len([r for r in caplog.records if "cannot publish" in r.getMessage()]) == 1


def test_slot_file_names_encode_target_strings_and_stay_under_name_max(tmp_path):
    slot = Slot(tmp_path, "replicate", "nightly", "backup:pool/replica dir")
    assert slot.path == tmp_path / "running" / "replicate-nightly-backup%3Apool%2Freplica%20dir.json"
    other = Slot(tmp_path, "replicate", "nightly", "backup:pool/replica_dir")
    assert other.path != slot.path
    long = Slot(tmp_path, "restore", "j", "p/" + "x" * 400)
    assert len(long.path.name) <= 210 and long.path != Slot(tmp_path, "restore", "j", "p/" + "x" * 401).path


def test_a_record_of_an_older_zbak_reads_and_a_new_one_carries_the_estimates_source_and_limit(
        tmp_path):
    """Fields added to the format later are optional to the reader (docs/design.md#running-transfers)."""
    old = json.loads(record(os.getpid(), process_start(os.getpid())).to_json())
    del old["expected_source"], old["rate_limit"]
    slot = Slot(tmp_path, "replicate", "j", "local:bak/r")
    slot.path.parent.mkdir(parents=True)
    slot.path.write_bytes(json.dumps(old).encode())
    (shown,), stale = read_running(tmp_path)
    assert stale == [] and (shown.expected_source, shown.rate_limit) == (None, None)
    limit = [5_000_000]
    with Publisher(Slot(tmp_path, "archive", "j", "cold"), dataset="src/d", total=100,
                   expected_source="send -nP", limit=lambda: limit[0], every=0) as pub:
        limit[0] = 2_000_000  # a timetable's boundary: the next write carries it
        pub.update(Estimate(10, 1.0, 10.0, 9.0, 100))
        written = RunningTransfer.from_json(pub.path.read_bytes())
        assert (written.expected_source, written.rate_limit) == ("send -nP", 2_000_000)


def test_a_runs_queue_is_published_as_datasets_start_and_end_and_removed_at_its_end(tmp_path):
    slot = Slot(tmp_path, "replicate", "j", "local:bak/r", "src/d")
    names = ["src/d", "src/d/a", "src/d/b"]
    with Queue(slot, names, limit=lambda: 1000) as queue:
        assert slot.queue_path.parent.name == "queues" and "src" not in slot.queue_path.name

        def shown() -> QueuedRun:
            (found,) = read_queues(tmp_path)
            return found

        assert (shown().queued, shown().waiting, shown().running, shown().done) == (names, 3, 0, 0)
        queue.started("src/d")
        queue.started("src/d/a")
        assert (shown().queued, shown().running) == (["src/d/b"], 2)
        queue.ended("src/d")
        assert (shown().waiting, shown().running, shown().done, shown().rate_limit) == (
            1, 1, 1, 1000)
        assert read_running(tmp_path) == ([], []), "a queue is never taken for a transfer"
    assert read_queues(tmp_path) == [] and not slot.queue_path.exists()


def test_a_queue_left_by_a_dead_process_is_dropped(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    slot = Slot(tmp_path, "archive", "j", "cold")
    slot.queue_path.parent.mkdir(parents=True)
    slot.queue_path.write_bytes(QueuedRun("archive", "j", "cold", ["d"], 1, 0, 0, None, T0, T0,
                                          dead.pid, None).to_json())
    assert read_queues(tmp_path) == [] and not slot.queue_path.exists()
