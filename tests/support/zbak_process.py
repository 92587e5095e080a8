"""``zbak`` as a real process, as the admin types it (``python -m zrepl_py --config FILE
ARGS``), for the tests of a shared catalog, a shared bandwidth limit and holds on OpenZFS.

Kept minimal on purpose: one shared runner for every tier replaces it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TIMEOUT = 300.0
"""Seconds one command may take before the test fails (a loaded 2-CPU host is slow)."""


def argv(config: Path, *args: str) -> list[str]:
    """The command line of ``zbak --config CONFIG ARGS`` with this interpreter."""
    return [sys.executable, "-m", "zrepl_py", "--config", str(config), *args]


def start(config: Path, *args: str) -> subprocess.Popen[str]:
    """Start ``zbak --config CONFIG ARGS`` (stdout and stderr piped, text); the caller waits."""
    return subprocess.Popen(argv(config, *args), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(config: Path, *args: str, timeout: float = TIMEOUT) -> tuple[int, str, str]:
    """Run ``zbak --config CONFIG ARGS`` to its end; return (exit status, stdout, stderr)."""
    done = subprocess.run(argv(config, *args), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr
