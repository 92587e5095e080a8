"""The uploads' bandwidth limit (``archive.throttle``): pacing by a fake clock that the
waits advance, so the figures are exact. The real uploads under it: the archive test in
``tests/e2e/test_bandwidth_timetable.py``."""

from __future__ import annotations

import datetime as dt

from zrepl_py.archive.throttle import SLICE, Throttle
from zrepl_py.clock import FixedClock
from zrepl_py.values.timetable import parse_timetable

MiB = 1024 * 1024


class Time:
    """A monotonic clock that only ``sleep`` moves, tied to a wall clock (``wall``)."""

    def __init__(self, wall: FixedClock):
        self.now = 0.0
        self.wall = wall
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds
        self.wall.advance(dt.timedelta(seconds=seconds))


def rig(table, start="2026-11-30T07:59:50"):
    wall = FixedClock(dt.datetime.fromisoformat(start).replace(tzinfo=dt.UTC))
    clock = Time(wall)
    throttle = Throttle(parse_timetable(table), wall, monotonic=clock.monotonic,
                        sleep=clock.sleep)
    return throttle, clock


def chunks(count: int, size: int = MiB):
    return (b"x" * size for _ in range(count))


def test_bytes_go_at_the_limit_in_force():
    throttle, clock = rig("1MiB")
    sent = [(clock.now, len(piece)) for piece in throttle.chunks(chunks(4))]
    assert sum(size for _, size in sent) == 4 * MiB
    assert max(size for _, size in sent) == SLICE, "cut into slices while limited"
    # the last slice goes when 4 MiB less one slice have had their time at 1 MiB/s
    assert sent[-1][0] == (4 * MiB - SLICE) / MiB


def test_a_boundary_changes_the_rate_within_the_reading_interval():
    """07:59:50 on a Monday: 1 MiB/s (the default) until 08:00, then the window's 4 MiB/s."""
    throttle, clock = rig({"mon-fri 08:00-18:00": "4MiB", "default": "1MiB"})
    sent = [(clock.now, len(piece)) for piece in throttle.chunks(chunks(50))]

    def rate(start: float, end: float) -> float:
        return sum(size for at, size in sent if start <= at < end) / (end - start)

    assert abs(rate(0, 9) - MiB) <= SLICE  # before the boundary at 10 s
    assert abs(rate(10 + throttle.every, 20) - 4 * MiB) <= 2 * SLICE
    assert throttle.limit == 4 * 1024**2


def test_off_passes_the_chunks_untouched_and_never_waits():
    throttle, clock = rig({"mon-fri 08:00-18:00": "off", "default": "off"})
    data = [b"a" * (3 * MiB), b"b"]
    assert list(throttle.chunks(data)) == data and clock.slept == 0


def test_an_idle_spell_earns_no_burst():
    throttle, clock = rig("1MiB")
    list(throttle.chunks(chunks(1)))
    clock.sleep(60)  # nothing uploaded for a minute
    start = clock.now
    sent = [clock.now for _ in throttle.chunks(chunks(2))]
    assert sent[-1] - start == (2 * MiB - SLICE) / MiB
