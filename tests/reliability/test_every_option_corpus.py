"""docs/decisions.md#bad-input-is-one-line-and-its-exit-code, a suite that finds the next ones:
every option and argument of every command (found by walking click's command tree, so a new option
is covered without editing this test) is fed a hostile-value corpus: shell payloads and structurally
bad names from the 10,000-name corpus, control characters and ANSI escapes, 5,000-character strings,
numbers at and beyond 64 bits, ``nan``, ``inf``, negatives and the empty string.

For every case: the documented exit status (2 for a value zbak refuses; never 1 from an
internal error), at most one line on stderr per problem and never a traceback, no raw control
character on stderr, and no child process started with the value (``proc.spawn`` is the one
way zbak starts one, so recording it there sees every child). Children are recorded and not
run: this test is about argument handling, the real-component suites run the commands.
"""

from __future__ import annotations

import errno
import os
import random
import textwrap
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from reliability.test_name_corpus_10k import SEED, hostile_names

from zrepl_py.cli import cli, main
from zrepl_py.errors import ExitStatus, InvalidName
from zrepl_py.files.paths import InvalidPath, parse_path
from zrepl_py.proc import spawn
from zrepl_py.serve.execute import REFUSED
from zrepl_py.zfs.names import DatasetName, check_short_name

SPECIAL = ["", " ", "-", "--", "-x", "--help", "\n", "\x00", "a\nb", "\x1b[31mred\x1b[0m",
           "\r\x7f\x85\u2028", "\u202e", "é", "x" * 5000, "tank/" + "y" * 5000,
           "0", "-1", "-0.5", "1e400", "nan", "NaN", "inf", "-inf",
           str(2**63 - 1), str(2**63), str(2**64), "-" + str(2**63 + 1), "9" * 400]
SAMPLED_NAMES = int(os.environ.get("ZBAK_CORPUS_NAMES", "40"))
"""Hostile names drawn (seeded) from the 10,000-name corpus beside its first 60 (the
structural cases and every payload); ``ZBAK_CORPUS_NAMES=4940`` feeds all 5,000 to every
parameter (about 40 minutes; CI runs the sample, about 30 s)."""
SKIP = {("daemon",)}
"""Commands that would run until stopped with an accepted value (their only option is a
``click.Choice``, which click itself checks)."""
ALLOWED = {ExitStatus.OK, ExitStatus.USAGE, ExitStatus.FAILED, REFUSED}
"""2 for a value zbak refuses; 1 where a value parses but names nothing known (a restore of
an unknown dataset); ``zbak serve``'s refusal is its documented 126."""


def _commands() -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(cli)

    def walk(cmd: click.Command, path: tuple[str, ...]):
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                yield from walk(cmd.get_command(ctx, name), (*path, name))
        else:
            yield path, cmd

    yield from walk(cli, ())


def _fill(cmd: click.Command, skip: click.Parameter) -> list[str]:
    """Benign values for the command's other required parameters."""
    argv: list[str] = []
    for param in cmd.params:
        if param is skip or not param.required:
            continue
        value = {"to": "@0", "roots": "tank", "store": "cold"}.get(param.name, "tank/data")
        argv += [param.opts[-1], value] if isinstance(param, click.Option) else [value]
    return argv


def cases() -> list[tuple[tuple[str, ...], str, str]]:
    """``(command path, parameter, value)`` for every valued parameter and corpus value."""
    rng = random.Random(SEED)
    names = hostile_names(rng, canary=Path("/nonexistent/canary"))
    values = SPECIAL + names[:60] + rng.sample(names[60:], SAMPLED_NAMES)
    found = [(("--config",), "--config", v) for v in values]
    for path, cmd in _commands():
        if path in SKIP:
            continue
        for param in cmd.params:
            if isinstance(param, click.Option) and (param.is_flag or param.count):
                continue
            label = param.opts[-1] if isinstance(param, click.Option) else param.name
            found += [(path, label, v) for v in values]
    return found


CASES = cases()


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """A valid config (one job, a file store) with an initialised catalog."""
    root = tmp_path_factory.mktemp("corpus")
    path = root / "zbak.toml"
    path.write_text(textwrap.dedent(f"""
        state_dir = "{root / 'state'}"
        [stores.cold]
        url = "file://{root / 'store'}"
        [jobs.j]
        dataset = "tank/data"
        [jobs.j.archive]
        store = "cold"
    """))
    assert main(["--config", str(path), "init", "--no-checks"], env={}) == ExitStatus.OK
    return path


@pytest.fixture
def children(monkeypatch) -> list[list[str]]:
    """Every child zbak asks to start, not started: each answers 'command not found'."""
    seen: list[list[str]] = []

    def record(argv, *args, **kwargs):
        seen.append(list(argv))
        raise FileNotFoundError(errno.ENOENT, "recorded, not started", argv[0])

    monkeypatch.setattr(spawn, "run", record)
    monkeypatch.setattr(spawn, "popen", record)
    return seen


def _argv(path: tuple[str, ...], label: str, value: str, config) -> list[str]:
    if path == ("--config",):
        return ["--config", value, "status"]
    cmd = dict(_commands())[path]
    param = next(p for p in cmd.params
                 if (p.opts[-1] if isinstance(p, click.Option) else p.name) == label)
    if isinstance(param, click.Option):
        return ["--config", str(config), *path, label, value, *_fill(cmd, param)]
    # Arguments in their declared order, the tested one with the value, after ``--`` when it
    # starts with "-" (as an argument, not an option; what a careful admin types).
    options = [a for p in cmd.params if isinstance(p, click.Option) and p.required
               for a in (p.opts[-1], {"to": "@0", "roots": "tank", "store": "cold"}.get(
                   p.name, "tank/data"))]
    arguments = [value if p is param else "tank/data" for p in cmd.params
                 if isinstance(p, click.Argument) and (p.required or p is param)]
    dashes = ["--"] if value.startswith("-") else []
    return ["--config", str(config), *path, *options, *dashes, *arguments]


@pytest.mark.parametrize("path,label,value", CASES,
                         ids=[f"{' '.join(p)}:{l}:{i}" for i, (p, l, _) in enumerate(CASES)])
def test_a_hostile_value_gets_one_clear_line_and_starts_no_child_with_it(
        path, label, value, config, children, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative hostile path lands here
    capsys.readouterr()
    try:
        status = main(_argv(path, label, value, config), env={})
    except SystemExit as exc:  # zbak serve leaves through exit_now
        status = exc.code
    out, err = capsys.readouterr()
    assert status in ALLOWED, err
    if status == ExitStatus.FAILED:  # only a value that parses may get as far as failing
        assert _valid_value(label, value.removeprefix("@")), err
    assert "Traceback" not in err and "internal error" not in err, err
    if status != ExitStatus.OK:
        assert err.strip(), "a failure says why on stderr"
    body = err.replace("\n", "")
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in body), repr(err[:300])
    if len(value) >= 3 and not _valid_value(label, value):
        # The job's own dataset may hold a hostile value as a substring ("tank/"): that
        # argument is the config's name reaching zfs, not the value.
        assert not [argv for argv in children
                    if any(value in a for a in argv if a != "tank/data")]


FILE_PATHS = {"path", "--path"}
"""Parameters naming a file inside a dataset (``zbak find PATH``, ``zbak restore --path``):
any relative path ``files.paths`` accepts is valid, spaces, newlines and ``$(...)`` included
(docs/decisions.md#a-file-path-is-relative-to-the-dataset); it reaches a child only as one
argv element."""
DIRECTORIES = {"--into-dir", "--identity"}
"""Parameters naming a directory or a file of this machine: any text without a NUL byte."""


def _valid_value(label: str, value: str) -> bool:
    """``_valid_name``, or a valid file path or directory for the parameters that take one."""
    if label in FILE_PATHS:
        try:
            parse_path(value)
        except InvalidPath:
            return False
        return True
    if label in DIRECTORIES:
        return bool(value) and "\x00" not in value
    return _valid_name(value)


def _valid_name(value: str) -> bool:
    """True for a valid dataset, pool or snapshot name (``nan`` may name a pool: zbak may
    ask zpool about it; `` `` may name a snapshot)."""
    for check in (DatasetName, check_short_name):
        try:
            check(value)
        except InvalidName:
            continue
        return True
    return False
