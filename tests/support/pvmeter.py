"""What the ``pv`` processes below a running zbak really pass: a sampler of their byte counters
(``/proc/PID/io`` ``wchar``; zbak runs ``pv -C``, which writes with write(2), so every byte
of the stream is counted) and the rates they add up to.

Used by the shared ``bandwidth_limit`` test: it measures the limit from outside, on the real
pipelines, without asking zbak what it did."""

from __future__ import annotations

import bisect
import dataclasses
import os
import threading
import time

from support.procwatch import cmdline, descendants

INTERVAL = 0.05
"""Seconds between two samples (a pv at 8 MiB/s moves 0.4 MiB in that time)."""


def _written(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/io") as handle:
            for line in handle:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


@dataclasses.dataclass
class PvSampler:
    """Samples, every ``INTERVAL`` seconds while it runs (``with``), the bytes each
    rate-limiting ``pv`` below process ``root`` has written (not the short-lived ``pv -R``
    that set their rates).

    Attributes:
        series: ``{pv pid: [(monotonic seconds, bytes written so far), ...]}``.
    """

    root: int
    series: dict[int, list[tuple[float, int]]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pv-sampler", daemon=True)

    def __enter__(self) -> PvSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL):
            now = time.monotonic()
            for pid in descendants(self.root):
                argv = cmdline(pid)
                if not argv or os.path.basename(argv[0]) != "pv" or "-R" in argv:
                    continue
                written = _written(pid)
                if written is not None:
                    self.series.setdefault(pid, []).append((now, written))

    def window(self) -> tuple[float, float]:
        """``(first, last)``: the first sample in which a pv had written anything and the
        last sample of any pv (monotonic seconds): the elapsed transfer time."""
        return (min(t for s in self.series.values() for t, written in s if written),
                max(s[-1][0] for s in self.series.values()))

    def total(self, at: float) -> float:
        """Bytes all pvs had written at ``at``: each pv's counter interpolated linearly
        between the samples around ``at`` (a late sample would otherwise stretch or shrink
        a one-second window by up to a sampling interval: +-5 % and more on a loaded host);
        before a pv's first sample its first value, after its last its last."""
        done = 0.0
        for samples in self.series.values():
            index = bisect.bisect_right(samples, (at, float("inf")))
            if index == 0:
                done += samples[0][1]
            elif index == len(samples):
                done += samples[-1][1]
            else:
                (t0, w0), (t1, w1) = samples[index - 1], samples[index]
                done += w0 + (w1 - w0) * (at - t0) / (t1 - t0)
        return done

    def rate(self, begin: float, end: float) -> float:
        """Bytes per second all pvs together passed between ``begin`` and ``end``."""
        return (self.total(end) - self.total(begin)) / (end - begin)

    def running(self, begin: float, end: float) -> int | None:
        """How many pvs ran from ``begin`` to ``end`` (sampled before or at ``begin`` and after
        ``end``); None when one started or ended in between."""
        at_begin = sum(1 for s in self.series.values() if s[0][0] <= begin < s[-1][0])
        at_end = sum(1 for s in self.series.values() if s[0][0] <= end < s[-1][0])
        return at_begin if at_begin == at_end else None
