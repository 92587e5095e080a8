"""One bandwidth limit shared by the concurrent pipelines of a run (``[replicate]
bandwidth_limit`` with ``concurrency``).

Each pipeline limits its stream with a ``pv -L RATE`` stage (Debian ``pv``); started one
per dataset, side by side, they would each take the whole limit. ``SharedRate`` keeps their
sum within it: every pv starts at ``total / most`` (``most``: the run's concurrency), and
whenever a pipeline is about to start or has ended, the limit is divided again equally
among the pipelines, through pv's remote control (``pv -R PID -L RATE``, pv(1) "-R,
--remote PID"). A pipeline about to start lowers the running ones first (``lease``), and
after it started it is raised to its share, so the sum never passes the total on the way.
When a pipeline ends, the others are raised a moment later (``raise_after``), not at once:
in a tree, the worker that finished takes the next dataset's lease right away, the share is
the same again and no message is needed (raised at once, every dataset cost each running pv
a raise and a lowering, about 0.07 s each, serialised under the lock: 100 datasets at
concurrency 4 about 40 s). A pipeline that has just started is raised the same moment after
its start, by a timer of its own, and no division raises it before: most of a tree's
pipelines have ended by then, and a ``pv -R`` to a pv that is ending waits for it in vain
under the lock (raised at its start, a tree of 101 small datasets at concurrency 8 took
30-51 s instead of 4-7 s). Raising is never needed for the limit, only to fill the link.

``pv -R`` waits until the pv it controls has read the message (about a second at most)
and fails otherwise (pv 1.6.20 and later, ``pv_remote_set``): a pv built without remote
control, one that has just ended, one a loaded host did not run in time. That pv keeps its
rate: a missed raise leaves the link unfilled; a missed lowering leaves the pv above its
share (the sum may pass the total until it is lowered) and nobody is raised. So the
division is tried again ``RETRY_AFTER`` seconds later, and twice as long after each further
miss in a row, while that pipeline holds its lease (under load, the last transfer of a run
missed its raise when the one before ended, and ran at half the limit to its end). At most
``RETRIES`` times in a row: a pv without remote control misses every message, and a
``pv -R`` to a live pv that misses it holds the lock about a second; after that the pv is
told again only by the next division (a start, an end, a new total).
``-C``: no splice(2), so the byte meter can read pv's counters (``transport.stages``).

The limit may change while the pipelines run (``bandwidth_limit`` as a timetable,
``replication.bandwidth.follow``): ``SharedRate.set_total`` divides the new one in the same
way (the running pvs above their new share lowered first). Without a limit ("off" in a timetable
that has limited windows) every pv runs at ``UNLIMITED``: ``pv -R PID -L 0`` does not lift a
pv's limit (pv 1.6.20 keeps the old one; measured), so a window's end raises the pvs to a
rate no link reaches instead (a pv at 1 PB/s moved 1000 MiB from /dev/zero as fast as one
without ``-L``; docs/decisions.md#a-new-limit-reaches-running-transfers).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from zrepl_py.proc import spawn

log = logging.getLogger(__name__)

_OPTIONS = ("-q", "-C")  # pv -R sends every display option too: the same ones each time
_REMOTE_TIMEOUT = 5.0  # seconds a `pv -R` may take before it is given up
RAISE_AFTER = 0.3
"""Seconds after a pipeline ended before the others are raised to the new share."""
RETRY_AFTER = 1.0
"""Seconds after a pv missed its message before the division is tried again (twice as long
after each further miss in a row): about as long as a ``pv -R`` waits, so that a loaded host
has had as much time again to run the pv."""
RETRIES = 5
"""The most retries after one pv's misses in a row (the last some 30 s after the first
miss): a pv that never answers gets these few, not a ``pv -R`` every few seconds to its
end."""
UNLIMITED = 10**15
"""Bytes per second of a pv while no limit is in force (see the module doc)."""


class SharedRate:
    """A limit of ``total`` bytes per second over at most ``most`` pipelines at once.

    Each pipeline takes a ``lease`` before it starts (its pv stage is ``Lease.argv``), tells
    it its pv's process id once started and closes it when done.

    Args:
        total: bytes per second, > 0; None: no limit now (every pv at ``UNLIMITED``, so a
            later ``set_total`` can still limit it).
        most: the most pipelines that run at once (>= 1).
        tell: ``tell(pid, rate)`` sets a running pv's rate and says whether it worked
            (default ``remote_control``).
        raise_after: seconds between a pipeline's end and raising the others, and between
            a pipeline's start and raising it (0: at once, in the calling thread; else in a
            timer thread).
        retry_after: seconds after a pv missed its message before dividing again (doubled
            after each further miss in a row; in a timer thread).

    Thread-safe: pipelines start and end in several threads.
    """

    def __init__(self, total: int | None, most: int, *,
                 tell: Callable[[int, int], bool] | None = None,
                 raise_after: float = RAISE_AFTER, retry_after: float = RETRY_AFTER):
        if (total is not None and total <= 0) or most < 1:
            raise ValueError(f"a shared rate needs total > 0 and most >= 1, got {total}, {most}")
        self.total = total
        self.most = most
        self._tell = tell or remote_control
        self._lock = threading.Lock()
        self._leases: dict[Lease, _Pv | None] = {}  # its pv once started
        self._raise_after = raise_after
        self._retry_after = retry_after
        self._timer: threading.Timer | None = None  # a raise pending

    @property
    def start_rate(self) -> int:
        """Bytes per second every pv starts at: ``total / most`` (``UNLIMITED`` without a
        total)."""
        return UNLIMITED if self.total is None else max(1, self.total // self.most)

    def set_total(self, total: int | None) -> None:
        """Make ``total`` the limit from now on (None: none) and divide it among the running
        pipelines at once (those above their new share first, ``_divide``).

        Raises:
            ValueError: ``total`` is not positive.
        """
        if total is not None and total <= 0:
            raise ValueError(f"a shared rate needs total > 0, got {total}")
        with self._lock:
            if total == self.total:
                return
            self.total = total
            self._divide()

    def lease(self) -> Lease:
        """A place for one more pipeline: the running ones are lowered to make room before
        it starts."""
        lease = Lease(self)
        with self._lock:
            self._leases[lease] = None
            self._divide()
        return lease

    def _started(self, lease: Lease, pid: int) -> None:
        with self._lock:
            if lease not in self._leases:
                return
            self._leases[lease] = _Pv(pid, self.start_rate, time.monotonic())
            if self._raise_after <= 0:
                self._divide()
                return
        self._later(self._raise_after, self._raise_one, lease)

    def _raise_one(self, lease: Lease) -> None:
        """Raise ``lease``'s pv to its share, if it still runs (its start's timer), after
        lowering any pv that missed its lowering."""
        with self._lock:
            if self._leases.get(lease) is not None:
                self._divide(only=lease)

    def _ended(self, lease: Lease) -> None:
        with self._lock:
            if self._leases.pop(lease, ...) is ... or not self._leases:
                return
            if self._raise_after <= 0:
                self._divide()
            elif self._timer is None:
                self._timer = self._later(self._raise_after, self._raise)

    def _later(self, delay: float, function: Callable[..., None],
               *args: object) -> threading.Timer:
        """Run ``function(*args)`` ``delay`` seconds from now, in a daemon thread."""
        timer = threading.Timer(delay, function, args)
        timer.daemon = True
        timer.start()
        return timer

    def _raise(self) -> None:
        with self._lock:
            self._timer = None
            self._divide()

    def _retry(self, lease: Lease) -> None:
        """Divide again after ``lease``'s pv missed a message, if it still runs."""
        with self._lock:
            pv = self._leases.get(lease)
            if pv is not None:
                pv.retrying = False
                self._divide()

    def _share(self) -> int:
        """Bytes per second of each lease now: ``total / leases`` (called with leases held;
        ``UNLIMITED`` without a total)."""
        if self.total is None:
            return UNLIMITED
        return max(1, self.total // len(self._leases))

    def _divide(self, only: Lease | None = None) -> None:
        """Every running pv to ``total / leases``: those above it first; the others are
        raised only when all of those were lowered (a pv that missed the message still runs
        at its old rate until a retry, ``_set``), except those started less than
        ``raise_after`` ago (their own timer raises them: ``only``, the one lease raised
        then). A pv not started yet will start at ``start_rate``, never more than its
        share."""
        if not self._leases:
            return
        share = self._share()
        running = [(lease, pv) for lease, pv in self._leases.items() if pv is not None]
        lowered = True
        for lease, pv in running:
            if pv.rate > share and not self._set(lease, pv, share):
                lowered = False
        if lowered:
            settled = time.monotonic() - self._raise_after
            for lease, pv in running:
                raising = lease is only if only is not None else pv.started <= settled
                if pv.rate < share and raising:
                    self._set(lease, pv, share)

    def _set(self, lease: Lease, pv: _Pv, rate: int) -> bool:
        """Tell ``lease``'s pv its new rate (bytes per second) and say whether it took it;
        after a miss, ``_retry`` later (the module doc). Called with the lock held."""
        if self._tell(pv.pid, rate):
            pv.rate, pv.misses = rate, 0
            return True
        pv.misses += 1
        if pv.misses <= RETRIES and not pv.retrying:
            pv.retrying = True
            self._later(self._retry_after * 2 ** (pv.misses - 1), self._retry, lease)
        return False


@dataclasses.dataclass
class _Pv:
    """A started pipeline's pv, as its ``SharedRate`` knows it (changed under its lock)."""

    pid: int
    rate: int  # bytes per second it was last told, or started at
    started: float  # time.monotonic() at its start
    misses: int = 0  # messages missed in a row
    retrying: bool = False  # a ``_retry`` is pending


class Lease:
    """One pipeline's part of a ``SharedRate`` (see there); ``close`` it in every case."""

    def __init__(self, shared: SharedRate):
        self._shared = shared
        self.argv: tuple[str, ...] = ("pv", *_OPTIONS, "-L", str(shared.start_rate))
        """The pipeline's pv stage, at the start rate."""

    def started(self, pid: int) -> None:
        """The pipeline started, its pv as process ``pid``: raise it to its share."""
        self._shared._started(self, pid)

    def close(self) -> None:
        """The pipeline ended (or never started): the others share its part."""
        self._shared._ended(self)


def remote_control(pid: int, rate: int) -> bool:
    """Set the rate of the running pv ``pid`` (``pv -R PID ... -L RATE``); False when pv
    says it could not (logged at debug: the pv keeps its rate)."""
    argv = ["pv", "-R", str(pid), *_OPTIONS, "-L", str(rate)]
    try:
        done = spawn.run(argv, stdin=spawn.DEVNULL, capture_output=True, timeout=_REMOTE_TIMEOUT,
                         check=False)
    except (OSError, spawn.SubprocessError) as exc:
        log.debug("pv -R %d: %s", pid, exc)
        return False
    if done.returncode != 0:
        log.debug("pv -R %d -L %d: exit %d: %s", pid, rate, done.returncode,
                  done.stderr.decode(errors="replace").strip())
        return False
    return True
