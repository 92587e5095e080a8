"""Every option and argument of every command fed a hostile-value corpus
(docs/decisions.md#bad-input-is-one-line-and-its-exit-code at the command line;
docs/reliability.md#r34-name-validation-table).

The parameters are found by walking click's command tree; each must have a rule in ``RULES``
(a new option fails ``test_every_parameter_has_a_refusal_rule`` until it gets one). The
values: shell payloads and structurally bad names from the 10,000-name corpus, control
characters and ANSI escapes, 5,000-character strings, numbers at and beyond 64 bits, ``nan``,
``inf``, negatives, the empty string, and names on either side of OpenZFS's length limits.

For every case:

* exactly one line on stderr when the exit status is not 0, never a traceback or an internal
  error, no raw control character;
* a documented exit status (0, 1, 2; ``zbak serve``'s refusal 126);
* a value the parameter's rule says no command may accept (``must_refuse``) gets a non-zero
  documented refusal (2, or 126 from ``zbak serve``), never 0 and never 1 ("failed" is for a
  value that parses and names nothing that exists), and no child process starts.

The rule of a name parameter is the OpenZFS name rules, written out below from
``module/zcommon/zfs_namecheck.c`` (``entity_namecheck``, ``pool_namecheck``,
``zfs_component_namecheck``) and ``lib/libzfs/libzfs_pool.c`` (``zpool_name_valid``): not
zbak's own ``DatasetName``, so the test can find a name zbak accepts and ZFS never would.
zbak may refuse more than the rule does (it rejects ``%`` and a snapshot name starting with
``-``): a rule is a floor.

The values run in this process with ``main()``, one test case per parameter looping over
its ~140 values (cheap: the whole corpus in about a minute, 6,580 runs), with ``PATH``
holding only recording stand-ins for every program zbak starts (each logs its argv and
fails), so a child really starts and is seen; a fixed, seeded sample of 30 (parameter,
value) pairs (``PROCESS_SAMPLE``, one or more per parameter) also runs end to end as a
``zbak`` process under ``strace -f -e trace=execve``, which sees every program the process
tree executes whatever its path.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import re
import string
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from reliability.test_name_corpus_10k import SEED, hostile_names
from support.cli import run_zbak
from support.common import need_binary

from zrepl_py.cli import cli, main
from zrepl_py.errors import ExitStatus

# -- the oracle: OpenZFS's name rules -------------------------------------------------------

ZFS_MAX_DATASET_NAME_LEN = 256
"""``include/sys/fs/zfs.h``; a name must be shorter (room for the C string's NUL)."""
ORIGIN_DIR_NAME = "$ORIGIN"
"""``include/sys/dsl_dir.h``: a pool name leaves room for ``POOL/$ORIGIN@$ORIGIN``."""
ZFS_VALID_CHARS = frozenset(string.ascii_letters + string.digits + "-_.: ")
"""``valid_char()``: letters, digits, ``-_.:`` and space."""


def _too_long(name: str) -> bool:
    return len(name.encode()) >= ZFS_MAX_DATASET_NAME_LEN


def zfs_component_ok(part: str) -> bool:
    """``zfs_component_namecheck``: a snapshot's or bookmark's own name, or a prefix."""
    return bool(part) and not _too_long(part) and set(part) <= ZFS_VALID_CHARS


def zfs_entity_ok(path: str) -> bool:
    """``entity_namecheck``: ``[component/]*component[(@|#)component]?`` under 256 bytes, no
    leading ``/``; components of valid characters (and ``%``, for ZFS's own temporary
    clones), none empty; one delimiter at most and no ``/`` after it; a component that ends
    the name or a ``/`` is not ``.`` or ``..``."""
    match = re.fullmatch(r"([^@#]*)(?:([@#])(.*))?", path, re.DOTALL)
    if _too_long(path) or match is None or path.startswith("/"):
        return False
    head, delimiter, tail = match.group(1), match.group(2), match.group(3)
    parts = head.split("/")
    if delimiter and (not tail or re.search("[@#/]", tail)):
        return False
    ended = (parts[:-1] + [tail]) if delimiter else parts  # the ones checked for . and ..
    if "" in parts or any(p in (".", "..") for p in ended):
        return False
    return all(set(p) <= ZFS_VALID_CHARS | {"%"} for p in [*parts, tail or ""])


def zfs_pool_ok(pool: str) -> bool:
    """``pool_namecheck``: under 256 - 2 - 2 * len("$ORIGIN") bytes, valid characters only
    (no ``%``), a letter first, not ``mirror``, ``raidz`` or ``draid``. (``zpool_name_valid``
    rejects more at create and import time, ``spare*``, ``log``...; a pool made before that
    rule still opens, so a name of it is not refused here.)"""
    return (0 < len(pool.encode()) < ZFS_MAX_DATASET_NAME_LEN - 2 - 2 * len(ORIGIN_DIR_NAME)
            and set(pool) <= ZFS_VALID_CHARS and pool[0] in string.ascii_letters
            and pool not in ("mirror", "raidz", "draid"))


def zfs_dataset_ok(name: str) -> bool:
    """A filesystem or volume name: an entity without ``@``/``#`` in a valid pool."""
    return (zfs_entity_ok(name) and not re.search("[@#]", name)
            and zfs_pool_ok(name.split("/")[0]))


def zfs_snapshot_ok(name: str) -> bool:
    """``snapshot_namecheck`` (an entity with ``@``) of a valid dataset."""
    return zfs_entity_ok(name) and "@" in name and zfs_dataset_ok(name.split("@")[0])


def _float_ok(text: str, *, low_open: bool = False, high: float | None = None) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return (math.isfinite(value) and (value > 0 if low_open else value >= 0)
            and (high is None or value <= high))


def _path_ok(text: str) -> bool:
    """A path the kernel can be asked about: not empty, no NUL (path_resolution(7))."""
    return bool(text) and "\x00" not in text


def _duration_ok(text: str) -> bool:
    """A duration as ``zbak serve --help`` states it: a number and one of s, m, h, d, w, y
    (e.g. ``7d``), at most 100 years (the bound of every duration zbak reads)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdwy])\s*", text)
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return bool(match) and float(match[1]) * seconds[match[2]] <= 100 * 31536000


def _moment_ok(text: str) -> bool:
    """``catalog rebuild --not-after``, as its --help states it: an ISO 8601 time (what
    Python's ``datetime.fromisoformat`` reads) or a duration before now (``_duration_ok``)."""
    try:
        dt.datetime.fromisoformat(text.strip())
    except ValueError:
        return _duration_ok(text)
    return True


def _property_ok(text: str) -> bool:
    """A property name ZFS could hold (zfsprops(7): native names, ``user:props``,
    ``userquota@USER``, ``written@SNAP``): non-empty, under 256 bytes, printable ASCII."""
    return bool(text) and len(text) < 256 and all(" " <= c <= "~" for c in text)


# -- the rule of every parameter ---------------------------------------------------------

CONFIG_JOBS, CONFIG_STORES = {"j"}, {"cold"}
"""The names the test's config defines (it has no ``[hosts]``)."""
DATASET = "tank/data"
"""The job's dataset, and the restore's dataset when the case is not about it."""


def _in_dataset(value: str) -> bool:
    """A dataset, or ``HOST:dataset`` naming a host the config has (only ``local``)."""
    host, colon, rest = value.partition(":")
    return zfs_dataset_ok(value) or (colon == ":" and host == "local" and zfs_dataset_ok(rest))


def _snapshot_of_dataset(value: str) -> bool:
    """``--to``: ``@NAME``, ``NAME`` or ``DATASET@NAME``, whole ``DATASET@NAME`` valid."""
    if "@" in value and not value.startswith("@"):
        return zfs_snapshot_ok(value)
    return zfs_component_ok(value.removeprefix("@")) and zfs_snapshot_ok(
        f"{DATASET}@{value.removeprefix('@')}")


def _file_path_ok(value: str) -> bool:
    """A file inside a dataset (``restore --path``, ``find PATH``): relative to its
    mountpoint, so not absolute and no ``..`` component; a path the kernel can be asked
    about (``_path_ok``)."""
    return _path_ok(value) and not value.startswith("/") and ".." not in value.split("/")


def _interval_ok(value: str) -> bool:
    """``status --interval``: seconds from 0.2 to 3600, as its --help says."""
    return _float_ok(value) and 0.2 <= float(value) <= 3600


def _mark_ok(value: str) -> bool:
    """A ZFS user property's value (zfsprops(7): at most 8192 bytes); printable."""
    return bool(value) and len(value.encode()) <= 8192 and value.isprintable()


RULES: dict[tuple[tuple[str, ...], str], Callable[[str], bool]] = {}
"""``(command path, parameter) -> acceptable(value)``: False means every command must refuse
the value. Every command's own ``--config`` is given after one naming the test's config, so
no corpus value is acceptable there (``rule``)."""
for _jobs_command in [("snapshot",), ("replicate",), ("archive",), ("prune",), ("audit",),
                      ("status",), ("list", "datasets"), ("list", "snapshots"),
                      ("list", "streams"), ("holds", "list"), ("holds", "release-stale"),
                      ("drill",), ("copy",)]:
    RULES[(_jobs_command, "jobs")] = CONFIG_JOBS.__contains__
RULES[(("failover",), "job")] = RULES[(("failback",), "job")] = CONFIG_JOBS.__contains__
for _identity_command in [("audit",), ("restore",), ("drill",), ("copy",)]:
    RULES[(_identity_command, "--identity")] = _path_ok  # an age identity file
for _replica_verb in ["promote", "demote", "release"]:
    RULES[(("replica", _replica_verb), "dataset")] = zfs_dataset_ok
RULES.update({
    (("audit",), "--sample"): lambda v: _float_ok(v, low_open=True, high=100),  # PERCENT
    (("audit",), "--max-duration"): _float_ok,
    (("audit",), "--stale-uploads-days"): _float_ok,
    (("audit",), "--receive-into"): _in_dataset,
    (("restore",), "dataset"): _in_dataset,
    (("restore",), "--to"): _snapshot_of_dataset,
    (("restore",), "--into"): _in_dataset,
    (("restore",), "--from"): lambda v: v in {"local", "replica", "archive"} | CONFIG_STORES,
    (("restore",), "--path"): _file_path_ok,
    (("restore",), "--into-dir"): _path_ok,
    (("find",), "dataset"): _in_dataset,
    (("find",), "path"): _file_path_ok,
    (("drill",), "--from"): lambda v: v in CONFIG_STORES or _in_dataset(v),
    (("copy",), "--from"): CONFIG_STORES.__contains__,
    (("copy",), "--to"): CONFIG_STORES.__contains__,
    (("failover",), "--target"): lambda v: False,  # the test's job has no replica target
    (("failback",), "--target"): lambda v: False,
    (("replica", "promote"), "--mark"): _mark_ok,
    (("replica", "promote"), "--mountpoint"): lambda v: v in ("none", "legacy") or (
        _path_ok(v) and v.startswith("/")),
    (("digest",), "snapshot"): zfs_snapshot_ok,
    (("digest",), "--zfs"): _path_ok,
    (("status",), "--interval"): _interval_ok,
    (("status",), "--prom-textfile"): _path_ok,
    (("catalog", "rebuild"), "store"): CONFIG_STORES.__contains__,
    (("catalog", "rebuild"), "--not-after"): _moment_ok,
    (("serve",), "--root"): zfs_dataset_ok,
    (("serve",), "--prefix"): zfs_component_ok,
    (("serve",), "--receive-set"): lambda v: "=" in v and _property_ok(v.split("=", 1)[0]),
    (("serve",), "--receive-exclude"): _property_ok,
    (("serve",), "--keep-newer-than"): _duration_ok,
    (("serve",), "--keep-last"): lambda v: False,  # needs --keep-newer-than (its --help)
    (("serve",), "--floor-journal"): _path_ok,
    (("serve",), "--failover-mounts"): _path_ok,
    (("serve",), "--log"): _path_ok,
    (("serve",), "--zfs"): _path_ok,
    (("serve",), "--zpool"): _path_ok,
    (("serve",), "--zstd"): _path_ok,
    (("serve",), "--mbuffer"): _path_ok,
    (("--config",), "--config"): lambda v: False,  # no corpus value names a config file
})
SKIP = {("daemon",)}
"""Commands that would run until stopped with an accepted value (its only valued option is a
``click.Choice``, which click itself checks)."""
REFUSED = {ExitStatus.USAGE}
SERVE_REFUSED = 126
"""``zbak serve``'s refusal (docs/design.md, the forced command): SSH's own "cannot execute"."""
DOCUMENTED = {ExitStatus.OK, ExitStatus.FAILED, ExitStatus.USAGE}

# -- the corpus --------------------------------------------------------------------------

SPECIAL = ["", " ", "-", "--", "-x", "--help", "\n", "\x00", "a\nb", "\x1b[31mred\x1b[0m",
           "\r\x7f\x85\u2028", "\u202e", "é", "x" * 5000, "tank/" + "y" * 5000,
           "0", "-1", "-0.5", "1e400", "nan", "NaN", "inf", "-inf",
           str(2**63 - 1), str(2**63), str(2**64), "-" + str(2**63 + 1), "9" * 400]
LIMITS = ["p" * 239, "p" * 240, "t/" + "x" * 253, "t/" + "x" * 254,
          "@" + "s" * (255 - len(DATASET) - 1), "@" + "s" * (256 - len(DATASET) - 1),
          "tank/%tmp", "mirror", "mirrors/x", "draid/x", "tank@", "tank#b"]
"""Names on either side of an OpenZFS limit: a 239-byte pool (valid) and a 240-byte one
(``pool_namecheck``: too long), a 255- and a 256-byte dataset, a ``--to`` whose full
snapshot name is 255 and 256 bytes, and the reserved and delimiter cases."""
SAMPLED_NAMES = int(os.environ.get("ZBAK_CORPUS_NAMES", "40"))
"""Hostile names drawn (seeded) from the 10,000-name corpus beside its first 60 (the
structural cases and every payload); ``ZBAK_CORPUS_NAMES=4940`` feeds all 5,000 to every
parameter (about 40 minutes; CI runs the sample)."""
PROCESS_SAMPLE = 30
"""Cases also run as a ``zbak`` process (``_process_cases``): about 0.5 s each on an idle
2-core host, 15 s in all."""
STAND_INS = ("zfs", "zpool", "ssh", "zstd", "mbuffer", "pv", "rsync", "setpriv", "sh",
             "sudo", "lz4", "gzip", "age", "sshd", "true")
"""The programs on the stand-ins' ``PATH``: every program zbak runs by name (a name not
here is "command not found", which starts nothing)."""


def _label(param: click.Parameter) -> str:
    return param.opts[-1] if isinstance(param, click.Option) else str(param.name)


def _commands() -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(cli)

    def walk(cmd: click.Command, path: tuple[str, ...]):
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                yield from walk(cmd.get_command(ctx, name), (*path, name))
        else:
            yield path, cmd

    yield from walk(cli, ())


def _valued(cmd: click.Command) -> list[click.Parameter]:
    return [p for p in cmd.params
            if not (isinstance(p, click.Option) and (p.is_flag or p.count))]


def cases() -> list[tuple[tuple[str, ...], str, str]]:
    """``(command path, parameter, value)`` for every valued parameter and corpus value."""
    rng = random.Random(SEED)
    names = hostile_names(rng, canary=Path("/nonexistent/canary"))
    values = SPECIAL + LIMITS + names[:60] + rng.sample(names[60:], SAMPLED_NAMES)
    found = [(("--config",), "--config", v) for v in values]
    for path, cmd in _commands():
        if path not in SKIP:
            found += [(path, _label(p), v) for p in _valued(cmd) for v in values]
    return found


def rule(path: tuple[str, ...], label: str) -> Callable[[str], bool]:
    """The acceptability rule of a parameter (every command's own ``--config`` shares one)."""
    if label == "--config" and path != ("--config",):
        return lambda value: False  # the test's config is named first; a second file differs
    return RULES[(path, label)]


CASES = cases()


def _process_cases() -> list[int]:
    """Indexes of ``PROCESS_SAMPLE`` cases: one per parameter (every command's ``jobs`` one
    parameter, and every command's own ``--config``), the rest drawn; all with ``SEED``.
    Values holding NUL are left out: execve(2) cannot pass one, only ``main()`` can get it."""
    rng = random.Random(SEED)
    strata: dict[tuple[object, str], list[int]] = {}
    for index, (path, label, value) in enumerate(CASES):
        if "\x00" not in value:
            shared = label in ("jobs", "--config") and path != ("--config",)
            strata.setdefault(("*" if shared else path, label), []).append(index)
    picked = {rng.choice(indexes) for indexes in strata.values()}
    rest = sorted(set().union(*strata.values()) - picked)
    return sorted(picked | set(rng.sample(rest, max(0, PROCESS_SAMPLE - len(picked)))))


PROCESS_CASES = _process_cases()


def _benign(param: click.Parameter) -> str:
    """A valid value for a required parameter the case is not about."""
    return {"to": "@0", "roots": "tank", "store": "cold"}.get(str(param.name), DATASET)


def _argv(path: tuple[str, ...], label: str, value: str, config: Path) -> list[str]:
    """The command line of one case: the tested parameter given ``value``, the command's
    other required options benign values, and its arguments in their declared order (after
    ``--`` when the value starts with "-": an argument, not an option; what a careful admin
    types)."""
    if path == ("--config",):
        return ["--config", value, "status"]
    cmd = dict(_commands())[path]
    param = next(p for p in cmd.params if _label(p) == label)
    options = [a for p in cmd.params if isinstance(p, click.Option) and p.required
               and p is not param for a in (p.opts[-1], _benign(p))]
    if isinstance(param, click.Option):
        return ["--config", str(config), *path, label, value, *options]
    arguments = [value if p is param else _benign(p) for p in cmd.params
                 if isinstance(p, click.Argument) and (p.required or p is param)]
    dashes = ["--"] if value.startswith("-") else []
    return ["--config", str(config), *path, *options, *dashes, *arguments]


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    """A valid config (job ``j`` of ``tank/data``, a file store ``cold``), initialised."""
    root = tmp_path_factory.mktemp("corpus")
    path = root / "zbak.toml"
    path.write_text(textwrap.dedent(f"""
        state_dir = "{root / 'state'}"
        [stores.cold]
        url = "file://{root / 'store'}"
        [jobs.j]
        dataset = "{DATASET}"
        [jobs.j.archive]
        store = "cold"
    """))
    assert main(["--config", str(path), "init", "--no-checks"], env={}) == ExitStatus.OK
    return path


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> tuple[Path, Path]:
    """A directory of stand-ins for ``STAND_INS``: each appends its name and arguments
    (NUL-separated, a newline after) to the log and exits 1 saying it is a stand-in.
    Returns ``(directory, log)``."""
    root = tmp_path_factory.mktemp("stand-ins")
    log = root / "started.log"
    for name in STAND_INS:
        script = root / name
        script.write_text(f"#!/bin/sh\nprintf '%s\\0' \"$0\" \"$@\" >> '{log}'\n"
                          f"printf '\\n' >> '{log}'\necho \"stand-in $0: not run\" >&2\nexit 1\n")
        script.chmod(0o755)
    return root, log


def _started(log: Path) -> list[list[str]]:
    """The argv of every stand-in started (and truncate the log)."""
    if not log.exists():
        return []
    text = log.read_bytes().decode("utf-8", "surrogateescape")
    log.write_bytes(b"")
    return [line.rstrip("\0").split("\0") for line in text.split("\0\n") if line]


def check(path: tuple[str, ...], label: str, value: str, status: int, err: str,
          started: list[list[str]]) -> None:
    """The assertions every case makes (see the module docstring)."""
    serve = path == ("serve",)
    assert status in DOCUMENTED | ({SERVE_REFUSED} if serve else set()), (status, err)
    assert "Traceback" not in err and "internal error" not in err, err
    lines = err.splitlines()
    if status != ExitStatus.OK:
        assert len(lines) == 1 and lines[0].strip(), f"not one line on stderr: {err!r}"
    body = err.replace("\n", "")
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in body), repr(err[:300])
    if not rule(path, label)(value):
        refused = REFUSED | ({SERVE_REFUSED} if serve else set())
        assert status in refused, f"{value[:80]!r} must be refused, got {status}: {err}"
        assert started == [], f"a refused value started {started}"


PARAMETERS = sorted({(path, label) for path, label, _ in CASES})


@pytest.mark.parametrize("path,label", PARAMETERS,
                         ids=[f"{' '.join(p)}:{lb}" for p, lb in PARAMETERS])
def test_every_hostile_value_of_a_parameter_gets_one_clear_line_and_a_refused_one_starts_no_child(
        path, label, config, stand_ins, capsys, tmp_path, monkeypatch):
    """One case per parameter (the corpus's ~140 values in a loop, so the suite's case count
    stays the count of what is tested): every value is checked, and the failures are listed
    together."""
    monkeypatch.chdir(tmp_path)  # a relative hostile path lands here
    directory, log = stand_ins
    monkeypatch.setenv("PATH", str(directory))
    failed = []
    for index, (_, _, value) in [(i, c) for i, c in enumerate(CASES) if c[:2] == (path, label)]:
        _started(log)
        capsys.readouterr()
        try:
            status = main(_argv(path, label, value, config), env={})
        except SystemExit as exc:  # zbak serve leaves through exit_now
            status = exc.code
        _, err = capsys.readouterr()
        try:
            check(path, label, value, status, err, _started(log))
        except AssertionError as exc:
            failed.append(f"case {index} {value[:60]!r}: {str(exc)[:300]}")
    assert not failed, f"{len(failed)} values failed:\n" + "\n".join(failed[:20])


_EXECVE = re.compile(r'execve\("((?:\\x[0-9a-f]{2})*)", \[(.*?)\]')
_STRING = re.compile(r'"((?:\\x[0-9a-f]{2})*)"')


def _executed(trace: Path) -> list[list[str]]:
    """The argv of every execve(2) ``strace -xx`` logged (hex-escaped strings decoded)."""
    def decode(text: str) -> str:
        return bytes.fromhex(text.replace("\\x", "")).decode("utf-8", "surrogateescape")

    return [[decode(s) for s in _STRING.findall(match.group(2))]
            for match in _EXECVE.finditer(trace.read_text())]


@pytest.mark.parametrize("index", PROCESS_CASES,
                         ids=[f"{' '.join(CASES[i][0])}:{CASES[i][1]}:{i}" for i in PROCESS_CASES])
def test_a_sampled_hostile_value_given_to_a_zbak_process_is_handled_alike(
        index, config, stand_ins, tmp_path):
    """The same checks on a ``zbak`` process (the console script, scrubbed environment,
    ``PATH`` of stand-ins only); the children are every execve(2) of its process tree as
    ``strace`` saw it, the first (zbak itself) excepted."""
    path, label, value = CASES[index]
    strace = need_binary("strace", "strace")
    directory, log = stand_ins
    trace = tmp_path / "execve.trace"
    ran = run_zbak(*_argv(path, label, value, config), cwd=tmp_path,
                   env={"PATH": str(directory)}, timeout=120, prefix=_strace(strace, trace))
    children = _executed(trace)[1:]
    _started(log)
    check(path, label, value, int(ran.status), ran.err, children)


def test_strace_sees_what_a_zbak_process_starts(config, stand_ins, tmp_path):
    """The process cases' child check can fail: a value zbak accepts (``nan`` is a valid
    pool name) makes ``audit --receive-into`` ask the ``zpool`` stand-in about it, and the
    trace shows that child with its argv."""
    strace = need_binary("strace", "strace")
    trace = tmp_path / "execve.trace"
    ran = run_zbak("--config", str(config), "audit", "--receive-into", "nan/x", cwd=tmp_path,
                   env={"PATH": str(stand_ins[0])}, prefix=_strace(strace, trace))
    children = _executed(trace)[1:]
    assert any(argv[0].endswith("zpool") and "nan" in argv for argv in children), children
    assert ran.status == ExitStatus.FAILED and len(ran.err.splitlines()) == 1, ran


def _strace(strace: str, trace: Path) -> list[str]:
    """``strace`` logging every execve(2) of the process tree to ``trace``, strings in hex."""
    return [strace, "-f", "-qq", "-e", "trace=execve", "-e", "signal=none", "-xx",
            "-s", "65536", "-o", str(trace)]


def test_every_parameter_has_a_refusal_rule():
    """A new option or argument fails here until ``RULES`` says which values it refuses."""
    missing = [(path, _label(p)) for path, cmd in _commands() if path not in SKIP
               for p in _valued(cmd) if _label(p) != "--config" and (path, _label(p)) not in RULES]
    assert missing == []


def test_the_oracle_follows_openzfs_on_known_names():
    """The rules above on names whose fate the OpenZFS source decides."""
    for name in ["tank", "tank/data", "a", "p" * 239, "t/" + "x" * 253, "tank/ a b :c",
                 "tank/-dash", "tank/%tmp"]:
        assert zfs_dataset_ok(name), name
    for name in ["", "/tank", "tank/", "tank//x", "tank/./x", "tank/..", "1tank", "-tank",
                 "p" * 240, "t/" + "x" * 254, "mirror", "raidz/x", "draid", "tank@s",
                 "tank#b", "tank/x$y", "tank/é", "tank/x\n"]:
        assert not zfs_dataset_ok(name), name
    for name in ["tank@s", "tank/d@s p:1", "tank@-x", "tank/d@" + "y" * 248]:
        assert zfs_snapshot_ok(name), name
    for name in ["tank", "tank@", "@s", "tank@a@b", "tank@a#b", "tank@a/b", "tank/d@" + "y" * 249,
                 "tank/.@s", "1t@s"]:
        assert not zfs_snapshot_ok(name), name
    assert zfs_component_ok("snap 1:x") and not zfs_component_ok("") \
        and not zfs_component_ok("s" * 256) and not zfs_component_ok("a/b")
    assert [(v, rule(("restore",), "--to")(v)) for v in LIMITS[4:6]] == [
        (LIMITS[4], True), (LIMITS[5], False)]
