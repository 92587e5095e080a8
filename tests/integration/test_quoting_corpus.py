"""docs/reliability.md#r33-quoting-corpus: every argv element arrives byte-identical, locally and
over SSH.

The corpus holds valid ZFS names drawn from every valid character (``[A-Za-z0-9-_.: ]``) and
hostile strings from the metacharacter corpus ``><`'"@&$()$x\\/.* !#;|\\n${x}``, each run as
argv elements of ``printf '%s\\0' ARG...`` through LocalExecutor, SSHExecutor (paramiko) and the
real ``ssh`` client (``ssh_argv`` + ``remote_command``). Hostile strings try to create a
canary file; it must never appear.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest

from zrepl_py.errors import InvalidName
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.proc.openssh import remote_command, ssh_argv
from zrepl_py.proc.ssh import SSHExecutor
from zrepl_py.zfs.names import MAX_NAME_LEN, DatasetName, SnapshotName

VALID_CHARS = string.ascii_letters + string.digits + "-_.: "
METACHARACTERS = "><`'\"@&$()$x\\/.* !#;|\n${x}"
EXTRA_HOSTILE_CHARS = "\t\r\x1b\x7f\x01~%^[]?=,+{}"
BATCH = 80  # arguments per command: keeps each remote command far below MAX_ARG_STRLEN


def valid_names() -> list[str]:
    """Dataset and snapshot names using every valid ZFS character, in several positions."""
    names: list[str] = []
    for char in VALID_CHARS:
        names += [f"pool/a{char}b", f"pool/{char}{char}x", f"pool/ds@s{char}1", f"p{char}ol/x"]
    names += [
        "tank",
        "my pool/with space@snap 1",
        "p:x/y:z@zbak_2024-01-02T03:04:05Z",
        "tank/send er",
        "foo bar@1 with space",
        "tank/-leading-dash-in-child",
        "tank/a.b/c_d/e-f/g:h/i j@k.l_m-n:o p",
        "t/" + "x" * (MAX_NAME_LEN - 2),
    ]
    rng = random.Random(33)
    while len(names) < 330:
        parts = [rng.choice(string.ascii_letters)]
        parts[0] += "".join(rng.choice(VALID_CHARS) for _ in range(rng.randint(0, 12)))
        for _ in range(rng.randint(0, 3)):
            parts.append("".join(rng.choice(VALID_CHARS) for _ in range(rng.randint(1, 12))))
        name = "/".join(parts)
        if rng.random() < 0.5:
            name += "@" + rng.choice(string.ascii_letters) + "".join(
                rng.choice(VALID_CHARS) for _ in range(rng.randint(0, 12))
            )
        try:
            (SnapshotName if "@" in name else DatasetName)(name)
        except InvalidName:
            continue  # e.g. a "." or ".." component
        names.append(name)
    return names


def hostile_strings(canary: Path) -> list[str]:
    """Non-ZFS strings (paths, prefixes, hook arguments) that a shell would misread."""
    touch = f"touch {canary}"
    attacks = [
        METACHARACTERS,
        f"$({touch})",
        f"`{touch}`",
        f";{touch}",
        f"; {touch} #",
        f"|{touch}",
        f"&& {touch}",
        f"& {touch} &",
        f"\n{touch}\n",
        f"'; {touch}; '",
        f'"; {touch}; "',
        f"\\'; {touch}; \\'",
        f"${{IFS}}{touch.replace(' ', '${IFS}')}",
        f"x$({touch})y",
        f"> {canary}",
        f">{canary}",
        f"$(echo pwned > {canary})",
        "$(touch /tmp/pwned)",
        ";rm -rf x",
        "${x}",
        "$x",
        "$HOME",
        "~",
        "~root",
        "*",
        "/*",
        "?",
        "[a-z]*",
        "{a,b}",
        "!!",
        "-",
        "--",
        "-n",
        "-e",
        "--help",
        "-rf /",
        "-o ProxyCommand=touch x",
        "",
        " ",
        "  two  spaces  ",
        "\\",
        "\\\\",
        "'",
        "''",
        '"',
        '""',
        "'\"'\"'",
        "a'b\"c`d$e\\f",
        "line1\nline2",
        "\n",
        "\r\n",
        "tab\there",
        "s3://bucket/prefix with space/$(x)",
        "/mnt/rsync target/dir;x",
        "pool/ds@snap#book",
        "pool/ds@-rf",
        "Grüße/数据集@スナップ",
        "emoji \U0001f4be",
        "\u202eright-to-left",
        "\udcff\udcfe invalid utf-8 bytes",
        "%s%n%x",
    ]
    for char in METACHARACTERS + EXTRA_HOSTILE_CHARS:
        attacks += [char, f"a{char}b", f"pool/ds{char}{touch}"]
    return attacks


@pytest.fixture(scope="module")
def canary(tmp_path_factory) -> Path:
    """A path no command may create; checked after every executor."""
    return tmp_path_factory.mktemp("canary") / "pwned"


def _expected(args: list[str]) -> bytes:
    return b"".join(arg.encode("utf-8", "surrogateescape") + b"\0" for arg in args)


def _check_arrival(run, args: list[str]) -> None:
    """Run ``printf '%s\\0' ARG...`` in batches and compare the bytes that arrived."""
    for start in range(0, len(args), BATCH):
        batch = args[start : start + BATCH]
        got = run(["printf", "%s\\0", *batch])
        if got != _expected(batch):
            arrived = got.split(b"\0")
            for i, arg in enumerate(batch):
                sent = arg.encode("utf-8", "surrogateescape")
                seen = arrived[i] if i < len(arrived) else None
                assert seen == sent, f"argument {start + i} changed in transit"
            assert got == _expected(batch)


def _runner(kind: str, sshd, tmp_path: Path):
    if kind == "local":
        executor = LocalExecutor()
        return (lambda argv: executor.run(argv, timeout=30).stdout), lambda: None
    if kind == "paramiko":
        executor = SSHExecutor("corpus", sshd.host_config(), known_hosts_default=tmp_path / "kh")
        return (lambda argv: executor.run(argv, timeout=30).stdout), executor.close
    prefix = ssh_argv(sshd.host_config(), known_hosts_default=tmp_path / "kh")
    local = LocalExecutor()
    return (
        lambda argv: local.run(prefix + [remote_command(argv, sudo=False)], timeout=30).stdout
    ), lambda: None


KINDS = ["local", pytest.param("paramiko", marks=pytest.mark.ssh),
         pytest.param("openssh", marks=pytest.mark.ssh)]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_valid_zfs_names_arrive_byte_identical(kind, request, tmp_path):
    """docs/reliability.md#r33-quoting-corpus: Every valid-character dataset/snapshot name reaches
    the command unchanged."""
    sshd = request.getfixturevalue("sshd") if kind != "local" else None
    run, close = _runner(kind, sshd, tmp_path)
    try:
        _check_arrival(run, valid_names())
    finally:
        close()


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_strings_arrive_byte_identical_with_no_side_effects(
    kind, request, tmp_path, canary
):
    """docs/reliability.md#r33-quoting-corpus: Metacharacters, quotes, ``$(...)``, newlines, leading
    ``-``: nothing runs, all arrive."""
    sshd = request.getfixturevalue("sshd") if kind != "local" else None
    pwned_before = Path("/tmp/pwned").exists()
    run, close = _runner(kind, sshd, tmp_path)
    try:
        _check_arrival(run, hostile_strings(canary))
    finally:
        close()
    assert not canary.exists(), f"{kind}: a hostile argument was executed by a shell"
    assert Path("/tmp/pwned").exists() == pwned_before


def test_the_corpus_is_large_and_covers_every_valid_and_metacharacter(canary):
    """docs/reliability.md#r33-quoting-corpus: The corpus itself: hundreds of strings, every valid
    ZFS char and every metacharacter."""
    valid, hostile = valid_names(), hostile_strings(canary)
    assert len(valid) + len(hostile) >= 400
    assert set(VALID_CHARS) <= set("".join(valid))
    assert set(METACHARACTERS) <= set("".join(hostile))


def test_valid_corpus_names_are_accepted_by_the_name_types():
    """docs/reliability.md#r33-quoting-corpus: The valid half really is valid:
    DatasetName/SnapshotName accept every entry."""
    for name in valid_names():
        (SnapshotName if "@" in name else DatasetName)(name)


def _name_hostile(text: str) -> bool:
    # The metacharacter corpus also holds ZFS-valid characters (x . space / @): strings made
    # only of those are legitimate names, not attacks on the name types.
    return text == "" or text.startswith("-") or bool(set(text) - set(VALID_CHARS + "/@"))


def _undecodable(text: str) -> bool:
    return any("\udc80" <= char <= "\udcff" for char in text)


def test_hostile_strings_are_rejected_as_zfs_names_before_any_process_starts(canary):
    """docs/reliability.md#r34-name-validation-table: No shell-hostile string passes as a dataset,
    snapshot or snapshot short name."""
    hostile = [t for t in hostile_strings(canary) if _name_hostile(t) and not _undecodable(t)]
    assert len(hostile) > 150
    for text in hostile:
        with pytest.raises(InvalidName):
            DatasetName(text)
        with pytest.raises(InvalidName):
            SnapshotName(text)
        with pytest.raises(InvalidName):
            SnapshotName.of("pool/ds", text)
        if set(text) - set(VALID_CHARS):
            with pytest.raises(InvalidName):
                DatasetName(f"pool/{text}")


def test_names_holding_undecodable_bytes_raise_invalid_name(canary):
    """docs/reliability.md#r34-name-validation-table: A name carrying non-UTF-8 bytes (surrogate
    escapes) is an InvalidName, not a crash."""
    for text in filter(_undecodable, hostile_strings(canary)):
        with pytest.raises(InvalidName):
            DatasetName(text)
        with pytest.raises(InvalidName):
            SnapshotName.of("pool/ds", text)
