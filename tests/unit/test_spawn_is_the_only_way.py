"""docs/decisions.md#every-child-process-starts-through-spawn: ``zrepl_py.proc.spawn`` is the one
way zrepl_py starts a child process, so no child can be started with this process's secret
environment variables by forgetting a filter (as the ``setpriv`` probe once was)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import zrepl_py
from zrepl_py.proc import spawn

PACKAGE = Path(zrepl_py.__file__).parent
SPAWNING_OS_CALLS = {"system", "popen", "posix_spawn", "posix_spawnp", "fork", "forkpty"} | {
    f"{kind}{suffix}" for kind in ("exec", "spawn")
    for suffix in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}


def _offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name in ("subprocess", "pty")]
        elif isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "pty"):
            found.append(f"from {node.module} import ...")
        elif (isinstance(node, ast.Attribute) and node.attr in SPAWNING_OS_CALLS
              and isinstance(node.value, ast.Name) and node.value.id == "os"):
            found.append(f"os.{node.attr}")
    return [f"{path.relative_to(PACKAGE)}:{what}" for what in found]


def test_no_module_but_spawn_imports_subprocess_or_calls_an_os_exec_function():
    offences = [o for p in sorted(PACKAGE.rglob("*.py")) if p.name != "spawn.py"
                or p.parent.name != "proc" for o in _offences(p)]
    assert offences == []


@pytest.mark.parametrize("start", ["run", "popen"])
def test_a_child_started_through_spawn_never_sees_a_secret_variable(start, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    monkeypatch.setenv("ZBAK_SMTP_PASSWORD", "hunter2")
    monkeypatch.setenv("ZBAK_PLAIN", "kept")
    argv = ["env"]
    if start == "run":
        out = spawn.run(argv, capture_output=True, text=True, check=True).stdout
    else:
        proc = spawn.popen(argv, stdout=spawn.PIPE, text=True)
        out, _ = proc.communicate(timeout=10)
    assert "s3cr3t" not in out and "hunter2" not in out
    assert "ZBAK_PLAIN=kept" in out.splitlines()


def test_a_given_environment_is_filtered_too():
    out = spawn.run(["env"], env={"PATH": os.environ["PATH"], "AWS_SESSION_TOKEN": "tok",
                                  "KEEP": "1"}, capture_output=True, text=True).stdout
    assert out.split() == ["PATH=" + os.environ["PATH"], "KEEP=1"]


def test_a_shell_is_refused():
    with pytest.raises(TypeError, match="never starts a shell"):
        spawn.run(["true"], shell=True)
