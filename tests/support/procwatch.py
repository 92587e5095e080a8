"""Watch a running process through /proc: its live descendants, open descriptors and memory.

``ProcessWatch(pid)`` samples every ``interval`` seconds in a thread until ``stop()``:

- descendants: every process whose parent chain (``/proc/N/stat`` field 4, proc(5)) leads to
  ``pid``; a process that escapes the tree (an ssh ControlPersist master, reparented when
  its first client exits) is not counted, see ``extra_match`` for those;
- ``/proc/PID/fd`` entries of the process itself and the largest count of any descendant;
- ``VmHWM`` (peak resident set, kB, proc(5)) of the process, monotonic, so the last
  sample holds the run's peak.

Sampling misses processes that live shorter than ``interval``: peaks are lower bounds of the
true peaks, which is what a bound assertion needs to be meaningful only when the sampled run
is long against ``interval`` (a load run: hundreds of pipelines of a second or less each).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable


def _parents() -> dict[int, int]:
    """``{pid: ppid}`` of every process visible in /proc (races with exits are skipped)."""
    table: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # comm (field 2) may hold spaces and parentheses: the state and ppid follow the last ')'
        fields = stat[stat.rindex(b")") + 2:].split()
        table[int(entry)] = int(fields[1])
    return table


def descendants(pid: int, parents: dict[int, int] | None = None) -> list[int]:
    """Pids of every live descendant of ``pid`` (children, grandchildren, ...)."""
    parents = _parents() if parents is None else parents
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def open_fds(pid: int) -> int | None:
    """Number of entries in ``/proc/PID/fd``; None when the process is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` (``/proc/PID/cmdline``); [] when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [a.decode(errors="replace") for a in handle.read().split(b"\0") if a]
    except OSError:
        return []


def vm_hwm_kib(pid: int) -> int | None:
    """``VmHWM`` of ``pid`` in KiB (peak resident set size so far); None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclasses.dataclass
class Peaks:
    """What a ``ProcessWatch`` saw.

    Attributes:
        samples: samples taken.
        descendants: most live descendants in one sample.
        fds: most open descriptors of the watched process in one sample.
        child_fds: most open descriptors of any one descendant in one sample.
        hwm_kib: the watched process's last ``VmHWM`` read (its peak RSS), KiB.
        extra: most live processes matching ``extra_match`` in one sample.
        distinct: distinct descendant pids seen (processes started, lower bound).
        names: distinct descendants seen, by ``argv[0]`` basename (lower bounds).
        fd_series: ``(seconds since start, fds)`` of the watched process, one per sample.
        widest: the argv of every descendant in the sample that had the most of them.
    """

    samples: int = 0
    descendants: int = 0
    fds: int = 0
    child_fds: int = 0
    hwm_kib: int = 0
    extra: int = 0
    distinct: int = 0
    names: dict[str, int] = dataclasses.field(default_factory=dict)
    fd_series: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    widest: list[list[str]] = dataclasses.field(default_factory=list)


class ProcessWatch:
    """Sample ``pid`` every ``interval`` seconds in a daemon thread (see the module doc).

    Args:
        pid: the process to watch.
        interval: seconds between samples.
        extra_match: optional ``argv -> bool``; processes anywhere on the machine it accepts
            are counted per sample into ``Peaks.extra`` (e.g. ssh masters under a control dir).
    """

    def __init__(self, pid: int, interval: float = 0.05,
                 extra_match: Callable[[list[str]], bool] | None = None):
        self.pid, self.interval, self.extra_match = pid, interval, extra_match
        self.peaks = Peaks()
        self._seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch-{pid}", daemon=True)
        self._start = time.monotonic()

    def start(self) -> ProcessWatch:
        """Start sampling; returns self."""
        self._thread.start()
        return self

    def stop(self) -> Peaks:
        """Stop sampling and return the peaks."""
        self._stop.set()
        self._thread.join()
        return self.peaks

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        """Take one sample now."""
        p = self.peaks
        parents = _parents()
        kids = descendants(self.pid, parents)
        if len(kids) > p.descendants:
            p.descendants = len(kids)
            p.widest = [cmdline(k) for k in kids]
        for kid in kids:
            p.child_fds = max(p.child_fds, open_fds(kid) or 0)
            if kid not in self._seen:
                argv = cmdline(kid)
                name = os.path.basename(argv[0]) if argv else "?"
                self._seen[kid] = name
                p.names[name] = p.names.get(name, 0) + 1
        p.distinct = len(self._seen)
        fds = open_fds(self.pid)
        if fds is not None:
            p.fds = max(p.fds, fds)
            p.fd_series.append((time.monotonic() - self._start, fds))
        hwm = vm_hwm_kib(self.pid)
        if hwm is not None:
            p.hwm_kib = max(p.hwm_kib, hwm)
        if self.extra_match is not None:
            p.extra = max(p.extra, sum(1 for q in parents if self.extra_match(cmdline(q))))
        p.samples += 1
