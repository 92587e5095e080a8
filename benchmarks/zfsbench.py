"""Helpers the benchmarks share: run a command, read a guid, destroy with zfs-fuse's busy
retry, pick a tool's error line, rotate the order of tools between repetitions.

Benchmarks run as scripts (``python benchmarks/NAME.py``), so this module is imported by
its bare name from the benchmarks directory.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
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


def private_zfs_fuse(prefix: str) -> tuple[Path, Path]:
    """Enter a private mount namespace and start a zfs-fuse of its own there (as the test
    suite does, ``support.zfs``); return a new work directory under /var/tmp named
    ``PREFIX...`` and the daemon's pid file in it (``support.zfs._stop_private_daemon``)."""
    from support import zfs as testbed_zfs  # the tests directory is on sys.path first

    why_not = testbed_zfs._enter_private_namespace()
    if why_not:
        raise SystemExit(f"cannot get a private zfs-fuse: {why_not}")
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    pidfile = workdir / "zfs-fuse.pid"
    sh("/usr/sbin/zfs-fuse", "--no-kstat-mount", "--pidfile", str(pidfile))
    testbed_zfs._wait_for_daemon("zpool")
    return workdir, pidfile


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


def rotate(items: list, n: int) -> list:
    """``items`` rotated by ``n``, so no tool always runs first (warm caches)."""
    n %= len(items)
    return items[n:] + items[:n]
