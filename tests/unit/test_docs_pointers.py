"""Every pointer to the design record resolves inside the repository
(docs/decisions.md#the-design-record-lives-in-docs).

Scanned: every file ``git ls-files`` lists that decodes as UTF-8 (code, tests, benchmarks,
scripts, examples, docker/, migrations/, README.md and docs/ itself).

(a) A pointer ``docs/<file>.md`` or ``docs/<file>.md#<anchor>`` names a tracked file, and the anchor
    is the id of one of its headings as MkDocs makes it: python-markdown's ``toc`` extension
    (slugify: lower case, characters other than letters, digits, spaces, hyphens and
    underscores dropped, each run of spaces and hyphens one hyphen; a repeated heading gets
    ``_1``, ``_2``), rendered with the extensions MkDocs enables by default. A relative link
    ``[text](TARGET)`` in a Markdown file is held to the same rule.
(b) None of the old forms, which point at text a clone does not have: a ticket number
    (``issue`` or ``issues`` followed by a number or a quoted title), the old case numbers
    (the word RELIABILITY in capitals, ``case N``), house-rule numbers (``house rule N``), the
    contract files by name (DESIGN, RELIABILITY, STYLE, TESTBED or BENCHMARKS with ``.md``),
    and any path under ``../shared/`` except ``../shared/zfsvm``, which names a program the
    test bed runs (the OpenZFS guest), not a document.

    Public references stay allowed: an upstream tracker is cited by the project's name and
    ``#N`` or its URL (``paramiko issues #1115``, ``openzfs #7966``, ``CPython gh-132983``);
    the ``#`` keeps them out of (b). This file states the forms and is not scanned for (b).
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from pathlib import Path

import markdown
import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

POINTER = re.compile(r"(?<![\w./-])docs/((?:[\w-]+/)*[\w-]+\.md)(?:#([\w-]+))?")
LINK = re.compile(r"\]\(([^)\s]+)\)")
OLD_FORMS = {
    "ticket number": re.compile(r"\bissues?\s+(?:\d|\")", re.IGNORECASE),
    "old case number": re.compile(r"RELIABILITY|(?i:\bcases?\s+\d)"),
    "house rule number": re.compile(r"\bhouse\s+rules?\s+\d", re.IGNORECASE),
    "contract file": re.compile(r"\b(?:DESIGN|RELIABILITY|STYLE|TESTBED|BENCHMARKS)\.md\b"),
    "path outside the repository": re.compile(r"\.\./shared\b(?!/zfsvm)"),
}
"""The old forms (b), by the kind of text they point at."""


def _tracked() -> dict[str, str]:
    """Tracked text files by repository path: their text."""
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode()
    texts = {}
    for name in filter(None, listing.split("\0")):
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            texts[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return texts


@functools.cache
def _files() -> dict[str, str]:
    return _tracked()


def _anchors(text: str) -> set[str]:
    """The heading ids MkDocs gives a Markdown page."""
    md = markdown.Markdown(extensions=["toc", "tables", "fenced_code"])
    md.convert(text)
    ids: set[str] = set()
    pending = list(md.toc_tokens)
    while pending:
        token = pending.pop()
        ids.add(token["id"])
        pending.extend(token["children"])
    return ids


@functools.cache
def _anchors_of(name: str) -> frozenset[str]:
    return frozenset(_anchors(_files()[name]))


TEST_NAME = re.compile(r"`(tests/[\w/]+\.py)::([\w:]+)`")


@functools.cache
def _defined(path: str) -> set[str]:
    """``name`` and ``Class::name`` of every function defined in the Python file ``path``."""
    names: set[str] = set()
    for node in ast.parse(_files()[path]).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(f"{node.name}::{item.name}" for item in node.body
                         if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef))
    return names


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _target_problem(target: str, anchor: str | None) -> str | None:
    """Why ``target`` (a repository path) with ``anchor`` does not resolve, or None."""
    if target not in _files():
        return f"no file {target}"
    if anchor is None or not target.endswith(".md"):
        return None
    if anchor not in _anchors_of(target):
        return f"no heading #{anchor} in {target}"
    return None


def _pointer_problems(name: str, text: str) -> list[str]:
    found = []
    for match in POINTER.finditer(text):
        problem = _target_problem("docs/" + match[1], match[2])
        if problem:
            found.append(f"{name}:{_line(text, match.start())}: {match[0]}: {problem}")
    if name.endswith(".md"):
        for match in LINK.finditer(text):
            link = match[1]
            if re.match(r"[a-z][a-z0-9+.-]*:", link, re.IGNORECASE):
                continue  # a URL
            path, _, anchor = link.partition("#")
            target = (Path(name).parent / path).as_posix() if path else name
            target = _normalised(target)
            problem = _target_problem(target, anchor or None)
            if problem:
                found.append(f"{name}:{_line(text, match.start())}: ({link}): {problem}")
    return found


def _normalised(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            parts = parts[:-1] if parts else [".."]
        else:
            parts.append(part)
    return "/".join(parts)


def _old_form_problems(name: str, text: str) -> list[str]:
    found = []
    for kind, pattern in OLD_FORMS.items():
        for match in pattern.finditer(text):
            line = text.splitlines()[_line(text, match.start()) - 1].strip()
            found.append(f"{name}:{_line(text, match.start())}: {kind}: {line[:120]}")
    return found


def test_the_slug_is_python_markdowns():
    page = "## R14: wrong checksum\n### A `zfs send -I`  --  step\n## R14: wrong checksum\n"
    assert _anchors(page) == {"r14-wrong-checksum", "a-zfs-send-i-step", "r14-wrong-checksum_1"}


def test_every_pointer_into_docs_names_a_file_and_heading_that_exist():
    problems = [problem for name, text in sorted(_files().items())
                for problem in _pointer_problems(name, text)]
    assert not problems, f"{len(problems)} pointer(s) do not resolve:\n" + "\n".join(problems)


def test_every_test_the_docs_list_exists():
    problems = []
    for name, text in sorted(_files().items()):
        if not name.startswith("docs/"):
            continue
        for match in TEST_NAME.finditer(text):
            path, test = match[1], match[2]
            if path not in _files() or test not in _defined(path):
                problems.append(f"{name}:{_line(text, match.start())}: no test {path}::{test}")
    assert not problems, f"{len(problems)} listed test(s) missing:\n" + "\n".join(problems)


def test_a_decision_heading_holds_letters_digits_spaces_and_hyphens_only():
    text = _files()["docs/decisions.md"]
    bad = [line for line in text.splitlines()
           if line.startswith("#") and not re.fullmatch(r"#+ [A-Za-z0-9 -]+", line)]
    assert not bad, "headings of docs/decisions.md outside the rule:\n" + "\n".join(bad)


def test_no_pointer_of_an_old_form_is_left():
    problems = [problem for name, text in sorted(_files().items()) if name != THIS
                for problem in _old_form_problems(name, text)]
    assert not problems, f"{len(problems)} old-form pointer(s):\n" + "\n".join(problems)


@pytest.mark.parametrize("text, kind", [
    ("see issue 15 item 2", "ticket number"),
    ("(Issue 20: 604 MiB)", "ticket number"),
    ('issue "Cold storage" item 3', "ticket number"),
    ("RELIABILITY 39/40", "old case number"),
    ("the DST case (case 31)", "old case number"),
    ("house rule 10", "house rule number"),
    ("see DESIGN.md", "contract file"),
    ("`../shared/RELIABILITY.md`", "path outside the repository"),
])
def test_each_old_form_is_caught(text, kind):
    assert any(problem.split(": ")[1] == kind for problem in _old_form_problems("f", text))


@pytest.mark.parametrize("text", [
    "paramiko issues #1115/#1705",
    "openzfs #7966",
    "CPython gh-132983",
    "zfsvm=${ZBAK_ZFSVM:-$repo/../shared/zfsvm/zfsvm}",
    "docs/reliability.md#r14-wrong-checksum",
])
def test_a_public_reference_and_the_pointers_themselves_pass(text):
    assert _old_form_problems("f", text) == []


# The broken pointers below are spelled DOCS/ so that the scan of this file passes.
@pytest.mark.parametrize("text, problem", [
    ("DOCS/reliability.md#r99-no-such-case", "no heading #r99-no-such-case in DOCS/reliability.md"),
    ("see DOCS/nowhere.md", "no file DOCS/nowhere.md"),
    ("DOCS/reliability.md#r14-wrong-checksum", None),
])
def test_a_pointer_to_a_missing_file_or_heading_is_caught(text, problem):
    found = _pointer_problems("f.py", text.replace("DOCS/", "docs/"))
    assert (found[0].rsplit(": ", 1)[1].replace("docs/", "DOCS/") if found else None) == problem


def test_a_relative_markdown_link_is_checked_too():
    text = "[the case](reliability.md#r99-none) [up](../README.md)"
    found = _pointer_problems("DOCS/x.md".lower(), text)
    assert [problem.replace("docs/", "DOCS/") for problem in found] \
        == ["DOCS/x.md:1: (reliability.md#r99-none): no heading #r99-none in DOCS/reliability.md"]
