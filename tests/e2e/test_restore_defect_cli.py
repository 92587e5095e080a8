"""A defect inside a restore's receive loop is an internal error, not a failed receive: a
``TypeError`` raised there reaches the CLI's internal-error path (``zbak: internal error:
TypeError ...; please report it``) instead of being reworded into ``RestoreError`` as if the
stream or the receiving host were at fault
(docs/decisions.md#a-restore-reports-a-defect-as-a-defect)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support.cli import InProcessZbak, Zbak, prop, zfs

from zrepl_py.errors import ExitStatus
from zrepl_py.restore import execute

pytestmark = pytest.mark.zfs


def test_a_type_error_inside_the_receive_loop_is_reported_as_an_internal_error(
        zpool, tmp_path, capsys, monkeypatch):
    data = f"{zpool.name}/data"
    zfs("create", data)
    (Path(prop(data, "mountpoint")) / "file").write_bytes(b"x" * 100_000)
    zfs("snapshot", f"{data}@0")
    (tmp_path / "store").mkdir()
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / "state"}"
        [stores.cold]
        url = "file://{tmp_path / "store"}"
        [jobs.data]
        dataset = "{data}"
        [jobs.data.archive]
        store = "cold"
    """))
    run = Zbak(config)
    for args in (("init", "--no-checks"), ("archive",)):
        status, out, err = run(*args)
        assert status == ExitStatus.OK, out + err

    # In process (support.cli.InProcessZbak): the defect is injected at one exact point of
    # a real restore, the first call after the first stream was received.
    def defect(*_args: object) -> None:
        raise TypeError("a defect of zbak's")

    monkeypatch.setattr(execute, "_mark", defect)
    status, out, err = InProcessZbak(config, capsys)(
        "restore", data, "--to", "@0", "--into", f"{zpool.name}/back", "--from", "cold", "--yes")
    assert status == ExitStatus.FAILED
    assert "zbak: internal error: TypeError: a defect of zbak's" in err, out + err
    assert "receiving stream" not in err
