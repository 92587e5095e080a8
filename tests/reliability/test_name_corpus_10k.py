"""At scale (docs/reliability.md#r33-quoting-corpus,
docs/reliability.md#r34-name-validation-table): 10,000 generated dataset and snapshot
names.

Beside ``tests/integration/test_quoting_corpus.py`` (a few hundred hand-picked strings), this
corpus is generated from a fixed seed: 5,000 VALID names built from every valid ZFS character
(``[A-Za-z0-9-_.: ]``: space and ``:`` included) in pool, child and snapshot positions, and
5,000 HOSTILE ones: valid names with a shell metacharacter, a command substitution that would
create a canary file, a control or non-ASCII character spliced in, or a structural break
(empty, ``//``, ``.``/``..``, reserved or digit-led pool, two ``@``, a snapshot name starting
with ``-``, over 255 bytes). Classification is by construction, not by asking the code under
test.

* validation: every valid name is accepted by ``DatasetName``/``SnapshotName`` and reaches the
  ``zfs`` argv of the ``Zfs`` client unchanged; every hostile one raises ``InvalidName`` and no
  process starts (the client's executor records nothing);
* transport: both halves pass as argv through ``LocalExecutor``, ``SSHExecutor`` (paramiko, to
  the test sshd) and the OpenSSH client, many names per command (``printf '%s\\0' ...``), and
  arrive byte-identical; the canary file is never created.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
from support.executor import FaultyExecutor, RecordingExecutor

from zrepl_py.errors import InvalidName
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.proc.openssh import remote_command, ssh_argv
from zrepl_py.proc.ssh import SSHExecutor
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import MAX_NAME_LEN, DatasetName, SnapshotName

VALID_CHARS = string.ascii_letters + string.digits + "-_.: "
POOL_FIRST = "".join(c for c in string.ascii_letters if c not in "cdlmrs")
"""Letters that cannot start a reserved pool name (mirror, raidz, draid, spare, log, c0...)."""
METACHARACTERS = "><`'\"@&$()$x\\/.* !#;|\n${x}"
SHELL_CHARS = sorted(set(METACHARACTERS + "\t\r\x1b\x7f\x01~%^[]?=,+{}") - set(VALID_CHARS + "/@"))
"""Characters that never belong in a ZFS name (``/`` and ``@`` are structural, tested apart)."""
NON_ASCII = ["é", "ß", "数", "\u202e", "\u00a0", "\U0001f4be"]
VALID_COUNT = HOSTILE_COUNT = 5_000
SEED = 20_240_107
COMMAND_BUDGET = 96 * 1024
"""Bytes of quoted arguments per command: a remote command is one argv element on both ends
(ssh's and the remote shell's ``-c``), limited to MAX_ARG_STRLEN (128 KiB) by Linux execve(2)."""


def _component(rng: random.Random, low: int, high: int) -> str:
    while True:
        part = "".join(rng.choice(VALID_CHARS) for _ in range(rng.randint(low, high)))
        if part not in (".", ".."):
            return part


def _valid(rng: random.Random, *, char: str | None = None) -> str:
    """A valid dataset or snapshot name; ``char`` (a valid character) forced into it."""
    while True:
        pool = rng.choice(POOL_FIRST) + _component(rng, 0, 8) if rng.random() < 0.8 \
            else rng.choice(POOL_FIRST)
        parts = [pool] + [_component(rng, 1, 16) for _ in range(rng.randint(0, 4))]
        if char is not None:
            where = rng.randrange(len(parts))
            at = rng.randint(1 if where == 0 else 0, len(parts[where]))
            parts[where] = parts[where][:at] + char + parts[where][at:]
        name = "/".join(parts)
        if rng.random() < 0.5:
            snap = _component(rng, 1, 20)
            if snap.startswith("-"):
                snap = "s" + snap
            name += "@" + snap
        if len(name) <= MAX_NAME_LEN and all(p not in (".", "..") for p in
                                             name.split("@")[0].split("/")):
            return name


def valid_names(rng: random.Random) -> list[str]:
    """5,000 valid names: each valid character forced into 40 names, plus edge cases
    (a name of exactly 255 bytes, one-letter pools, spaces and colons everywhere)."""
    names = ["tank", "a", "a/b", "pool with space/child with space@snap with space",
             "p:o:l/c:h:i:l:d@2024-01-02T03:04:05Z", "tank/-dash-led-child", "tank/ trailing ",
             "t/" + "x" * (MAX_NAME_LEN - 2), "t/d@" + "y" * (MAX_NAME_LEN - 4)]
    for char in VALID_CHARS:
        names += [_valid(rng, char=char) for _ in range(40)]
    while len(names) < VALID_COUNT:
        names.append(_valid(rng))
    return names


def hostile_names(rng: random.Random, canary: Path) -> list[str]:
    """5,000 names no validation may accept (see the module docstring)."""
    touch = f"touch {canary}"
    payloads = [f"$({touch})", f"`{touch}`", f";{touch}", f"; {touch} #", f"|{touch}",
                f"&& {touch}", f"& {touch} &", f"\n{touch}\n", f"'; {touch}; '", f'"; {touch}; "',
                f"${{IFS}}{touch.replace(' ', '${IFS}')}", f"> {canary}", f"$(echo x>{canary})",
                "${x}", "$x", "$HOME", "*", "?", "[a-z]", "{a,b}", "!!", "~root", "\\",
                "'", '"', "#", "%", METACHARACTERS]
    structural = ["", "/", "tank/", "/tank", "tank//x", "tank/./x", "tank/../x", "tank/.",
                  "..", "1tank/x", "-tank", " tank", "_tank", "mirror", "raidz2/x", "c0t0d0/x",
                  "spare", "log/x", "tank@a@b", "tank/x@", "@snap", "tank/x@-rf",
                  "tank/x@--help", "tank#book", "t/" + "x" * MAX_NAME_LEN,
                  "t/d@" + "y" * (MAX_NAME_LEN - 3)]
    names = list(structural) + [f"tank/{p}" for p in payloads]
    while len(names) < HOSTILE_COUNT:
        base = _valid(rng)
        kind = rng.random()
        if kind < 0.45:
            bad = rng.choice(payloads)
        elif kind < 0.85:
            bad = rng.choice(SHELL_CHARS)
        else:
            bad = rng.choice(NON_ASCII)
        at = rng.randint(0, len(base))
        names.append(base[:at] + bad + base[at:])
    return names


def _has_foreign_character(name: str) -> bool:
    """True when ``name`` holds a character no ZFS name may hold (all but the ~50 structural
    cases of the hostile corpus do; the corpus self-check counts them)."""
    return bool(set(name) - set(VALID_CHARS + "/@"))


@pytest.fixture(scope="module")
def canary(tmp_path_factory) -> Path:
    """A file no argument may create."""
    return tmp_path_factory.mktemp("canary-10k") / "pwned"


@pytest.fixture(scope="module")
def corpus(canary) -> tuple[list[str], list[str]]:
    rng = random.Random(SEED)
    return valid_names(rng), hostile_names(rng, canary)


def test_the_corpus_holds_10000_distinct_names_covering_every_valid_and_shell_character(corpus):
    """docs/reliability.md#r33-quoting-corpus."""
    valid, hostile = corpus
    assert len(valid) + len(hostile) == 10_000
    assert len(set(valid)) > 4_900 and len(set(hostile)) > 4_900
    assert set(VALID_CHARS) <= set("".join(valid))
    assert set(METACHARACTERS) - set(VALID_CHARS) <= set("".join(hostile))
    assert set(SHELL_CHARS) <= set("".join(hostile))
    assert not set(valid) & set(hostile)
    assert max(len(n) for n in valid) == MAX_NAME_LEN
    assert sum(map(_has_foreign_character, hostile)) > 4_900


def _quiet_zfs() -> tuple[Zfs, FaultyExecutor]:
    """A Zfs client whose executor records every command and runs none (answers exit 0)."""
    executor = FaultyExecutor(LocalExecutor(), lambda argv: True, returncode=0, stderr="")
    return Zfs(executor), executor


def test_every_valid_name_is_accepted_and_reaches_the_zfs_argv_unchanged(corpus):
    """docs/reliability.md#r33-quoting-corpus."""
    valid, _ = corpus
    zfs, executor = _quiet_zfs()
    for name in valid:
        if "@" in name:
            assert SnapshotName(name) == name
            zfs.snapshot(name)
        else:
            assert DatasetName(name) == name
            zfs.create_filesystem(name)
        argv, injected = executor.calls[-1]
        assert injected and argv[-1] == name and argv[0] == "zfs"
    assert len(executor.calls) == len(valid)


def test_every_hostile_name_is_rejected_before_any_process_starts(corpus, canary):
    """docs/reliability.md#r34-name-validation-table."""
    _, hostile = corpus
    zfs, executor = _quiet_zfs()
    for name in hostile:
        for build in (DatasetName, SnapshotName):
            with pytest.raises(InvalidName):
                build(name)
        for call in (zfs.snapshot, zfs.create_filesystem, zfs.destroy_snapshot, zfs.rollback):
            with pytest.raises(InvalidName):
                call(name)
        with pytest.raises(InvalidName):
            zfs.clone("tank/ok@s", name)
    assert executor.calls == [], "a hostile name reached an executor"
    assert not canary.exists()


# -- transport ----------------------------------------------------------------------------------


def _batches(args: list[str]) -> list[list[str]]:
    """Split ``args`` so each command's quoted arguments stay under COMMAND_BUDGET bytes."""
    batches: list[list[str]] = [[]]
    size = 0
    for arg in args:
        quoted = len(remote_command([arg], sudo=False).encode())
        if batches[-1] and size + quoted + 1 > COMMAND_BUDGET:
            batches.append([])
            size = 0
        batches[-1].append(arg)
        size += quoted + 1
    return batches


def _runner(kind: str, sshd, tmp_path: Path):
    if kind == "local":
        executor = RecordingExecutor(LocalExecutor())
        return (lambda argv: executor.run(argv, timeout=60).stdout), lambda: None
    if kind == "paramiko":
        executor = SSHExecutor("corpus", sshd.host_config(), known_hosts_default=tmp_path / "kh")
        return (lambda argv: executor.run(argv, timeout=60).stdout), executor.close
    prefix = ssh_argv(sshd.host_config(), known_hosts_default=tmp_path / "kh")
    local = LocalExecutor()
    return (lambda argv: local.run(prefix + [remote_command(argv, sudo=False)],
                                   timeout=60).stdout), lambda: None


def _arrive_intact(run, names: list[str]) -> int:
    """Send ``names`` as ``printf '%s\\0' NAME...`` commands; compare what came back.
    Returns the number of commands run."""
    batches = _batches(names)
    for batch in batches:
        got = run(["printf", "%s\\0", *batch]).split(b"\0")[:-1]
        sent = [n.encode() for n in batch]
        if got != sent:
            first = next(i for i, (a, b) in enumerate(zip(got, sent, strict=True)) if a != b) \
                if len(got) == len(sent) else min(len(got), len(sent))
            pytest.fail(f"name {batch[first]!r} changed in transit (got"
                        f" {got[first] if first < len(got) else None!r})")
    return len(batches)


KINDS = ["local", pytest.param("paramiko", marks=pytest.mark.ssh),
         pytest.param("openssh", marks=pytest.mark.ssh)]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_all_10000_names_arrive_byte_identical_in_few_commands_with_no_side_effects(
        kind, request, tmp_path, corpus, canary):
    """docs/reliability.md#r33-quoting-corpus: Valid names, and hostile strings as plain arguments
    (paths, hook arguments), through each transport: byte-identical, the canary never created, at
    most a few dozen commands."""
    sshd = request.getfixturevalue("sshd") if kind != "local" else None
    valid, hostile = corpus
    run, close = _runner(kind, sshd, tmp_path)
    try:
        commands = _arrive_intact(run, valid) + _arrive_intact(run, hostile)
    finally:
        close()
    assert commands <= 40
    assert not canary.exists(), f"{kind}: a hostile argument was run by a shell"
