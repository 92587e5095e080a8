"""run_pipeline on real processes, then real zfs send | ssh zfs receive on zfs-fuse and sshd.

No mocks: every stage is a real program connected by OS pipes. After each failure the test
checks that every stage was reaped (``os.waitpid(pid, WNOHANG)`` raises ChildProcessError), no
zombie child is left and no live process remains in any stage's process group (read with
``ps``, independently of the module's own check).
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from support.zfs import COMMAND_TIMEOUT

from zrepl_py.errors import (
    DatasetExists,
    DatasetNotFound,
    PipelineCancelled,
    PipelineFailed,
    PipelineTimedOut,
)
from zrepl_py.observe.progress import ProgressReporter
from zrepl_py.proc.openssh import remote_command, remote_pipeline, ssh_argv
from zrepl_py.proc.pipeline import (
    STDERR_TAIL,
    Meter,
    PipelineResult,
    Stage,
    StageResult,
    choose_culprit,
    run_pipeline,
)
from zrepl_py.zfs.errors import classify

MB = 1024 * 1024
PY = sys.executable
STOPS_WITHIN = 30.0
"""Seconds a pipeline that must stop (a stage failed, a cancel, a timeout) may take, on a
loaded host too. What the bound catches is a stage left running: every such test's other
stage runs forever (``yes``, ``cat /dev/zero``) or 60 s, so it would hold the pipeline past
this, up to pytest's timeout. It does not measure speed."""


def py_stage(name: str, code: str) -> Stage:
    """A stage running a short Python program (stand-in for a sender or receiver)."""
    return Stage(name, (PY, "-c", code))


def assert_nothing_left(stages: tuple[StageResult, ...]) -> None:
    """Every stage reaped, no zombie child at all, and no live (non-zombie) process left in
    any stage's process group (the session's sshd and zfs-fuse are children too, so
    ``waitpid(-1)`` would not do)."""
    pgids = {s.pid for s in stages if s.pid is not None}
    for pid in pgids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    listing = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,pgid=,stat=,args="],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    rows = [line.split(None, 4) for line in listing.splitlines()]
    zombie_children = [r for r in rows if int(r[1]) == os.getpid() and r[3].startswith("Z")]
    assert zombie_children == []
    alive = [r for r in rows if int(r[2]) in pgids and not r[3].startswith("Z")]
    assert alive == []


def failure(stages, **kwargs) -> tuple[PipelineFailed, float]:
    """Run a pipeline that must fail; return the error and the seconds it took."""
    started = time.monotonic()
    with pytest.raises(PipelineFailed) as info:
        run_pipeline(stages, **kwargs)
    return info.value, time.monotonic() - started


# --- the culprit rule (pure) ----------------------------------------------------------------


def result(name: str, code: int | None, stderr: str = "", pipe: bool = False, killed=False):
    return StageResult(name, (name,), code, stderr, broken_pipe=pipe, killed=killed)


@pytest.mark.parametrize(
    ("stages", "culprit"),
    [
        # the receiver's own failure wins over the sender's broken pipe
        ([result("send", 1, "Broken pipe", pipe=True), result("recv", 1)], "recv"),
        # a sender failing first wins over a receiver that then failed on the short stream
        ([result("send", 1), result("recv", 1)], "send"),
        # stages stopped by zbak are not to blame
        ([result("send", -15, killed=True), result("mid", 1), result("recv", -15, killed=True)],
         "mid"),
        # nothing failed on its own: the most downstream failure
        ([result("send", -13, pipe=True), result("mid", 141, pipe=True), result("recv", 0)],
         "mid"),
        # only stopped stages failed: the most downstream one
        ([result("send", -15, killed=True), result("recv", -15, killed=True)], "recv"),
        # a stage that could not start is its own failure; later ones never ran
        ([result("send", -15, killed=True), result("zstd", 127), result("recv", None)], "zstd"),
        ([result("send", 0), result("recv", 0)], None),
    ],
)  # fmt: skip
def test_the_culprit_is_the_first_stage_that_failed_on_its_own(stages, culprit):
    """docs/reliability.md#r7-a-failing-pipeline-stage-is-detected."""
    found = choose_culprit(stages)
    assert (found.name if found else None) == culprit


def test_remote_pipeline_joins_each_quoted_command_with_a_bar():
    argvs = [["zstd", "-d"], ["zfs", "receive", "-u", "tank/a b;rm -rf /"]]
    assert remote_pipeline(argvs, sudo=False) == (
        "zstd -d | zfs receive -u 'tank/a b;rm -rf /'"
    )
    assert remote_pipeline(argvs, sudo=True) == (
        "sudo -n zstd -d | sudo -n zfs receive -u 'tank/a b;rm -rf /'"
    )
    assert remote_pipeline([["cat"]], sudo=False) == remote_command(["cat"], sudo=False)
    with pytest.raises(ValueError):
        remote_pipeline([], sudo=False)
    with pytest.raises(ValueError):
        remote_pipeline([["zstd"], []], sudo=False)


# --- local processes -------------------------------------------------------------------------


def test_three_stages_deliver_the_stream_intact_and_count_its_bytes_exactly(tmp_path):
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(3 * MB + 17))
    out = tmp_path / "out.bin"
    stages = [
        Stage("send", ("cat", str(source))),
        Stage("compress", ("zstd", "-T0", "-q")),
        Stage("decompress", ("zstd", "-d", "-q")),
    ]
    with open(out, "wb") as sink:
        done = run_pipeline(stages, stdout=sink)
    assert isinstance(done, PipelineResult)
    assert [s.returncode for s in done.stages] == [0, 0, 0]
    assert done.bytes == 3 * MB + 17
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest
    assert done.seconds > 0


def test_a_wrapper_shell_counts_the_bytes_its_reaped_child_wrote():
    """The kernel adds a reaped child's wchar to its parent's (sh -c, sudo)."""
    stages = [Stage("send", ("sh", "-c", "head -c 1234567 /dev/urandom; true")),
              Stage("receive", ("cat",))]  # fmt: skip
    assert run_pipeline(stages).bytes == 1234567


def test_meter_read_counts_the_stream_plus_at_most_a_few_kib_of_start_up_reads():
    stages = [Stage("send", ("head", "-c", str(2 * MB), "/dev/zero")), Stage("receive", ("cat",))]
    counted = run_pipeline(stages, meter=Meter.READ).bytes
    assert 2 * MB <= counted <= 2 * MB + 64 * 1024


def test_a_receiver_failing_while_the_sender_writes_is_the_culprit_and_returns_quickly():
    """docs/reliability.md#r6-receiver-fails-while-the-sender-is-still-writing."""
    receiver = 'read -r x; echo "cannot receive: bad stream" >&2; exit 1'
    error, seconds = failure([Stage("send", ("yes",)), Stage("receive", ("sh", "-c", receiver))])
    assert seconds < STOPS_WITHIN
    assert error.culprit.name == "receive"
    assert error.culprit.returncode == 1
    assert "cannot receive: bad stream" in str(error)
    assert "receive" in str(error) and "read -r x" in str(error)
    sender = error.stages[0]
    assert sender.failed and (sender.broken_pipe or sender.killed)
    assert error.bytes > 0
    assert_nothing_left(error.stages)


def test_a_sender_failing_first_is_the_culprit_while_the_receiver_sees_eof():
    """docs/reliability.md#r6-receiver-fails-while-the-sender-is-still-writing."""
    sender = 'echo "cannot open tank/x: dataset does not exist" >&2; exit 1'
    receiver = 'cat >/dev/null; echo "cannot receive: failed to read from stream" >&2; exit 1'
    error, seconds = failure([Stage("send", ("sh", "-c", sender)),
                              Stage("receive", ("sh", "-c", receiver))])  # fmt: skip
    assert seconds < STOPS_WITHIN
    assert error.culprit.name == "send"
    assert "cannot open tank/x: dataset does not exist" in str(error)
    assert error.stages[1].failed  # on its own (EOF) or stopped by us: either way not blamed
    assert_nothing_left(error.stages)


def test_a_middle_stage_failure_is_reported_as_that_stage():
    """docs/reliability.md#r7-a-failing-pipeline-stage-is-detected."""
    stages = [Stage("send", ("head", "-c", str(MB), "/dev/urandom")),
              Stage("decompress", ("zstd", "-d", "-q")),
              Stage("receive", ("cat",))]  # fmt: skip
    error, _ = failure(stages)
    assert error.culprit.name == "decompress"
    assert error.culprit.returncode != 0
    assert "zstd" in error.culprit.stderr
    assert "stage 'decompress' failed" in str(error)
    assert_nothing_left(error.stages)


def test_a_reader_that_exits_early_with_success_leaves_the_writers_broken_pipe_to_blame():
    error, _ = failure([Stage("send", ("yes",)), Stage("receive", ("head", "-c", "10"))])
    assert error.culprit.name == "send"
    assert error.culprit.broken_pipe
    assert error.culprit.status == "killed by SIGPIPE"
    assert error.stages[1].returncode == 0
    assert_nothing_left(error.stages)


def test_a_program_that_cannot_start_is_the_culprit_and_started_stages_are_stopped():
    stages = [Stage("send", ("yes",)), Stage("compress", ("zbak-no-such-program",)),
              Stage("receive", ("cat",))]  # fmt: skip
    error, seconds = failure(stages)
    assert seconds < STOPS_WITHIN
    assert error.culprit.name == "compress"
    assert error.culprit.returncode == 127
    assert "zbak-no-such-program" in error.culprit.stderr
    # stopped by zbak, or dead of SIGPIPE first: its reader never started
    assert error.stages[0].killed or error.stages[0].broken_pipe
    assert error.stages[2].returncode is None and error.stages[2].status == "not started"
    assert_nothing_left(error.stages)


def test_a_file_that_is_not_executable_cannot_start_with_exit_126(tmp_path):
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    error, _ = failure([Stage("send", ("yes",)), Stage("receive", (str(script),))])
    assert (error.culprit.name, error.culprit.returncode) == ("receive", 126)
    assert_nothing_left(error.stages)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_stages_do_not_outlive_a_killed_zbak(tmp_path, sig):
    """The kernel sends SIGTERM to every stage when the process running them dies."""
    pidfile = tmp_path / "sender.pid"
    program = (
        "from zrepl_py.proc.pipeline import Stage, run_pipeline\n"
        "run_pipeline([Stage('send', ('sh', '-c', 'echo $$ > \"$0\"; exec cat /dev/zero',\n"
        f"                            {str(pidfile)!r})),\n"
        "              Stage('receive', ('cat',))])\n"
    )
    zbak = subprocess.Popen([PY, "-c", program], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline and zbak.poll() is None
        time.sleep(0.05)
    sender = int(pidfile.read_text())
    zbak.send_signal(sig)
    zbak.wait(10)
    deadline = time.monotonic() + 3
    while process_state(sender) not in (None, "Z"):  # an orphan's zombie stays under this init
        assert time.monotonic() < deadline, "the sender outlived the killed zbak"
        time.sleep(0.05)


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` from /proc (``R``, ``S``, ``Z``...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_setting_cancel_stops_every_stage_and_its_children(tmp_path):
    # Cancelled once bytes flow through both stages, not after a fixed delay: on a loaded
    # host a stage not yet started when the cancel came was (rightly) not "killed".
    cancel, ready = threading.Event(), tmp_path / "ready"

    def cancel_once_flowing() -> None:
        deadline = time.monotonic() + STOPS_WITHIN
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        cancel.set()

    threading.Thread(target=cancel_once_flowing, daemon=True).start()
    stages = [Stage("send", ("cat", "/dev/zero")),
              Stage("receive", ("sh", "-c", f"sleep 60 & head -c 1 >/dev/null; touch {ready};"
                                            " cat >/dev/null"))]  # fmt: skip
    with pytest.raises(PipelineCancelled) as info:
        started = time.monotonic()
        run_pipeline(stages, cancel=cancel)
    assert time.monotonic() - started < STOPS_WITHIN
    error = info.value
    assert error.culprit.name == "cancelled" and error.culprit.argv == ()
    assert "cancelled" in str(error)
    assert all(s.killed for s in error.stages)
    assert error.bytes > 0
    assert_nothing_left(error.stages)


def test_a_cancel_set_before_the_call_starts_nothing():
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(PipelineCancelled) as info:
        run_pipeline([Stage("send", ("sleep", "60")), Stage("receive", ("cat",))], cancel=cancel)
    assert [s.status for s in info.value.stages] == ["not started", "not started"]
    assert "nothing was running" in str(info.value)


def test_a_timeout_stops_every_stage_and_raises_pipeline_timed_out():
    stages = [Stage("send", ("sleep", "60")), Stage("receive", ("cat",))]
    started = time.monotonic()
    with pytest.raises(PipelineTimedOut) as info:
        run_pipeline(stages, timeout=0.5)
    assert 0.5 <= time.monotonic() - started < STOPS_WITHIN
    assert info.value.culprit.name == "timeout"
    assert "0.5 s timeout" in str(info.value)
    assert_nothing_left(info.value.stages)


def test_a_stage_that_ignores_sigterm_is_killed_after_the_grace():
    stubborn = 'trap "" TERM; while :; do sleep 0.1; done'
    stages = [Stage("send", ("sh", "-c", stubborn)), Stage("receive", ("cat",))]
    started = time.monotonic()
    with pytest.raises(PipelineTimedOut) as info:
        run_pipeline(stages, timeout=0.2, kill_grace=0.5)
    assert time.monotonic() - started < STOPS_WITHIN
    assert info.value.stages[0].status == "killed by SIGKILL"
    assert_nothing_left(info.value.stages)


def test_megabytes_of_stderr_from_every_stage_neither_deadlock_nor_grow_the_tail():
    flood = "import sys; sys.stderr.write('x' * (4 << 20) + 'END-{}'); "
    sender = flood.format("send") + "sys.stdout.buffer.write(b'd' * (1 << 20))"
    receiver = flood.format("recv") + "sys.stdout.buffer.write(sys.stdin.buffer.read())"
    done = run_pipeline([py_stage("send", sender), py_stage("receive", receiver)], timeout=60)
    assert done.bytes >= 1 << 20  # wchar of the sender includes its stderr too
    for stage, marker in zip(done.stages, ("END-send", "END-recv"), strict=True):
        assert len(stage.stderr) == STDERR_TAIL
        assert stage.stderr.endswith(marker)


def test_progress_is_called_with_increasing_byte_counts_for_a_slow_pipeline():
    slow = ("import sys, time\n"
            "for _ in range(12):\n"
            "    sys.stdout.buffer.write(b'z' * 65536); sys.stdout.flush(); time.sleep(0.1)\n")
    samples: list[tuple[int, float]] = []
    done = run_pipeline([py_stage("send", slow), Stage("receive", ("cat",))],
                        progress=lambda n, s: samples.append((n, s)), interval=0.2)  # fmt: skip
    assert done.bytes == 12 * 65536
    assert len(samples) >= 3
    counts = [n for n, _ in samples]
    assert counts == sorted(counts) and counts[-1] > counts[0]  # [0] may be 0 under load
    assert all(n <= done.bytes for n in counts)
    times = [s for _, s in samples]
    assert times == sorted(times) and times[0] >= 0.2


def test_a_progress_reporter_is_finished_with_the_exact_count_and_closed(caplog, tmp_path):
    """run_pipeline ends the reporter itself: one summary line, the bar (if any) stopped."""
    with open(tmp_path / "log", "w") as stream, caplog.at_level(logging.INFO):
        reporter = ProgressReporter("a@s -> b", stream=stream, log_every=3600)
        run_pipeline([Stage("send", ("head", "-c", str(3 * MB), "/dev/zero")),
                      Stage("receive", ("cat",))], progress=reporter)  # fmt: skip
        with pytest.raises(PipelineFailed):
            run_pipeline([Stage("send", ("false",))], progress=reporter)
    lines = [r.getMessage() for r in caplog.records if r.name == "zrepl_py.observe.progress"]
    assert len(lines) == 1 and lines[0].startswith("a@s -> b: 3.0 MiB in 0:00:0")


def test_an_exception_in_the_progress_callback_stops_the_pipeline_and_propagates():
    def explode(_bytes: int, _seconds: float) -> None:
        raise KeyboardInterrupt

    stages = [Stage("send", ("cat", "/dev/zero")), Stage("receive", ("cat",))]
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(stages, progress=explode, interval=0.1)
    assert time.monotonic() - started < STOPS_WITHIN
    children = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "stat=,args="],
                              capture_output=True, text=True).stdout  # fmt: skip
    assert "cat" not in children  # neither running nor a zombie


def test_a_stage_needs_an_argv_and_meter_read_needs_two_stages():
    with pytest.raises(ValueError):
        Stage("empty", ())
    with pytest.raises(ValueError):
        run_pipeline([])
    with pytest.raises(ValueError):
        run_pipeline([Stage("send", ("true",))], meter=Meter.READ)


# --- real zfs send | ssh zfs receive on zfs-fuse ---------------------------------------------


def zfs(*args: str) -> str:
    done = subprocess.run(["zfs", *args], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT, check=True)  # fmt: skip
    return done.stdout.strip()


def guid(name: str) -> str:
    return zfs("get", "-Hp", "-o", "value", "guid", name)


@pytest.fixture
def source(zpool) -> str:
    """POOL/a with 2 MB of random data and a snapshot POOL/a@s; returns the snapshot name."""
    zfs("create", f"{zpool.name}/a")
    (zpool.mountpoint / "a" / "data.bin").write_bytes(os.urandom(2 * MB))
    zfs("snapshot", f"{zpool.name}/a@s")
    return f"{zpool.name}/a@s"


def stream_size(snapshot: str) -> int:
    send = subprocess.Popen(["zfs", "send", snapshot], stdout=subprocess.PIPE)
    size = 0
    while chunk := send.stdout.read(MB):
        size += len(chunk)
    assert send.wait(COMMAND_TIMEOUT) == 0
    return size


def ssh_stage(sshd, tmp_path, remote: str) -> Stage:
    return Stage("ssh receive",
                 (*ssh_argv(sshd.host_config(), known_hosts_default=tmp_path / "kh"), remote))


def test_zfs_send_piped_through_ssh_to_zfs_receive_arrives_with_the_same_guid(
    zpool, source, sshd, tmp_path
):
    target = f"{zpool.name}/b"
    receive = remote_command(["zfs", "receive", target], sudo=False)
    stages = [Stage("send", ("zfs", "send", source)), ssh_stage(sshd, tmp_path, receive)]
    # zfs-fuse's daemon writes the stream, not the zfs process: count what ssh reads.
    done = run_pipeline(stages, meter=Meter.READ, timeout=120)
    assert guid(f"{target}@s") == guid(source)
    size = stream_size(source)
    assert size <= done.bytes <= size + 256 * 1024  # + ssh's config, key and socket reads


def test_a_zstd_compressed_stream_decompressed_remotely_arrives_with_the_same_guid(
    zpool, source, sshd, tmp_path
):
    target = f"{zpool.name}/c"
    remote = remote_pipeline([["zstd", "-d", "-q"], ["zfs", "receive", target]], sudo=False)
    stages = [Stage("send", ("zfs", "send", source)), Stage("compress", ("zstd", "-T0", "-q")),
              ssh_stage(sshd, tmp_path, remote)]  # fmt: skip
    done = run_pipeline(stages, meter=Meter.READ, timeout=120)
    assert guid(f"{target}@s") == guid(source)
    assert done.bytes >= 2 * MB


def test_receiving_into_an_existing_dataset_blames_the_receivers_message(
    zpool, source, sshd, tmp_path
):
    """docs/reliability.md#r6-receiver-fails-while-the-sender-is-still-writing."""
    target = f"{zpool.name}/exists"
    zfs("create", target)
    receive = remote_command(["zfs", "receive", target], sudo=False)
    error, _ = failure([Stage("send", ("zfs", "send", source)),
                        ssh_stage(sshd, tmp_path, receive)], timeout=120)  # fmt: skip
    assert error.culprit.name == "ssh receive"
    assert "exists" in error.culprit.stderr
    assert classify(error.culprit.stderr) is DatasetExists
    assert "stage 'ssh receive' failed (exit 1)" in str(error)
    assert_nothing_left(error.stages)


def test_sending_a_missing_snapshot_blames_the_sender(zpool, sshd, tmp_path):
    """docs/reliability.md#r6-receiver-fails-while-the-sender-is-still-writing."""
    receive = remote_command(["zfs", "receive", f"{zpool.name}/never"], sudo=False)
    error, _ = failure([Stage("send", ("zfs", "send", f"{zpool.name}@nope")),
                        ssh_stage(sshd, tmp_path, receive)], timeout=120)  # fmt: skip
    assert error.culprit.name == "send"
    assert classify(error.culprit.stderr) is DatasetNotFound
    assert_nothing_left(error.stages)
