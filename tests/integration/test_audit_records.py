"""The record walker on real zfs-fuse send streams (pool v23): full, ``-i``, ``-I`` and ``-R``
streams walked to the same record count ``zstreamdump`` reports, with each BEGIN's guids
equal to the snapshots' own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support.cli import zfs
from support.records import walk

pytestmark = pytest.mark.zfs


def guid(snapshot: str) -> int:
    return int(zfs("get", "-Hp", "-o", "value", "guid", snapshot).strip())


@pytest.fixture
def dataset(zpool):
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(zfs("get", "-Hp", "-o", "value", "mountpoint", data).strip())
    for step in range(4):
        (mount / f"f{step}").write_bytes(os.urandom(200_000))
        (mount / "small").write_text("x" * (step + 1) * 100)
        os.makedirs(mount / f"dir{step}", exist_ok=True)
        if step == 2:
            (mount / "f0").unlink()
        zfs("snapshot", f"{data}@s{step}")
    return data


def send(argv: list[str], path: Path) -> bytes:
    with open(path, "wb") as out:
        subprocess.run(["zfs", "send", *argv], check=True, stdout=out)
    return path.read_bytes()


def dump_records(path: Path) -> int | None:
    tool = shutil.which("zstreamdump") or shutil.which("zstream")
    if tool is None:
        return None
    argv = [tool] if tool.endswith("zstreamdump") else [tool, "dump"]
    with open(path, "rb") as stream:
        out = subprocess.run(argv, stdin=stream, capture_output=True, text=True, check=True).stdout
    return int(re.search(r"Total records = (\d+)", out).group(1))


@pytest.mark.parametrize("argv, compound, subs", [
    (["@s0"], False, [(None, "s0")]),
    (["-i", "@s0", "@s1"], False, [("s0", "s1")]),
    (["-I", "@s0", "@s3"], True, [("s0", "s1"), ("s1", "s2"), ("s2", "s3")]),
    (["-R", "@s3"], True, [(None, "s0"), ("s0", "s1"), ("s1", "s2"), ("s2", "s3")]),
])
def test_real_streams_walk_to_zstreamdumps_record_count_with_the_snapshots_guids(
        dataset, tmp_path, argv, compound, subs):
    args = [*argv[:-1], dataset + argv[-1]]  # the base stays short (@s0), as zfs-send(8) allows
    path = tmp_path / "stream"
    data = send(args, path)
    summary = walk([data[i:i + 65536] for i in range(0, len(data), 65536)], "real")
    assert summary.bytes == len(data) and summary.compound == compound
    expected = [(0 if f is None else guid(f"{dataset}@{f}"), guid(f"{dataset}@{t}")) for f, t in subs]
    assert [(b.fromguid, b.toguid) for b in summary.substreams] == expected
    assert [b.toname for b in summary.substreams] == [f"{dataset}@{t}" for _, t in subs]
    records = dump_records(path)
    if records is not None:
        assert summary.records == records


@pytest.mark.parametrize("flags, compound", [
    ([], False), (["-I", "@a"], True), (["-e", "-L", "-c"], False), (["-e", "-L", "-c", "-I", "@a"], True),
])
def test_real_openzfs_streams_walk_to_zstream_dumps_record_count(openzfs_vm, openzfs_executor,
                                                                  openzfs_pools, flags, compound):
    """OpenZFS 2.3 streams, with large blocks, compressed and embedded-data records too."""
    from support.openzfs import COMMAND_TIMEOUT

    from zrepl_py.proc.openssh import remote_command

    run = openzfs_executor.run
    data = f"{openzfs_pools.source}/d"
    run(["zfs", "create", "-o", "compression=lz4", "-o", "recordsize=1M", data],
        timeout=COMMAND_TIMEOUT)
    mount = run(["zfs", "get", "-H", "-o", "value", "mountpoint", data]).text.strip()
    for short, size in (("a", 1500), ("b", 300), ("c", 20)):
        run(["dd", "if=/dev/urandom", f"of={mount}/{short}", f"bs={size}K", "count=1",
             "status=none"], timeout=COMMAND_TIMEOUT)
        run(["sh", "-c", f"echo tiny{short} > {mount}/t{short}"], timeout=COMMAND_TIMEOUT)
        run(["zfs", "snapshot", f"{data}@{short}"], timeout=COMMAND_TIMEOUT)
    send = ["zfs", "send", *flags, f"{data}@c" if "-I" in flags else f"{data}@a"]
    stream = subprocess.run(openzfs_vm.ssh_prefix() + [remote_command(send, sudo=False)],
                            capture_output=True, check=True, timeout=COMMAND_TIMEOUT).stdout
    dump = subprocess.run(openzfs_vm.ssh_prefix() + [remote_command(["zstream", "dump"], sudo=False)],
                          input=stream, capture_output=True, check=True,
                          timeout=COMMAND_TIMEOUT).stdout.decode()
    summary = walk([stream[i:i + 65536] for i in range(0, len(stream), 65536)], "openzfs")
    assert summary.records == int(re.search(r"Total records = (\d+)", dump).group(1))
    assert summary.compound == compound
    guids = {line.split("\t")[0]: int(line.split("\t")[1]) for line in run(
        ["zfs", "get", "-Hp", "-r", "-t", "snapshot", "-o", "name,value", "guid", data]).text.splitlines()}
    names = ["b", "c"] if compound else ["a"]
    assert [b.toguid for b in summary.substreams] == [guids[f"{data}@{n}"] for n in names]
