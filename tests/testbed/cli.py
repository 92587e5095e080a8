"""Helpers shared by tests that drive zfs and the zbak CLI: run ``zfs``, read a property,
run ``zbak`` in-process."""

from __future__ import annotations

import subprocess
from pathlib import Path

from zrepl_py.cli import main
from zrepl_py.errors import ExitStatus


def zfs(*args: str) -> str:
    """Run ``zfs ARGS`` (the test session's zfs-fuse); return stdout; raise on failure."""
    return subprocess.run(["zfs", *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout


def prop(name: str, what: str) -> str:
    """One property of a dataset or snapshot, parsable (``zfs get -Hp``)."""
    return zfs("get", "-Hp", "-o", "value", what, name).strip()


class Zbak:
    """Runs the real CLI in-process against one config; returns (exit status, stdout, stderr)."""

    def __init__(self, config: Path, capsys):
        self.config, self.capsys = config, capsys

    def __call__(self, *args: str) -> tuple[ExitStatus, str, str]:
        self.capsys.readouterr()
        status = main(["--config", str(self.config), *args], env={})
        out, err = self.capsys.readouterr()
        return status, out, err
