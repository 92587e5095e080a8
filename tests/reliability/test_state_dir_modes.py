"""docs/reliability.md#r41-file-modes: after a real cycle run under umask 000, every file zbak made
in its state directory is 0600 and every directory 0700."""

from __future__ import annotations

import os
import stat
import textwrap
from pathlib import Path

import pytest
from support.cli import Zbak, zfs

from zrepl_py.errors import ExitStatus

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.zfs
def test_every_file_zbak_makes_in_its_state_dir_is_private_whatever_the_umask(
        make_pool, tmp_path, capsys):
    """docs/reliability.md#r41-file-modes: under umask 000 a real cycle (init, snapshot, replicate
    to a local replica and to an rsync directory, archive to a ``file://`` store, restore, status,
    audit) leaves the state directory 0700 and every file zbak created under it (catalog,
    its journal files, locks, capability cache, spool) 0600, every directory 0700."""
    src = make_pool()
    data = f"{src.name}/data"
    zfs("create", data)
    mount = Path(zfs("get", "-Hp", "-o", "value", "mountpoint", data).strip())
    (mount / "f").write_bytes(os.urandom(100_000))
    state = tmp_path / "state"
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{state}"
        [stores.cold]
        url = "file://{tmp_path / 'store'}"
        volume_size = "1MiB"
        [jobs.j]
        dataset = "{data}"
        [jobs.j.replicate]
        targets = ["local:{src.name}/replica", "local:{tmp_path / 'tree'}"]
        [jobs.j.archive]
        store = "cold"
    """))
    zbak = Zbak(config, capsys)
    old = os.umask(0)
    try:
        for args in (["init"], ["snapshot"], ["replicate"], ["archive"], ["status", "--json"],
                     ["audit"]):
            status, out, err = zbak(*args)
            assert status == ExitStatus.OK, (args, out, err)
        snap = zfs("list", "-H", "-t", "snapshot", "-o", "name", "-r", data).split()[-1]
        status, out, err = zbak("restore", data, "--to", "@" + snap.split("@")[1], "--into",
                                f"{src.name}/restored", "--from", "cold", "--yes")
        assert status == ExitStatus.OK, out + err
    finally:
        os.umask(old)
    made = [state, *state.rglob("*")]
    assert any(p.name.startswith("catalog") for p in made) and len(made) > 3, made
    wrong = []
    for path in made:
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode) and stat.S_IMODE(mode) != 0o700:
            wrong.append((str(path), oct(stat.S_IMODE(mode))))
        elif stat.S_ISREG(mode) and stat.S_IMODE(mode) != 0o600:
            wrong.append((str(path), oct(stat.S_IMODE(mode))))
        elif stat.S_ISSOCK(mode) and stat.S_IMODE(mode) & 0o077:
            wrong.append((str(path), oct(stat.S_IMODE(mode))))
    assert wrong == []
