"""The test suite's census: per tier, how many test functions, collected cases, cases on a
real component, and test functions that run ``zbak`` as a process.

Run by hand from the repository root (docs/development.md#tests quotes its table)::

    .venv/bin/python tests/support/census.py [--markdown]

* functions: test functions (a parametrized function counts once);
* cases: the items pytest collects (each parameter set counts);
* real component: cases carrying a marker of a real component (``zfs``, ``ssh``, ``s3``,
  ``pg``, ``openzfs``; the fixtures add them, see ``support.zfs`` and its siblings);
* zbak processes: test functions that start ``zbak`` as a process: their body, a fixture they
  request or a module-level helper they name (followed transitively through the module, its
  conftests and ``tests/support``) starts the console script or ``python -m zrepl_py``, or
  uses the crash runner. Static, so it over-counts a test that requests such a fixture and
  never calls it; it never counts an in-process ``main()``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "e2e", "reliability", "disaster")
REAL = frozenset({"zfs", "ssh", "s3", "pg", "openzfs"})
TESTS = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Tier:
    """The figures of one tier (see the module docstring)."""

    functions: int = 0
    cases: int = 0
    real: int = 0
    processes: int = 0


def _collect(tests: Path) -> list[dict[str, object]]:
    """``[{"file", "function", "markers"}]`` of every collected case (``pytest
    --collect-only`` in a child process, with this module as its plugin)."""
    code = ("import sys, pytest; sys.path.insert(0, sys.argv[1]); import census; "
            "sys.exit(pytest.main([sys.argv[2], '--collect-only', '-q', '-p', "
            "'no:cacheprovider'], plugins=[census.Dump()]))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(tests)],
                          capture_output=True, text=True, cwd=tests.parent, check=False)
    rows = [json.loads(line[len(Dump.TAG):]) for line in done.stdout.splitlines()
            if line.startswith(Dump.TAG)]
    if done.returncode != 0 or not rows:
        raise RuntimeError(f"collection failed ({done.returncode}): {done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    return rows


class Dump:
    """A pytest plugin printing one JSON line per collected item."""

    TAG = "CENSUS "

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            function = getattr(item, "originalname", item.name)
            cls = getattr(item, "cls", None)
            print(self.TAG + json.dumps({
                "file": str(Path(item.fspath)),
                "function": f"{cls.__name__}.{function}" if cls else function,
                "markers": sorted({m.name for m in item.iter_markers()}),
            }))


def _is_seed(node: ast.AST) -> bool:
    """True for code that starts zbak as a process by itself: an argv holding ``-m
    zrepl_py``, the console script next to the interpreter (``with_name("zbak")``) or the
    crash runner."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.List | ast.Tuple):
            values = [e.value for e in sub.elts if isinstance(e, ast.Constant)]
            if "zrepl_py" in values and "-m" in values:
                return True
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                and sub.func.attr == "with_name" and sub.args
                and isinstance(sub.args[0], ast.Constant) and sub.args[0].value == "zbak"):
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) \
                and sub.value.endswith("crash_runner.py"):
            return True
    return False


def _names(node: ast.AST) -> set[str]:
    """Every bare name ``node`` reads, and the parameters of its functions (fixtures)."""
    found = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
            found |= {a.arg for a in sub.args.args + sub.args.kwonlyargs}
    return found


def _definitions(path: Path) -> dict[str, ast.AST]:
    """Module-level functions, classes and assigned names of ``path``."""
    found: dict[str, ast.AST] = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node
    return found


class Scope:
    """Resolves names for one test module: the module, its conftests (nearest first), then
    every ``tests/support`` module (they are plugins: their fixtures are global)."""

    def __init__(self, module: Path, support: list[dict[str, ast.AST]], root: Path = TESTS):
        layers = [_definitions(module)]
        for folder in module.parents:
            if (folder / "conftest.py").is_file():
                layers.append(_definitions(folder / "conftest.py"))
            if folder == root:
                break
        self.layers = layers + support
        self._memo: dict[int, bool] = {}

    def runs_zbak(self, node: ast.AST, seen: set[int] | None = None) -> bool:
        """True when ``node`` or a definition it names (transitively) is a seed."""
        seen = set() if seen is None else seen
        if id(node) in self._memo:
            return self._memo[id(node)]
        if id(node) in seen:
            return False
        seen.add(id(node))
        answer = _is_seed(node) or any(
            self.runs_zbak(target, seen) for target in self._resolve(_names(node)))
        if answer:
            self._memo[id(node)] = True
        return answer

    def _resolve(self, names: Iterable[str]) -> Iterator[ast.AST]:
        for name in names:
            for layer in self.layers:
                if name in layer:
                    yield layer[name]
                    break


def _function_node(module: Path, qualified: str) -> ast.AST | None:
    tree = ast.parse(module.read_text(), str(module))
    scope: list[ast.stmt] = tree.body
    *classes, name = qualified.split(".")
    for cls in classes:
        match = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if match is None:
            return None
        scope = match.body
    return next((n for n in scope if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                 and n.name == name), None)


def census(tests: Path = TESTS) -> dict[str, Tier]:
    """The figures per tier of the suite under ``tests`` (collects it: ~30 s)."""
    rows = _collect(tests)
    support = [_definitions(p) for p in sorted((tests / "support").glob("*.py"))
               if p.name != Path(__file__).name]  # its own seed patterns are no test's
    tiers = {name: Tier() for name in TIERS}
    functions: dict[tuple[str, str], str] = {}
    for row in rows:
        path = Path(str(row["file"]))
        tier = path.relative_to(tests).parts[0]
        if tier not in tiers:
            continue
        tiers[tier].cases += 1
        tiers[tier].real += bool(REAL.intersection(row["markers"]))  # type: ignore[arg-type]
        functions[(str(path), str(row["function"]))] = tier
    scopes: dict[str, Scope] = {}
    for (file, function), tier in functions.items():
        tiers[tier].functions += 1
        scope = scopes.setdefault(file, Scope(Path(file), support, tests))
        node = _function_node(Path(file), function)
        tiers[tier].processes += bool(node is not None and scope.runs_zbak(node))
    return tiers


def table(tiers: dict[str, Tier], markdown: bool = False) -> str:
    """The census as a text or Markdown table, with a total row."""
    head = ("tier", "test functions", "cases", "cases on a real component",
            "functions running zbak as a process")
    total = Tier(*(sum(getattr(t, f.name) for t in tiers.values())
                   for f in dataclasses.fields(Tier)))
    body = [(name, t.functions, t.cases, t.real, t.processes)
            for name, t in [*tiers.items(), ("total", total)]]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                     for row in [head, *body])


if __name__ == "__main__":
    print(table(census(), markdown="--markdown" in sys.argv[1:]))
