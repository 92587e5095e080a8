"""The expected size of a send stream (``zfs.estimate``), the ETA's input: ``zfs send -n -P``
on OpenZFS 2.3 (the guest, over ssh), compared with the bytes the same send really writes;
on zfs-fuse, which has no dry run, a full's ``referenced`` and an incremental's unknown,
without trying ``send -n`` there (docs/design.md#running-transfers)."""

from __future__ import annotations

import os

from support.openzfs import COMMAND_TIMEOUT

from zrepl_py.proc.local import LocalExecutor
from zrepl_py.zfs.capabilities import detect
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.estimate import REFERENCED, SEND_DRY_RUN, UNKNOWN, Expected, expected_size
from zrepl_py.zfs.sendrecv import send_argv
from zrepl_py.zfs.steps import Full, Incremental, SnapRef

TOLERANCE = 0.02
"""How far the dry run may be from the real stream (its records' headers are estimated)."""


def _refs(zfs: Zfs, dataset: str) -> dict[str, SnapRef]:
    tree = zfs.tree(dataset, recursive=False)
    return {s.short: SnapRef(s.short, s.guid, s.createtxg) for s in tree.snapshots(dataset)}


def test_openzfs_dry_run_gives_the_size_the_send_writes(openzfs_executor, openzfs_pools):
    run = openzfs_executor.run
    dataset = f"{openzfs_pools.source}/data"
    # one round trip to the guest (each costs seconds there): snapshots a, b, c of 3, 2, 1 MiB
    run(["sh", "-ec", 'zfs create "$1"; m=$(zfs get -H -o value mountpoint "$1")\n'
         'for s in a:3 b:2 c:1; do\n'
         '  head -c "${s#*:}M" /dev/urandom >"$m/${s%:*}.bin"; zfs snapshot "$1@${s%:*}"\n'
         'done', "sh", dataset], timeout=COMMAND_TIMEOUT)
    caps = detect(openzfs_executor, openzfs_pools.source, timeout=COMMAND_TIMEOUT)
    assert caps.send_dry_run
    zfs = Zfs(openzfs_executor, capabilities=caps, timeout=COMMAND_TIMEOUT)
    refs = _refs(zfs, dataset)
    for step, full in ((Full(refs["a"]), f"{dataset}@a"),
                       (Incremental(refs["a"], refs["c"], intermediates=True), None)):
        send = send_argv(step, source_dataset=dataset, caps=caps, raw=False)
        expected = expected_size(zfs, send, full=full)
        written = len(run(send, timeout=COMMAND_TIMEOUT).stdout)
        assert expected.source == SEND_DRY_RUN and expected.bytes is not None
        assert abs(expected.bytes - written) <= TOLERANCE * written, (send, expected, written)
    gone = send_argv(Full(SnapRef("nope", 1, 1)), source_dataset=dataset, caps=caps, raw=False)
    assert expected_size(zfs, gone, full=f"{dataset}@nope") == UNKNOWN, "never raises"


def test_zfs_fuse_has_a_fulls_referenced_and_no_incremental_size(zpool):
    dataset = f"{zpool.name}/data"
    zfs = Zfs(LocalExecutor(), timeout=COMMAND_TIMEOUT)
    zfs.create_filesystem(dataset)
    for short in ("a", "b"):
        (zpool.mountpoint / "data" / f"{short}.bin").write_bytes(os.urandom(1 << 20))
        zfs.snapshot(f"{dataset}@{short}")
    caps = detect(zfs.executor, zpool.name, timeout=COMMAND_TIMEOUT)
    assert not caps.send_dry_run, "zfs-fuse: send has neither -n nor -P"
    zfs = Zfs(LocalExecutor(), capabilities=caps, timeout=COMMAND_TIMEOUT)
    refs = _refs(zfs, dataset)
    full = send_argv(Full(refs["a"]), source_dataset=dataset, caps=caps, raw=False)
    referenced = int(zfs.get_properties(f"{dataset}@a", ["referenced"])["referenced"])
    assert expected_size(zfs, full, full=f"{dataset}@a") == Expected(referenced, REFERENCED)
    incremental = send_argv(Incremental(refs["a"], refs["b"], intermediates=True),
                            source_dataset=dataset, caps=caps, raw=False)
    assert expected_size(zfs, incremental) == UNKNOWN
