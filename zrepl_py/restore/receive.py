"""Feed a stream from Python into ``zfs receive`` (locally or through ssh).

The receive runs as a process pipeline (proc/pipeline.py) whose first stage reads a pipe this
process writes. ``finish()`` closes the pipe (end of stream) and waits: a receive that failed
raises its ``PipelineFailed`` there, or from ``write`` once the pipe is broken, so the
receiver's own message is what the user sees.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Sequence

from zrepl_py.proc.pipeline import Stage, run_pipeline

_PIPE_SIZE = 1 << 20  # bytes; F_SETPIPE_SZ, fcntl(2)


class ReceiveWriter:
    """A writable end of a running receive pipeline; use as a context manager and call
    ``finish()`` after the last byte. Leaving the block without ``finish()`` (an error,
    Ctrl-C) cancels the receive, which then discards the partial stream (zfs-receive(8)
    without ``-s``)."""

    def __init__(self, stages: Sequence[Stage]):
        self._stages = list(stages)
        self._cancel = threading.Event()
        self._error: BaseException | None = None
        self._read_fd, self._write_fd = os.pipe()
        try:
            fcntl.fcntl(self._write_fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass  # over /proc/sys/fs/pipe-max-size: keep the default
        self._thread = threading.Thread(target=self._run, name="zfs receive", daemon=True)
        self._finished = False

    def _run(self) -> None:
        try:
            run_pipeline(self._stages, stdin=self._read_fd, cancel=self._cancel)
        except BaseException as exc:  # handed to the writing thread
            self._error = exc
        finally:
            os.close(self._read_fd)  # a writer blocked on a dead receive gets EPIPE

    def __enter__(self) -> "ReceiveWriter":
        self._thread.start()
        return self

    def write(self, data: bytes) -> None:
        """Write all of ``data`` to the receive.

        Raises:
            PipelineFailed: the receive failed (its message, not the broken pipe's).
        """
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._write_fd, view)
            except BrokenPipeError:
                self._thread.join()
                if self._error is not None:
                    raise self._error from None
                raise
            view = view[written:]

    def finish(self) -> None:
        """End the stream and wait for the receive to finish.

        Raises:
            PipelineFailed: the receive failed.
        """
        self._finished = True
        os.close(self._write_fd)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def __exit__(self, *exc: object) -> None:
        if not self._finished:
            self._cancel.set()
            os.close(self._write_fd)
            self._thread.join()
