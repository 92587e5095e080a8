"""The executor and stage faults of ``support.executor`` do what their docstrings promise, on
real processes through the real ``run_pipeline`` (a fault that silently does nothing would let
every test built on it pass for nothing)."""

from __future__ import annotations

import hashlib
import os
import time

import pytest
from support.executor import (
    FaultyExecutor,
    RecordingExecutor,
    cut_stage,
    fail_at_end_stage,
    failing_receiver_stage,
    flip_stage,
    garbage_stage,
    stderr_stage,
)

from zrepl_py.errors import CommandFailed, PipelineFailed
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.proc.pipeline import Stage, live_group_members, run_pipeline

MiB = 1 << 20
SENDER = Stage("send", ("head", "-c", str(8 * MiB), "/dev/zero"))


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_recording_executor_records_each_argv_and_runs_it():
    executor = RecordingExecutor(LocalExecutor())
    assert executor.run(["printf", "%s", "a b"]).stdout == b"a b"
    assert executor.calls == [("printf", "%s", "a b")]


def test_a_faulty_executor_answers_selected_commands_without_running_them(tmp_path):
    canary = tmp_path / "ran"
    executor = FaultyExecutor(LocalExecutor(), lambda argv: argv[0] == "touch", returncode=2,
                              stderr="cannot open 'x': dataset does not exist", times=1)
    with pytest.raises(CommandFailed) as failure:
        executor.run(["touch", str(canary)])
    assert failure.value.returncode == 2 and "does not exist" in str(failure.value)
    assert not canary.exists()
    executor.run(["touch", str(canary)])  # times=1: the second one runs for real
    assert canary.exists()
    noisy = FaultyExecutor(LocalExecutor(), lambda argv: True, returncode=None, stderr="extra")
    done = noisy.run(["printf", "ok"])
    assert (done.returncode, done.stdout, done.stderr) == (0, b"ok", b"extra")


def test_a_cut_sender_delivers_exactly_n_bytes_then_fails_as_killed(tmp_path):
    out = tmp_path / "out"
    with open(out, "wb") as sink, pytest.raises(PipelineFailed) as failure:
        run_pipeline([cut_stage(SENDER, 3 * MiB + 5)], stdout=sink.fileno())
    assert out.stat().st_size == 3 * MiB + 5
    assert failure.value.culprit.name == "send" and failure.value.culprit.returncode == 137
    assert "killed head after" in failure.value.culprit.stderr


def test_a_sender_failing_after_its_whole_stream_is_still_a_failure(tmp_path):
    out = tmp_path / "out"
    with open(out, "wb") as sink, pytest.raises(PipelineFailed) as failure:
        run_pipeline([fail_at_end_stage(SENDER, 3, "late failure")], stdout=sink.fileno())
    assert out.stat().st_size == 8 * MiB
    assert failure.value.culprit.returncode == 3 and "late failure" in str(failure.value)


def test_injected_stderr_and_a_flipped_byte_leave_the_exit_status_alone(tmp_path):
    out = tmp_path / "out"
    with open(out, "wb") as sink:
        done = run_pipeline([flip_stage(stderr_stage(SENDER, "noise"), 5 * MiB, 0x10)],
                            stdout=sink.fileno())
    assert "noise" in done.stages[0].stderr
    data = out.read_bytes()
    assert len(data) == 8 * MiB and data[5 * MiB] == 0x10 and data.count(0) == 8 * MiB - 1


def test_a_receiver_failing_while_the_sender_writes_is_blamed_and_nothing_is_left_running():
    """docs/reliability.md#r6-receiver-fails-while-the-sender-is-still-writing with the injected
    receiver: the sender blocked on a full pipe gets EPIPE; the receiver's own message wins; every
    process group is gone."""
    sender = Stage("send", ("cat", "/dev/zero"))
    receiver = failing_receiver_stage(2 * MiB, 1, "cannot receive: out of space")
    started = time.monotonic()
    with pytest.raises(PipelineFailed) as failure:
        run_pipeline([sender, receiver])
    assert time.monotonic() - started < 30  # a stage left running holds it forever
    assert failure.value.culprit.name == "receive"
    assert "out of space" in str(failure.value)
    pids = {s.pid for s in failure.value.stages if s.pid}
    assert live_group_members(pids) == []


def test_a_garbage_sender_is_seeded_and_exact(tmp_path):
    digests = []
    for name in ("a", "b"):
        out = tmp_path / name
        with open(out, "wb") as sink:
            run_pipeline([garbage_stage(MiB + 3, seed=7)], stdout=sink.fileno())
        assert out.stat().st_size == MiB + 3
        digests.append(_sha(out))
    assert digests[0] == digests[1] and os.path.getsize(tmp_path / "a") == MiB + 3
