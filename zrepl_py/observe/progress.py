"""Progress of a byte stream: rate and ETA arithmetic, and a reporter for ``run_pipeline``.

``ProgressReporter`` is the ``progress=`` callback of ``zrepl_py.proc.pipeline.run_pipeline``:
it turns ``(bytes, seconds)`` samples into a rate over the last ``window`` seconds and, when the
expected size is known (e.g. from ``zfs send -nP``), an ETA. On a terminal it draws a rich
progress bar on stderr; otherwise (daemon, cron, a pipe) it logs one INFO line every
``log_every`` seconds, e.g. ``tank/data@x -> backup: 1.2 GiB of 3.0 GiB, 85 MiB/s, ETA 0:00:21``.
The arithmetic is pure functions; sizes are bytes, times seconds, units binary (KiB = 1024).

One bar at a time: rich draws one live display per console, and a replication runs several
transfers at once, so the first reporter that draws holds the terminal (``_TERMINAL``) until
it closes and the others log lines as off a terminal.

A reporter may also carry a ``sink`` (``zrepl_py.observe.transfers.Publisher``) that publishes each
estimate to a file ``zbak status`` reads, and is closed (its file removed) with the reporter.
``Sampler`` and ``MeteredReader`` feed a reporter from code that moves the bytes itself
(the archive's send reader, the restore's receive loop) instead of ``run_pipeline``.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TextIO

if TYPE_CHECKING:  # rich loads when a bar is first drawn
    from rich.progress import Progress, TaskID

log = logging.getLogger(__name__)

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
_TERMINAL = threading.Lock()  # held by the reporter drawing a bar (see the module doc)


def format_size(size: float) -> str:
    """Return ``size`` bytes in binary units: ``512 B``, ``1.2 GiB``, ``85 MiB``.

    One decimal below 10 of a unit, none above (the precision a progress line needs).
    """
    value = float(size)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    if abs(value) < 9.95:  # would round to "10.0": show "10" instead
        return f"{value:.1f} {unit}"
    return f"{value:.0f} {unit}"


def format_rate(bytes_per_second: float | None) -> str:
    """Return a rate as ``85 MiB/s``; ``? B/s`` when unknown."""
    return "? B/s" if bytes_per_second is None else f"{format_size(bytes_per_second)}/s"


def format_span(seconds: float) -> str:
    """Return a duration for a status line: ``45 s``, ``12 min``, ``30.5 h`` or ``3.2 d``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 172800 else f"{seconds / 86400:.1f} d"


def format_eta(seconds: float | None) -> str:
    """Return a duration as ``H:MM:SS`` (``1 day, 2:03:04`` past a day); ``?`` when unknown."""
    if seconds is None:
        return "?"
    return str(datetime.timedelta(seconds=max(0, round(seconds))))


def window_rate(samples: Sequence[tuple[float, int]], window: float) -> float | None:
    """Return bytes per second over the last ``window`` seconds of ``samples``.

    Args:
        samples: ``(seconds, bytes)`` pairs, seconds ascending (cumulative byte counts).
        window: seconds; the rate runs from the newest sample older than ``now - window``
            (or the oldest sample) to the newest one.

    Returns:
        None with fewer than two samples or no time between the ends.
    """
    if len(samples) < 2:
        return None
    end_seconds, end_bytes = samples[-1]
    start_seconds, start_bytes = samples[0]
    for seconds, count in samples:
        if seconds > end_seconds - window:
            break
        start_seconds, start_bytes = seconds, count
    if end_seconds <= start_seconds:
        return None
    return max(0.0, (end_bytes - start_bytes) / (end_seconds - start_seconds))


def eta(done: int, total: int | None, rate: float | None) -> float | None:
    """Return seconds left to reach ``total`` bytes at ``rate``; None when unknowable.

    Unknowable: no total, no rate or a zero rate, or ``done`` already past an estimated
    ``total`` (the estimate was low: no honest ETA). ``done == total`` gives 0.
    """
    if total is None or done > total:
        return None
    if done == total:
        return 0.0
    if not rate:
        return None
    return (total - done) / rate


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Where a stream stands.

    Attributes:
        bytes: bytes so far.
        seconds: seconds since it started.
        rate: bytes per second over the recent window, None until two samples.
        eta: seconds left, None when unknown (see ``eta``).
        total: the expected size in bytes, None when unknown.
    """

    bytes: int
    seconds: float
    rate: float | None
    eta: float | None
    total: int | None

    def describe(self, label: str) -> str:
        """``LABEL: 1.2 GiB of 3.0 GiB, 85 MiB/s, ETA 0:00:21`` (no "of"/ETA without a total)."""
        size = format_size(self.bytes)
        if self.total is not None:
            size += f" of {format_size(self.total)}"
        text = f"{label}: {size}, {format_rate(self.rate)}"
        if self.total is not None:
            text += f", ETA {format_eta(self.eta)}"
        return text


class RateMeter:
    """Keeps the recent ``(seconds, bytes)`` samples of one stream and estimates from them.

    Args:
        total: the expected size in bytes, or None.
        window: seconds of samples the rate is taken over.
    """

    def __init__(self, total: int | None = None, window: float = 10.0):
        self.total = total
        self.window = window
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, done: int, seconds: float) -> Estimate:
        """Record ``done`` bytes at ``seconds`` and return the estimate."""
        if not self._samples:
            self._samples.append((0.0, 0))  # the stream started at 0 bytes, 0 s
        self._samples.append((seconds, done))
        # keep one sample older than the window as the rate's anchor
        while len(self._samples) > 2 and self._samples[1][0] <= seconds - self.window:
            self._samples.popleft()
        rate = window_rate(self._samples, self.window)
        return Estimate(done, seconds, rate, eta(done, self.total, rate), self.total)


class Sink(Protocol):
    """Where a reporter also sends its estimates (``zrepl_py.observe.transfers.Publisher``)."""

    def update(self, estimate: Estimate) -> None:
        """Take one estimate; must not raise for its own I/O."""

    def close(self) -> None:
        """The stream ended (successfully or not); idempotent."""


class Sampler:
    """Calls ``progress(bytes, seconds)`` at most every ``interval`` seconds as bytes move.

    For code that moves the bytes itself; call ``add(n)`` per chunk. Seconds run from the
    sampler's creation (monotonic clock).
    """

    def __init__(self, progress: Callable[[int, float], None] | None, interval: float = 1.0):
        self.progress = progress
        self.interval = interval
        self.bytes = 0
        self.started = time.monotonic()
        self._next = self.started + interval

    def add(self, count: int) -> None:
        """Count ``count`` more bytes; sample if ``interval`` has passed."""
        self.bytes += count
        if self.progress is None:
            return
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval
            self.progress(self.bytes, now - self.started)


class ByteReader(Protocol):
    """Anything read in chunks: ``read(size)`` returns at most ``size`` bytes, ``b""`` at
    the end (a binary file, ``proc.python_end.SendReader``, ``MeteredReader``)."""

    def read(self, size: int, /) -> bytes: ...


class MeteredReader:
    """Wraps a reader (``read(size) -> bytes``) and samples the bytes read (``Sampler``)."""

    def __init__(self, reader: ByteReader, progress: Callable[[int, float], None] | None,
                 interval: float = 1.0):
        self.reader = reader
        self.sampler = Sampler(progress, interval)

    def read(self, size: int) -> bytes:
        """``reader.read(size)``, counted."""
        data = self.reader.read(size)
        self.sampler.add(len(data))
        return data


class ProgressReporter:
    """The ``progress=(bytes, seconds)`` callback of ``run_pipeline``: bar or log lines.

    Args:
        label: what moves, e.g. ``"tank/data@x -> backup"``.
        total: the expected stream size in bytes (for the bar and ETA), or None.
        stream: where the bar is drawn (default ``sys.stderr``); a bar only if it is a TTY
            and ``logger`` logs INFO.
        log_every: seconds between INFO lines when not drawing a bar.
        window: seconds the rate is averaged over.
        logger: where the lines go (default this module's logger).
        sink: also given every estimate, and closed with the reporter (``Sink``).

    Use as a context manager or call ``close()`` (or ``finish()``) so a bar is stopped.
    """

    def __init__(
        self,
        label: str,
        *,
        total: int | None = None,
        stream: TextIO | None = None,
        log_every: float = 10.0,
        window: float = 10.0,
        logger: logging.Logger | None = None,
        sink: Sink | None = None,
    ):
        self.label = label
        self.sink = sink
        self.meter = RateMeter(total, window)
        self.stream = stream if stream is not None else sys.stderr
        self.log_every = log_every
        self.logger = logger or log
        self._last_logged = 0.0
        self._bar: tuple[Progress, TaskID] | None = None  # rich's bar and its one task
        try:  # a bar is progress at INFO: none under zbak -q
            self.tty = self.stream.isatty() and self.logger.isEnabledFor(logging.INFO)
        except (AttributeError, ValueError):
            self.tty = False

    def __call__(self, done: int, seconds: float) -> None:
        """Take one sample: redraw the bar, or log a line if ``log_every`` has passed."""
        estimate = self.meter.add(done, seconds)
        if self.sink is not None:
            self.sink.update(estimate)
        if self.tty:
            self._draw(estimate)
        elif seconds - self._last_logged >= self.log_every:
            self._last_logged = seconds
            self.logger.info("%s", estimate.describe(self.label))

    def _draw(self, estimate: Estimate) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

        if self._bar is None:
            if not _TERMINAL.acquire(blocking=False):  # another transfer's bar is up
                self.tty = False
                return
            bar = Progress(
                TextColumn("{task.description}", markup=False),  # a name's "[...]" stays
                BarColumn(),
                DownloadColumn(binary_units=True),
                TextColumn("{task.fields[info]}", markup=False),
                console=Console(file=self.stream),
                auto_refresh=False,  # redrawn on each sample: no refresh thread
            )
            bar.start()
            self._bar = bar, bar.add_task(self.label, total=estimate.total, info="")
        bar, task = self._bar
        info = format_rate(estimate.rate)
        if estimate.total is not None:
            info += f"  ETA {format_eta(estimate.eta)}"
        bar.update(task, completed=estimate.bytes, info=info)
        bar.refresh()

    def finish(self, done: int, seconds: float) -> None:
        """Close the bar and log the summary: ``LABEL: 1.2 GiB in 0:00:14, 85 MiB/s``."""
        self.close()
        rate = done / seconds if seconds > 0 else None
        self.logger.info(
            "%s: %s in %s, %s", self.label, format_size(done), format_eta(seconds),
            format_rate(rate),
        )  # fmt: skip

    def close(self) -> None:
        """Stop drawing the bar and close the sink (idempotent)."""
        if self.sink is not None:
            self.sink.close()
        if self._bar is not None:
            self._bar[0].stop()
            self._bar = None
            _TERMINAL.release()

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
