"""The package layout holds (docs/decisions.md#pure-planners-load-no-database-code): pure planners
load no database code, the packages of zrepl_py import each other without a cycle, and only the
foundations stay at the top level.

The import graph is read from the source with ``ast`` (every import, also those inside
functions and under ``TYPE_CHECKING``), so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import zrepl_py

PACKAGE = Path(zrepl_py.__file__).parent

PLANNERS = (
    "zrepl_py.catalog.rows",
    "zrepl_py.catalog.chains",
    "zrepl_py.replication.planner",
    "zrepl_py.archive.planner",
    "zrepl_py.pruning.rules",
    "zrepl_py.pruning.snapshot_plan",
    "zrepl_py.pruning.chain_plan",
    "zrepl_py.pruning.last_copy",
    "zrepl_py.copying.plan",
    "zrepl_py.catalog.paths",
    "zrepl_py.restore.plan",
    "zrepl_py.audit.graph",
    "zrepl_py.audit.restorable",
    "zrepl_py.daemon.plan",
    "zrepl_py.failover.plan",
    "zrepl_py.drill.plan",
    "zrepl_py.objects.generations",
)
"""The pure planners (docs/style.md#planners-are-pure-and-drivers-are-thin): plain rows and config
in, a plan out."""

TOP_LEVEL = {"__init__.py", "__main__.py", "errors.py", "clock.py", "locking.py"}


@pytest.mark.parametrize("module", PLANNERS)
def test_a_planner_imports_no_sqlalchemy_nor_any_client_library(module):
    script = (f"import sys, {module}\n"
              "print(sorted({m.split('.')[0] for m in sys.modules}"
              " & {'sqlalchemy', 'alembic', 'boto3', 'botocore', 'paramiko', 'psycopg'}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]", f"{module} loads {done.stdout.strip()}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """The zrepl_py modules (or packages) ``path`` imports, absolute."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            found.update(f"{base}.{alias.name}" for alias in node.names)
            found.add(base)
    return {name for name in found if name.startswith("zrepl_py.")}


def _room(module: str) -> str:
    """The top-level package or module of zrepl_py that ``module`` belongs to."""
    return module.split(".")[1]


def package_graph() -> dict[str, set[str]]:
    """``{room: rooms it imports}`` over zrepl_py's top-level packages and modules."""
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    graph: dict[str, set[str]] = {room: set() for room in rooms}
    for path in PACKAGE.rglob("*.py"):
        source = _room(_module_name(path)) if path.parent != PACKAGE else path.stem
        for target in _imports(path):
            room = _room(target)
            if room in rooms and room != source:
                graph[source].add(room)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of rooms, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(room: str) -> list[str] | None:
        state[room] = 1
        stack.append(room)
        for nxt in sorted(graph[room]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[room] = 2
        return None

    for room in sorted(graph):
        if room not in state and (found := visit(room)):
            return found
    return None


def test_the_packages_of_zrepl_py_import_each_other_without_a_cycle():
    assert _cycle(package_graph()) is None, " -> ".join(_cycle(package_graph()) or [])


def test_only_the_foundations_stay_at_the_top_level():
    loose = {p.name for p in PACKAGE.glob("*.py")}
    assert loose == TOP_LEVEL


def _module_graph() -> dict[str, set[str]]:
    """``{module: zrepl_py modules it imports}`` at file level: an import of a name from a
    module counts as an import of that module, ``from PACKAGE import MODULE`` as one of the
    submodule (the package's ``__init__`` runs first anyway, so that edge is left out)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for target in _imports(path):
            if target in modules:
                found.add(target)
            elif target.rpartition(".")[0] in modules:
                found.add(target.rpartition(".")[0])  # a name defined in that module
        graph[name] = {m for m in found if m != name
                       and not (modules[m].name == "__init__.py" and name.startswith(m + "."))}
    return graph


def _package_of(module: str) -> str:
    path = PACKAGE.parent / (module.replace(".", "/") + "/__init__.py")
    return module if path.exists() else module.rpartition(".")[0]


def test_the_modules_of_one_package_import_each_other_without_a_cycle():
    """A lazy import that breaks a circle at run time still ties the two files together:
    neither can be read, tested or moved alone
    (docs/decisions.md#the-layout-test-checks-what-the-layering-promises)."""
    graph = _module_graph()
    inside = {m: {t for t in targets if _package_of(t) == _package_of(m)}
              for m, targets in graph.items()}
    assert _cycle(inside) is None, " -> ".join(_cycle(inside) or [])


IO_LIBRARIES = ("subprocess", "socket", "smtplib", "http.client", "urllib.request", "fcntl",
                "tempfile", "shutil", "sqlalchemy", "alembic", "boto3", "botocore", "paramiko",
                "psycopg", "apprise")
"""Libraries that reach outside the process: processes, sockets, locks and temporary files,
databases, object stores, mail and web hooks."""

IO_MODULES = (
    "zrepl_py.invocation",  # the run's context: config files, the catalog, hosts, stores
    "zrepl_py.zfs.client",  # runs zfs and zpool on a host
    "zrepl_py.zfs.capabilities",  # probes a host's zfs
    "zrepl_py.stores.open",  # opens the configured stores
    "zrepl_py.restore.gather",  # reads the catalog, the hosts and the stores for a restore
)
"""Modules that do I/O through the handles they hold or open, without importing an
``IO_LIBRARIES`` library themselves."""


def _io_modules() -> set[str]:
    """The zrepl_py modules that do I/O: those in ``IO_MODULES`` (or below them) and those
    that import an ``IO_LIBRARIES`` library (read with ``ast``, lazy imports too)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        if any(name == m or name.startswith(m + ".") for m in IO_MODULES):
            found.add(name)
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            if any(n == lib or n.startswith(lib + ".") for n in names for lib in IO_LIBRARIES):
                found.add(name)
    return found


@pytest.mark.parametrize("module", PLANNERS)
def test_a_planner_loads_no_module_that_does_io(module):
    """Not the invocation context, not a driver, not a module that starts processes or opens
    sockets, files or databases: a planner is tested with plain data alone
    (docs/decisions.md#the-layout-test-checks-what-the-layering-promises)."""
    script = (f"import sys, {module}\n"
              "print('\\n'.join(m for m in sys.modules if m.startswith('zrepl_py.')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    loaded = set(done.stdout.split())
    assert sorted(loaded & _io_modules()) == [], f"{module} loads I/O modules"


STDERR_READERS = {
    "zrepl_py/zfs/errors.py": "the one place that reads zfs's words",
    "zrepl_py/replication/rsync.py": "rsync's own stderr (its statistics and errors)",
    "zrepl_py/proc/pipeline.py": "any stage's 'Broken pipe' (the culprit rule)",
}
"""The modules that may read a command's stderr text, and whose stderr it is."""

_MATCHERS = {"search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split",
             "startswith", "endswith", "find", "index", "count"}


def _reads_stderr(node: ast.AST, tainted: set[str]) -> bool:
    """True when ``node`` mentions a command's stderr: ``.stderr``, ``.error_text``, a name
    ``stderr``, or a local name assigned from one of those."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in ("stderr", "error_text"):
            return True
        if isinstance(sub, ast.Name) and (sub.id == "stderr" or sub.id in tainted):
            return True
    return False


def _stderr_matches(path: Path) -> list[str]:
    """Lines of ``path`` that match a regex against stderr text or test it for words."""
    found = []
    for func in ast.walk(ast.parse(path.read_text())):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        tainted: set[str] = set()
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and _reads_stderr(node.value, tainted):
                tainted.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(func):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _MATCHERS \
                    and any(_reads_stderr(a, tainted) for a in [node.func.value, *node.args]):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
            elif isinstance(node, ast.Compare) \
                    and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                    and any(_reads_stderr(c, tainted) for c in node.comparators):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return sorted(set(found))


def test_zfs_stderr_is_read_only_in_zfs_errors():
    """Callers catch the types ``zfs/errors.py`` raises, never match zfs's words themselves:
    one table to extend when OpenZFS words a refusal anew
    (docs/decisions.md#the-layout-test-checks-what-the-layering-promises)."""
    assert _stderr_matches(PACKAGE / "zfs" / "errors.py"), "the check no longer sees a match"
    found = [line for path in sorted(PACKAGE.rglob("*.py"))
             if str(path.relative_to(PACKAGE.parent)) not in STDERR_READERS
             for line in _stderr_matches(path)]
    assert found == [], "stderr matched outside zfs/errors.py at " + ", ".join(found)
