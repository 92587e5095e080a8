"""Which datasets of a job go without the receive buffer (``zfs_target._small_datasets``):
the reading of ``zfs get`` values, with a stand-in for the source's ZFS client. The real
path (zfs-fuse over sshd) is tests/e2e/test_replicate_cli.py."""

from __future__ import annotations

from zrepl_py.errors import ZfsError
from zrepl_py.replication.zfs_target import SMALL_DATASET, _small_datasets
from zrepl_py.zfs.names import DatasetName


class _Source:
    def __init__(self, answer):
        self.answer = answer
        self.calls = []

    def property_sources(self, names, props):
        self.calls.append((list(names), list(props)))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _values(data: int | str, snapshots: int | str) -> dict:
    return {"usedbydataset": (str(data), "-"), "usedbysnapshots": (str(snapshots), "-")}


def test_a_dataset_whose_data_and_snapshots_store_less_than_the_floor_is_small():
    names = [DatasetName(n) for n in ("p/a", "p/a/big", "p/a/snaps", "p/a/tiny")]
    source = _Source({"p/a": _values(30_000, 0),
                      "p/a/big": _values(SMALL_DATASET, 0),
                      "p/a/snaps": _values(SMALL_DATASET - 10, 10),
                      "p/a/tiny": _values(SMALL_DATASET - 11, 10)})
    assert _small_datasets(source, names) == {DatasetName("p/a"), DatasetName("p/a/tiny")}
    assert source.calls == [(["p/a", "p/a/big", "p/a/snaps", "p/a/tiny"],
                             ["usedbydataset", "usedbysnapshots"])]


def test_a_value_zfs_does_not_give_keeps_the_buffer():
    names = [DatasetName("p/a"), DatasetName("p/b")]
    assert _small_datasets(_Source({"p/a": _values("-", 0)}), names) == frozenset()


def test_sizes_that_cannot_be_read_keep_the_buffer_for_every_dataset():
    failing = _Source(ZfsError(["zfs", "get"], 1, "permission denied"))
    assert _small_datasets(failing, [DatasetName("p/a"), DatasetName("p/b")]) == frozenset()
