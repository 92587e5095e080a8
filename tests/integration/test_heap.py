"""The console entry point keeps glibc's malloc to two arenas (``runtime.heap``;
docs/performance.md#the-peak-memory-of-a-long-archive), seen in a fresh interpreter by
glibc's own ``malloc_stats`` after threads allocated: two "Arena" sections, where an
interpreter without the setting lists one per thread."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from zrepl_py.runtime.heap import ARENAS

_PROBE = textwrap.dedent("""
    import ctypes, sys, threading
    if sys.argv[1] == "zbak":
        from zrepl_py.cli import entry_point
        sys.argv = ["zbak", "--version"]
        try:
            entry_point()
        except SystemExit:
            pass
    barrier = threading.Barrier(6)
    kept = []

    def allocate():
        barrier.wait()  # all alive at once: none can take over another's arena
        kept.append([bytes(64 << 10) for _ in range(8)])  # malloc'd, below the mmap threshold
        barrier.wait()

    threads = [threading.Thread(target=allocate) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ctypes.CDLL(None).malloc_stats()  # glibc: one "Arena N:" section per arena, on stderr
""")


def _arenas(how: str) -> int:
    done = subprocess.run([sys.executable, "-c", _PROBE, how], capture_output=True, text=True,
                          check=True, timeout=60)
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_stats")
def test_zbak_keeps_two_arenas_where_threads_would_each_take_one() -> None:
    assert _arenas("plain") > 2  # the probe sees the threads' arenas
    assert _arenas("zbak") == ARENAS
