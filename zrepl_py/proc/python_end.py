"""A process pipeline with one end in this process: read a send's stream, or feed a receive.

The pipeline (proc/pipeline.py) runs in a background thread with an OS pipe at one end;
this process holds the other end. Errors travel to the caller where it would notice them:
``SendReader.read`` raises the pipeline's ``PipelineFailed`` where EOF would have been
returned (a truncated stream is never taken for a whole one); ``ReceiveWriter.write`` and
``finish`` raise the receive's own error rather than the broken pipe's. Leaving the ``with``
block early cancels the pipeline and reaps its processes.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Sequence

from zrepl_py.proc.pipeline import Stage, run_pipeline
from zrepl_py.proc.write_behind import WriteBehind

_PIPE_SIZE = 1 << 20  # bytes; F_SETPIPE_SZ, fcntl(2): fewer wake-ups than the 64 KiB default


class _PythonEnd:
    """Starts ``stages`` in a thread with ``pipeline_end`` ("stdout" or "stdin") on our pipe."""

    def __init__(self, stages: Sequence[Stage], pipeline_end: str, name: str):
        self._stages = list(stages)
        self._cancel = threading.Event()
        self._error: BaseException | None = None
        self._read_fd, self._write_fd = os.pipe()
        try:
            fcntl.fcntl(self._write_fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass  # over /proc/sys/fs/pipe-max-size for an unprivileged user: keep the default
        self._end = pipeline_end
        self._pipeline_fd = self._write_fd if pipeline_end == "stdout" else self._read_fd
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            if self._end == "stdout":
                run_pipeline(self._stages, cancel=self._cancel, stdout=self._pipeline_fd)
            else:
                run_pipeline(self._stages, cancel=self._cancel, stdin=self._pipeline_fd)
        except BaseException as exc:  # handed to the caller's thread
            self._error = exc
        finally:
            # Closing our copy lets the reader see EOF, or a writer blocked on a dead
            # receive get EPIPE.
            os.close(self._pipeline_fd)

    def _join(self) -> None:
        """Wait for the pipeline; raise its error if it failed."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _stop(self, own_fd: int) -> None:
        """Cancel the pipeline, close our end, reap."""
        self._cancel.set()
        os.close(own_fd)
        self._thread.join()


class SendReader(_PythonEnd):
    """The readable end of a running ``[ssh HOST] zfs send ...`` pipeline."""

    def __init__(self, stages: Sequence[Stage]):
        super().__init__(stages, "stdout", "zfs send")
        self._eof = False

    def __enter__(self) -> SendReader:
        self._thread.start()
        return self

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the stream; b"" only at the end of a complete stream.

        Raises:
            PipelineFailed: the send failed (raised where EOF would have been returned).
        """
        if self._eof:
            return b""
        data = os.read(self._read_fd, size)
        if data:
            return data
        self._eof = True
        self._join()
        return b""

    def __exit__(self, *exc: object) -> None:
        if self._eof:
            os.close(self._read_fd)
        else:
            self._stop(self._read_fd)  # a send still writing gets EPIPE and stops


class ReceiveWriter(_PythonEnd):
    """The writable end of a running ``[ssh HOST] zfs receive ...`` pipeline; call
    ``finish()`` after the last byte. Without ``finish()`` the receive is cancelled and
    discards the partial stream (zfs-receive(8) without ``-s``), and nothing still queued
    reaches it.

    Args:
        stages: the pipeline, ``zfs receive`` last.
        ahead: bytes ``write`` may queue in this process ahead of the receive, written by a
            thread of its own (``proc.write_behind``); 0 writes into the pipe directly.
    """

    def __init__(self, stages: Sequence[Stage], *, ahead: int = 0):
        super().__init__(stages, "stdin", "zfs receive")
        self._finished = False
        self._ahead = ahead
        self._behind: WriteBehind | None = None

    def start(self) -> ReceiveWriter:
        """Start the pipeline now, before the ``with`` block (which then does not start it
        again): a receive started early waits for its first byte. Returns ``self``."""
        if self._thread.ident is None:
            self._thread.start()
            if self._ahead:
                self._behind = WriteBehind(self._write_all, self._ahead, "zbak-receive-ahead")
        return self

    def __enter__(self) -> ReceiveWriter:
        return self.start()

    def write(self, data: bytes) -> None:
        """Write all of ``data`` to the receive (with ``ahead``: queue it, waiting while
        ``ahead`` bytes are queued); ``data`` must not change afterwards.

        Raises:
            PipelineFailed: the receive failed (its message, not the broken pipe's); with
                ``ahead``, raised by the write after the failure was seen, or by ``finish``.
        """
        if self._behind is not None:
            self._behind.put(data)
        else:
            self._write_all(data)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._write_fd, view)
            except BrokenPipeError:
                self._join()
                raise
            view = view[written:]

    def finish(self) -> None:
        """Write what is queued, end the stream and wait for the receive to finish.

        Raises:
            PipelineFailed: the receive failed.
        """
        if self._behind is not None:
            self._behind.drain()
        self._finished = True
        os.close(self._write_fd)
        self._join()

    def __exit__(self, *exc: object) -> None:
        if self._finished:
            return
        if self._behind is None:
            self._stop(self._write_fd)
            return
        # The queue is dropped and the receive cancelled first, so the writing thread's
        # blocked write ends (EPIPE) and it is joined before its descriptor is closed.
        self._behind.discard()
        self._cancel.set()
        self._thread.join()
        self._behind.join()
        os.close(self._write_fd)
