"""Where a transfer is counted and which ssh stages share a connection (``metered_transfer``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zrepl_py.config.hosts import HostConfig
from zrepl_py.proc.mbuffer import mbuffer_argv, without_buffer_noise
from zrepl_py.proc.pipeline import Meter
from zrepl_py.transport.stages import Side, metered_transfer

SEND = ["zfs", "send", "tank/a@s1"]
RECEIVE = ["zfs", "receive", "-u", "bak/a"]
HOST = HostConfig(address="h.example", port=22, user="root")
SHARED = Path("/state/ssh")


def side(remote: bool) -> Side:
    return Side("h" if remote else "local", HOST if remote else None, Path("/state/known_hosts"),
                SHARED if remote else None)  # fmt: skip


def shares(stage) -> bool:
    return any(arg.startswith("ControlPath=") for arg in stage.argv)


# (case, source remote, target remote, send writes stream, compress, rate limit,
#  expected meter, expected stage names, which stages share a connection)
CASES = [
    ("push from zfs-fuse: a relay is counted, so the target's ssh shares",
     False, True, False, False, None, Meter.READ, ["zfs send", "relay", "ssh h: zfs receive"],
     [False, False, True]),
    ("push from OpenZFS: its zfs send is counted, the target's ssh shares",
     False, True, True, False, None, Meter.WRITTEN, ["zfs send", "ssh h: zfs receive"],
     [False, True]),
    ("push from zfs-fuse through pv: pv is counted, the target's ssh shares",
     False, True, False, False, 1000, Meter.READ, ["zfs send", "rate limit", "ssh h: zfs receive"],
     [False, False, True]),
    ("push from zfs-fuse with zstd: zstd is counted, the target's ssh shares",
     False, True, False, True, None, Meter.READ, ["zfs send 0", "zfs send 1", "ssh h: zfs receive"],
     [False, False, True]),
    ("pull: a relay is counted, so the source's ssh shares",
     True, False, False, False, None, Meter.READ, ["ssh h: zfs send", "relay", "zfs receive"],
     [True, False, False]),
    ("pull through pv: pv is counted, the source's ssh shares",
     True, False, False, False, 1000, Meter.READ, ["ssh h: zfs send", "rate limit", "zfs receive"],
     [True, False, False]),
    ("remote to remote: a relay between the two shared ssh is counted",
     True, True, True, False, None, Meter.READ, ["ssh h: zfs send", "relay", "ssh h: zfs receive"],
     [True, False, True]),
    ("local to local from zfs-fuse: its zfs receive hands the stream on, so a relay is counted",
     False, False, False, False, None, Meter.READ, ["zfs send", "relay", "zfs receive"],
     [False, False, False]),
    ("local to local on OpenZFS: its zfs send is counted",
     False, False, True, False, None, Meter.WRITTEN, ["zfs send", "zfs receive"], [False, False]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "src_remote", "dst_remote", "writes", "compress", "limit",
                          "meter", "names", "shared"), CASES, ids=[c[0] for c in CASES])
def test_every_ssh_shares_its_connection_and_the_counted_stage_is_a_local_process(
        case, src_remote, dst_remote, writes, compress, limit, meter, names, shared):
    stages, got = metered_transfer(SEND, RECEIVE, source=side(src_remote), target=side(dst_remote),
                                   compress=compress, bandwidth_limit=limit,
                                   send_writes_stream=writes)  # fmt: skip
    assert got is meter
    assert [s.name for s in stages] == names
    assert [shares(s) for s in stages] == shared
    counted = stages[0 if meter is Meter.WRITTEN else 1]
    assert not shares(counted)


def test_without_sharing_the_ssh_is_counted_and_no_relay_is_added():
    plain = Side("h", HOST, Path("/state/known_hosts"))
    stages, meter = metered_transfer(SEND, RECEIVE, source=side(False), target=plain,
                                     compress=False, bandwidth_limit=None,
                                     send_writes_stream=False)  # fmt: skip
    assert [s.name for s in stages] == ["zfs send", "ssh h: zfs receive"] and meter is Meter.READ
    stages, meter = metered_transfer(SEND, RECEIVE, source=plain, target=side(False),
                                     compress=False, bandwidth_limit=None,
                                     send_writes_stream=False)  # fmt: skip
    assert [s.name for s in stages] == ["ssh h: zfs send", "zfs receive"]
    assert meter is Meter.WRITTEN


def test_without_share_no_ssh_shares_a_connection():
    stages, _ = metered_transfer(SEND, RECEIVE, source=side(True), target=side(True),
                                 compress=True, bandwidth_limit=None, send_writes_stream=False,
                                 share=False)  # fmt: skip
    assert not any(shares(s) for s in stages)


def test_a_side_without_a_control_dir_never_shares():
    plain = Side("h", HOST, Path("/state/known_hosts"))
    stages, _ = metered_transfer(SEND, RECEIVE, source=side(False), target=plain, compress=False,
                                 bandwidth_limit=None, send_writes_stream=True)  # fmt: skip
    assert not any(shares(s) for s in stages)


BUFFER = 64 * 1024 * 1024


def remote_end(stages) -> str:
    return stages[-1].argv[-1]  # the command string after "ssh ... -- HOST"


@pytest.mark.parametrize("compress", [False, True])
def test_a_push_buffers_right_before_zfs_receive_on_the_receiving_host(compress):
    stages, _ = metered_transfer(SEND, RECEIVE, source=side(False), target=side(True),
                                 compress=compress, bandwidth_limit=None,
                                 send_writes_stream=False, receive_buffer=BUFFER)  # fmt: skip
    zstd = "zstd -q -d -c | " if compress else ""
    assert remote_end(stages) == f"{zstd}mbuffer -q -v 1 -s 128k -m 65536k | zfs receive -u bak/a"
    assert "mbuffer" not in " ".join(" ".join(s.argv[:-1]) for s in stages)


def test_a_pull_buffers_locally_between_the_sources_ssh_and_zfs_receive():
    stages, meter = metered_transfer(SEND, RECEIVE, source=side(True), target=side(False),
                                     compress=False, bandwidth_limit=None,
                                     send_writes_stream=False, receive_buffer=BUFFER)  # fmt: skip
    assert [s.argv for s in stages[1:]] == [("cat",), mbuffer_argv(BUFFER), tuple(RECEIVE)]
    assert meter is Meter.READ  # the relay: the buffer adds no counted stage


def test_a_stream_that_stays_on_this_machine_gets_no_buffer():
    stages, _ = metered_transfer(SEND, RECEIVE, source=side(False), target=side(False),
                                 compress=False, bandwidth_limit=None, send_writes_stream=True,
                                 receive_buffer=BUFFER)  # fmt: skip
    assert [s.argv for s in stages] == [tuple(SEND), tuple(RECEIVE)]


def test_mbuffer_gets_its_size_in_whole_kib():
    assert mbuffer_argv(1024 * 1024 + 1023)[-2:] == ("-m", "1024k")


def test_mbuffer_noise_about_the_pipe_zfs_receive_closed_is_dropped_and_nothing_else():
    stderr = ("cannot receive incremental stream: destination bak/a has been modified\n"
              "mbuffer: error: outputThread: error writing to <stdout> at offset 0x10000: "
              "Broken pipe\n"
              "mbuffer: error: Cannot allocate memory\n")  # fmt: skip
    assert without_buffer_noise(stderr).splitlines() == [
        "cannot receive incremental stream: destination bak/a has been modified",
        "mbuffer: error: Cannot allocate memory"]
