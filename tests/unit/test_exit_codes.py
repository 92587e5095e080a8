"""Exit codes are an API: each error class maps to its ExitStatus in process and as a subprocess."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zrepl_py import errors
from zrepl_py.cli import main
from zrepl_py.errors import ExitStatus


def test_exit_codes_match_the_design():
    """docs/reliability.md#r45-exit-code-table."""
    assert [int(s) for s in ExitStatus] == [0, 1, 2, 3, 4, 75]


@pytest.mark.parametrize(
    "cls, status",
    [
        (errors.ZbakError, ExitStatus.FAILED),
        (errors.UsageError, ExitStatus.USAGE),
        (errors.InvalidName, ExitStatus.USAGE),
        (errors.Locked, ExitStatus.LOCKED),
        (errors.HostKeyMismatch, ExitStatus.FAILED),
        (errors.CatalogError, ExitStatus.FAILED),
    ],
)
def test_each_error_class_carries_its_exit_status(cls, status):
    """docs/reliability.md#r45-exit-code-table."""
    assert cls.exit_status == status


def test_help_lists_every_exit_code(capsys):
    """docs/reliability.md#r28-concurrent-runs: the Locked exit code is listed in --help.
    docs/reliability.md#r45-exit-code-table."""
    assert main(["--help"], env={}) == ExitStatus.OK
    out = capsys.readouterr().out
    for status in ExitStatus:
        assert f"{int(status):>3}  " in out


def test_bad_usage_exits_2_in_process_and_as_a_subprocess(capsys):
    """docs/reliability.md#r45-exit-code-table."""
    assert main(["no-such-command"], env={}) == ExitStatus.USAGE
    proc = subprocess.run([sys.executable, "-m", "zrepl_py", "no-such-command"], capture_output=True)
    assert proc.returncode == ExitStatus.USAGE


def test_a_missing_config_exits_2_as_a_subprocess(tmp_path):
    """docs/reliability.md#r45-exit-code-table."""
    proc = subprocess.run([sys.executable, "-m", "zrepl_py", "--config", str(tmp_path / "x.toml"),
                           "status"], capture_output=True, text=True)
    assert proc.returncode == ExitStatus.USAGE
    assert "x.toml" in proc.stderr
