"""Helpers the benchmarks share: run a command, read a guid, destroy with zfs-fuse's busy
retry, pick a tool's error line, rotate the order of tools between repetitions.

Benchmarks run as scripts (``python benchmarks/NAME.py``), so this module is imported by
its bare name from the benchmarks directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path


def sh(*argv: str, timeout: float = 600) -> str:
    """Run argv, return stdout stripped; RuntimeError with stderr on failure."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout.strip()


def guid(name: str) -> int:
    """The guid of a dataset or snapshot."""
    return int(sh("zfs", "get", "-Hp", "-o", "value", "guid", name))


def destroy(*names: str) -> None:
    """``zfs destroy NAME`` each in order (no -r), retried while zfs-fuse says busy."""
    for name in names:
        for _ in range(100):
            done = subprocess.run(["zfs", "destroy", name], capture_output=True, text=True)
            if done.returncode == 0 or "does not exist" in done.stderr:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"cannot destroy {name}: {done.stderr.strip()}")


def last_line(text: str, width: int = 200) -> str:
    """The last error-looking line of a tool's output (else its last line), shortened."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"CRITICAL|ERROR|error|cannot|failed", line)]
    return (errors or lines or [""])[-1][:width]


def target_line(target: str, ours: float | None, reference: float | None, *,
                ours_failed: Sequence[str], reference_failed: Sequence[str] = (),
                peer: str = "", verdict: Callable[[float, float], str]) -> str:
    """The line of one goal (pure): ``target TARGET: VERDICT`` with ``verdict(ours,
    reference)`` when both were measured; when every zbak run failed (no ``ours``),
    ``MISSED`` with the failures, since a goal zbak cannot run at all is not met; when the
    peer's runs all failed, ``not measured`` with theirs; else ``not measured (not run)``.

    Args:
        ours / reference: zbak's figure and what it is held against (the peer's median,
            or the goal's own bound), None when not measured.
        ours_failed / reference_failed: the failure messages of zbak's and the peer's runs.
        peer: the peer's name, for its failures.
    """
    if ours is not None and reference is not None:
        return f"target {target}: {verdict(ours, reference)}"
    if ours is None and ours_failed:
        return f"target {target}: MISSED, every zbak run failed ({_failures(ours_failed)})"
    if reference is None and reference_failed:
        return (f"target {target}: not measured, every {peer} run failed"
                f" ({_failures(reference_failed)})")
    return f"target {target}: not measured (not run)"


def _failures(messages: Sequence[str]) -> str:
    return f"{len(messages)}x: {messages[0]}"


def rotate(items: list, n: int) -> list:
    """``items`` rotated by ``n``, so no tool always runs first (warm caches)."""
    n %= len(items)
    return items[n:] + items[:n]


@contextlib.contextmanager
def private_zfs_fuse(work: Path) -> Iterator[Path]:
    """Enter a private mount namespace and run a zfs-fuse of this process's own there (as
    the test sessions do, tests/support/zfs.py), its pid file in ``work`` (yielded); stop it
    at the end. Needs ``tests`` on ``sys.path`` and root.

    Raises:
        SystemExit: the namespace cannot be made.
    """
    from support import zfs as support_zfs  # tests/ is on the path by now

    why_not = support_zfs._enter_private_namespace()
    if why_not:
        raise SystemExit(f"cannot get a private zfs-fuse: {why_not}")
    pidfile = work / "zfs-fuse.pid"
    sh("/usr/sbin/zfs-fuse", "--no-kstat-mount", "--pidfile", str(pidfile))
    try:
        support_zfs._wait_for_daemon("zpool")
        yield pidfile
    finally:
        support_zfs._stop_private_daemon(pidfile)


def load() -> str:
    """The load averages (1, 5, 15 minutes), as uptime(1) shows them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(argv: list[str], log: Path) -> list[str]:
    """``argv`` run under GNU time, which writes ``%M %U %S`` (peak RSS KiB, user and
    system CPU seconds of the process and the children it waited for) to ``log``.

    Why not wait4(2) from here: Linux starts a child's ``ru_maxrss`` at its parent's RSS
    at fork (exec records the old mm's high-water mark), so every child of this big
    benchmark process would report this process's RSS; GNU time is a small parent."""
    return ["/usr/bin/time", "-f", "%M %U %S", "-o", str(log), *argv]


def usage(log: Path) -> tuple[int, float]:
    """``(peak RSS bytes, CPU seconds)`` from a :func:`timed` log."""
    rss, user, system = log.read_text().split("\n")[-2].split()
    return int(rss) * 1024, float(user) + float(system)
