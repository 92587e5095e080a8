"""``ReceiveWriter(stages, ahead=N)``, the restore's write-behind in front of ``zfs receive``
(docs/performance.md#a-restore-writes-behind), against real processes standing in for the
receive: everything queued arrives in order before ``finish`` returns; a receive that fails
is reported as its own failure; leaving without ``finish`` cancels the receive and nothing
still queued reaches it; and ``write`` waits while ``ahead`` bytes are queued (the memory
bound). The restore through it, on zfs-fuse, is tests/e2e and tests/reliability's."""

from __future__ import annotations

import os
import threading

import pytest
from support.procwatch import cmdline, descendants

from zrepl_py.errors import PipelineFailed
from zrepl_py.proc.pipeline import Stage
from zrepl_py.proc.python_end import ReceiveWriter

MiB = 1 << 20


def receive(script: str, mark: str) -> list[Stage]:
    """The stand-in receive: ``sh -c SCRIPT MARK`` (the mark in its command line)."""
    return [Stage("zfs receive", ("sh", "-c", script, mark))]


def left(mark: str) -> list[int]:
    """This process's descendants whose command line holds ``mark`` (the stand-in receive's
    shell and its process group share it)."""
    return [pid for pid in descendants(os.getpid()) if mark in " ".join(cmdline(pid))]


def test_everything_queued_reaches_the_receive_in_order_before_finish_returns(tmp_path):
    out = tmp_path / "received"
    pieces = [os.urandom(MiB) for _ in range(20)]
    with ReceiveWriter(receive(f"sleep 0.3; cat > {out}", "ahead-order"),
                      ahead=8 * MiB) as writer:
        for piece in pieces:
            writer.write(piece)
        writer.finish()
        assert out.read_bytes() == b"".join(pieces)


def test_a_receive_that_fails_mid_stream_is_reported_as_its_own_failure():
    script = "head -c 100000 > /dev/null; echo 'cannot receive: invalid stream' >&2; exit 1"
    with pytest.raises(PipelineFailed, match="invalid stream"):
        with ReceiveWriter(receive(script, "ahead-fails"), ahead=4 * MiB) as writer:
            for _ in range(40):
                writer.write(os.urandom(MiB))
            writer.finish()
    assert not left("ahead-fails")


def test_leaving_without_finish_cancels_the_receive_and_drops_what_is_queued(tmp_path):
    """A restore that fails mid-stream (a volume that does not decode) leaves the block: the
    receive must never get the queued rest of the stream, let alone its end."""
    out = tmp_path / "received"
    with pytest.raises(RuntimeError, match="decode failed"):
        with ReceiveWriter(receive(f"sleep 2; cat > {out}", "ahead-left"),
                           ahead=64 * MiB) as writer:
            for _ in range(16):
                writer.write(os.urandom(MiB))  # queued: the receive reads nothing for 2 s
            raise RuntimeError("decode failed")
    assert not left("ahead-left")
    assert not out.exists() or out.stat().st_size < 16 * MiB


def test_write_waits_while_ahead_bytes_are_queued():
    """With a receive that reads nothing, writes of 1 MiB stop once the pipe (1 MiB) and the
    queue (``ahead``, the piece being written included) are full; leaving the block releases
    the waiting write with an error."""
    written: list[int] = []
    errors: list[BaseException] = []
    blocked = threading.Event()

    with ReceiveWriter(receive("sleep 60", "ahead-bound"), ahead=4 * MiB) as writer:
        def feed() -> None:
            try:
                for n in range(20):
                    writer.write(os.urandom(MiB))
                    written.append(n)
            except BaseException as exc:
                errors.append(exc)
            finally:
                blocked.set()

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        assert not blocked.wait(1.5), f"nothing held the writes back: {errors}"
        assert 4 <= len(written) <= 5, written
        assert left("ahead-bound"), "the stand-in receive is not seen running"
    feeder.join(30)
    assert not feeder.is_alive() and errors, "the waiting write was not released"
    assert not left("ahead-bound")
