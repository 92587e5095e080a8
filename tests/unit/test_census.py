"""``tests/support/census.py`` counts a test as running zbak as a process only when its body,
a fixture it requests or a helper it names (through the module, its conftests and
``support``) starts one; an in-process ``main()`` never counts."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support import census

SUPPORT = '''
import subprocess, sys
from pathlib import Path

ZBAK = Path(sys.executable).with_name("zbak")

def run_zbak(*args):
    return subprocess.run([str(ZBAK), *args])

class Zbak:
    def __call__(self, *args):
        return run_zbak(*args)
'''

TESTS = '''
import subprocess, sys
import pytest
from support.cli import Zbak, run_zbak
from zrepl_py.cli import main

@pytest.fixture
def runner(tmp_path):
    return Zbak()

def helper():
    return run_zbak("status")

def test_module_m(tmp_path):
    subprocess.run([sys.executable, "-m", "zrepl_py", "status"])

def test_through_a_fixture(runner):
    runner("status")

def test_through_a_helper():
    helper()

def test_through_the_crash_runner():
    subprocess.run([sys.executable, "tests/support/crash_runner.py"])

def test_in_process():
    main(["status"], env={})

def test_nothing(tmp_path):
    assert tmp_path
'''


@pytest.fixture
def tree(tmp_path) -> Path:
    (tmp_path / "support").mkdir()
    (tmp_path / "support" / "cli.py").write_text(textwrap.dedent(SUPPORT))
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_x.py").write_text(textwrap.dedent(TESTS))
    (tmp_path / "conftest.py").write_text("")
    return tmp_path


@pytest.mark.parametrize("name, expected", [
    ("test_module_m", True), ("test_through_a_fixture", True), ("test_through_a_helper", True),
    ("test_through_the_crash_runner", True), ("test_in_process", False),
    ("test_nothing", False),
])
def test_a_test_counts_as_running_zbak_only_when_something_it_reaches_starts_it(
        tree, name, expected):
    module = tree / "unit" / "test_x.py"
    support = [census._definitions(p) for p in sorted((tree / "support").glob("*.py"))]
    scope = census.Scope(module, support, tree)
    assert scope.runs_zbak(census._function_node(module, name)) is expected


def test_the_table_totals_every_tier():
    tiers = {"unit": census.Tier(2, 3, 0, 1), "e2e": census.Tier(1, 4, 4, 1)}
    lines = census.table(tiers, markdown=True).splitlines()
    assert lines[-1] == "| total | 3 | 7 | 4 | 2 |"
