"""Run ``zfs send`` (locally or through ssh) and read its stream from Python.

The send runs as a process pipeline (proc/pipeline.py) whose last stage writes into a pipe
this process reads. The reader reports the end of the stream only after the pipeline has
finished: if the send failed, the read that would have returned EOF raises its
``PipelineFailed`` instead, so a truncated stream is never taken for a whole one.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Sequence

from zrepl_py.proc.pipeline import Stage, run_pipeline

_PIPE_SIZE = 1 << 20  # bytes; F_SETPIPE_SZ, fcntl(2): fewer wake-ups than the 64 KiB default


class SendReader:
    """A readable stream of a running send pipeline; use as a context manager.

    Leaving the ``with`` block early (an upload failed, Ctrl-C) cancels the pipeline and
    reaps its processes.
    """

    def __init__(self, stages: Sequence[Stage]):
        self._stages = list(stages)
        self._cancel = threading.Event()
        self._error: BaseException | None = None
        self._read_fd, self._write_fd = os.pipe()
        try:
            fcntl.fcntl(self._write_fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass  # over /proc/sys/fs/pipe-max-size for an unprivileged user: keep the default
        self._thread = threading.Thread(target=self._run, name="zfs send", daemon=True)
        self._eof = False

    def _run(self) -> None:
        try:
            run_pipeline(self._stages, stdout=self._write_fd, cancel=self._cancel)
        except BaseException as exc:  # handed to the reading thread
            self._error = exc
        finally:
            os.close(self._write_fd)

    def __enter__(self) -> "SendReader":
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
        self._thread.join()
        self._eof = True
        if self._error is not None:
            raise self._error
        return b""

    def __exit__(self, *exc: object) -> None:
        if not self._eof:
            self._cancel.set()
        os.close(self._read_fd)  # a send still writing gets EPIPE and stops
        self._thread.join()
