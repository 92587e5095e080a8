"""Method ``auto`` falls back to rsync when the target's ZFS rejects the stream as unsupported.

A real pair: the source is a dataset in the OpenZFS 2.3 guest (tests/support/openzfs.py),
the target a zfs-fuse pool on this host (pool version 23). zfs-fuse cannot receive any stream
OpenZFS 2.3 sends, not even a plain ``zfs send`` (observed: "cannot receive: stream has
unsupported feature, feature flags = 4", the SA_SPILL stream feature), so ``zbak replicate``
of ``vm:SRC/data`` to ``local:POOL/replica`` must copy the snapshots with rsync (pulled over
ssh from the guest's ``.zfs/snapshot``) into the directory where ``POOL/replica`` would be
mounted, with a warning naming the reason; method ``zfs`` must report the rejection and
leave nothing behind. Expected contents are checked with plain file reads.

The guest has no rsync; the ``guest_rsync`` fixture copies this host's (same Debian release)
and its one missing library (libpopt) into the guest's RAM root, never replacing a file.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from support.cli import run_zbak
from support.common import hosts_table, need_binary
from support.openzfs import COMMAND_TIMEOUT

from zrepl_py.errors import ExitStatus


@pytest.fixture(scope="module")
def guest_rsync(openzfs_executor):
    """rsync in the guest at /usr/local/bin/rsync, with the libraries it lacks."""
    run = openzfs_executor.run
    if run(["rsync", "--version"], check=False, timeout=COMMAND_TIMEOUT).returncode == 0:
        return
    rsync = need_binary("rsync", "rsync")  # this host's, the same Debian release as the guest's
    libs = subprocess.run(["ldd", rsync], capture_output=True, text=True, check=True).stdout
    for line in libs.splitlines():
        parts = line.split("=>")
        path = parts[1].split()[0] if len(parts) == 2 and parts[1].split() else ""
        if not path.startswith("/"):
            continue
        if run(["test", "-e", path], check=False, timeout=COMMAND_TIMEOUT).returncode != 0:
            run(["dd", f"of={path}", "status=none"], input=Path(path).read_bytes(),
                timeout=COMMAND_TIMEOUT)  # fmt: skip
    run(["dd", "of=/usr/local/bin/rsync", "status=none"], input=Path(rsync).read_bytes(),
        timeout=COMMAND_TIMEOUT)  # fmt: skip
    run(["chmod", "755", "/usr/local/bin/rsync"], timeout=COMMAND_TIMEOUT)
    run(["rsync", "--version"], timeout=COMMAND_TIMEOUT)


class Rig:
    """``vm:SRC/data`` in the guest replicated to ``local:FUSE/replica`` on this host."""

    def __init__(self, vm, executor, pools, make_pool, tmp_path, capsys, method: str):
        self.executor, self.capsys = executor, capsys
        self.data = f"{pools.source}/data"
        self.fuse = make_pool()
        self.replica = f"{self.fuse.name}/replica"
        self.directory = self.fuse.mountpoint / "replica"
        self.config = tmp_path / "zbak.toml"
        self.config.write_text(
            f'state_dir = "{tmp_path / "state"}"\n'
            + hosts_table("vm", vm.host_config(), connect_timeout=30)
            + textwrap.dedent(f"""\
            [jobs.j]
            dataset = "vm:{self.data}"
            [jobs.j.replicate]
            targets = ["local:{self.replica}"]
            method = "{method}"
        """))
        self.guest("zfs", "create", self.data)
        assert self("init", "--no-checks")[0] == ExitStatus.OK

    def __call__(self, *args: str) -> tuple[int, str, str]:
        return run_zbak("--config", str(self.config), *args)

    def guest(self, *argv: str, input: bytes | None = None) -> str:
        return self.executor.run(list(argv), input=input, timeout=COMMAND_TIMEOUT).text

    def write(self, name: str, data: bytes) -> None:
        self.guest("dd", f"of=/{self.data}/{name}", "status=none", input=data)

    def snapshot(self, short: str) -> None:
        self.guest("zfs", "snapshot", f"{self.data}@{short}")

    def target_datasets(self) -> list[str]:
        done = subprocess.run(["zfs", "list", "-H", "-o", "name", "-r", self.fuse.name],
                              capture_output=True, text=True, check=True)  # fmt: skip
        return done.stdout.split()


def test_method_auto_copies_with_rsync_what_the_target_zfs_rejects(
    openzfs_vm, openzfs_executor, openzfs_pools, guest_rsync, make_pool, tmp_path, capsys
):
    rig = Rig(openzfs_vm, openzfs_executor, openzfs_pools, make_pool, tmp_path, capsys, "auto")
    keep, first, second = os.urandom(300_000), os.urandom(5000), os.urandom(7000)
    rig.write("keep.bin", keep)
    rig.write("change.bin", first)
    rig.snapshot("s1")

    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    warnings = [w for row in json.loads(out)["rows"] for w in row["warnings"]]
    assert any("stream has unsupported feature" in w and str(rig.directory) in w
               for w in warnings), warnings  # fmt: skip
    s1 = rig.directory / "snapshots" / "s1"
    assert (s1 / "keep.bin").read_bytes() == keep
    assert (s1 / "change.bin").read_bytes() == first
    assert rig.target_datasets() == [rig.fuse.name], "the rejected stream left no dataset"

    rig.write("change.bin", second)
    rig.snapshot("s2")
    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.OK, out + err
    s2 = rig.directory / "snapshots" / "s2"
    assert (s2 / "change.bin").read_bytes() == second
    assert (s1 / "change.bin").read_bytes() == first, "an older tree never changes"
    assert (s2 / "keep.bin").stat().st_ino == (s1 / "keep.bin").stat().st_ino
    assert (rig.directory / "current").resolve() == s2.resolve()
    status, out, _ = rig("status", "--json")
    assert json.loads(out)[0]["targets"][0]["cursor"] == "s2"


def test_method_zfs_reports_the_rejected_stream_and_copies_nothing(
    openzfs_vm, openzfs_executor, openzfs_pools, make_pool, tmp_path, capsys
):
    rig = Rig(openzfs_vm, openzfs_executor, openzfs_pools, make_pool, tmp_path, capsys, "zfs")
    rig.write("f.bin", os.urandom(4096))
    rig.snapshot("s1")

    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.FAILED
    errors = [row["error"] for row in json.loads(out)["rows"] if row["error"]]
    assert len(errors) == 1 and "stream has unsupported feature" in errors[0], out + err
    assert not rig.directory.exists()
    assert rig.target_datasets() == [rig.fuse.name]
