"""How a batch sets the replica properties a zfs-fuse receive could not take
(``Settler._set_after_full``): one command per property while the transfers run; once they
are over, commands run at once, each with a share of the datasets; and what happens when zfs
refuses one. A stand-in for the target's ZFS client records the commands; the real path
(zfs-fuse over sshd) is tests/e2e/test_replicate_tree_cli.py."""

from __future__ import annotations

import threading

from zrepl_py.config.hosts import Endpoint
from zrepl_py.errors import ZfsError
from zrepl_py.replication.settle import SETS_AT_ONCE, Arrival, Settler
from zrepl_py.zfs.names import DatasetName
from zrepl_py.zfs.properties import ReceiveProperties
from zrepl_py.zfs.steps import SnapRef

PROPS = ReceiveProperties((("canmount", "noauto"), ("readonly", "on")))


class _Target:
    """Records ``set_property_many`` and ``set_property`` calls; refuses ``refuse``."""

    def __init__(self, refuse: str | None = None):
        self.refuse = refuse
        self.many: list[tuple[str, str, list[str]]] = []
        self.single: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def set_property_many(self, names, prop, value):
        with self.lock:
            self.many.append((prop, value, [str(n) for n in names]))
        if self.refuse in map(str, names):
            raise ZfsError(["zfs", "set"], 1, f"cannot set property for '{self.refuse}'")

    def set_property(self, name, prop, value):
        with self.lock:
            self.single.append((str(name), prop, value))
        if str(name) == self.refuse:
            raise ZfsError(["zfs", "set"], 1, f"cannot set property for '{name}'")


def _settler(target: _Target, *, idle: bool) -> Settler:
    settler = Settler("j", Endpoint("backup", DatasetName("bak/r"), None), "local", None,
                      target, None, None, takes_properties=False)
    if idle:
        settler.idle.set()
    return settler


def _created(count: int) -> list[Arrival]:
    return [Arrival(DatasetName(f"src/d{i:02d}"), DatasetName(f"bak/r/d{i:02d}"),
                    SnapRef("s1", i + 1, 10), created=True, props=PROPS)
            for i in range(count)]


def _each_set_once(target: _Target, count: int) -> None:
    for prop, value in PROPS.assigned:
        names = [n for p, v, chunk in target.many if (p, v) == (prop, value) for n in chunk]
        assert sorted(names) == [f"bak/r/d{i:02d}" for i in range(count)]


def test_while_the_transfers_run_a_batch_sets_each_property_in_one_command():
    target = _Target()
    _settler(target, idle=False)._set_after_full(_created(10))
    assert [(p, v) for p, v, _ in target.many] == [("canmount", "noauto"), ("readonly", "on")]
    _each_set_once(target, 10)


def test_once_they_are_over_the_commands_run_at_once_each_with_a_share():
    target = _Target()
    _settler(target, idle=True)._set_after_full(_created(10))
    assert len(target.many) == SETS_AT_ONCE
    _each_set_once(target, 10)
    assert target.single == []


def test_a_batch_of_one_replica_sets_each_property_once():
    target = _Target()
    _settler(target, idle=True)._set_after_full(_created(1))
    assert sorted(target.many) == [("canmount", "noauto", ["bak/r/d00"]),
                                   ("readonly", "on", ["bak/r/d00"])]


def test_a_refused_share_is_set_one_replica_at_a_time_and_only_the_refusing_one_fails():
    target = _Target(refuse="bak/r/d03")
    settler = _settler(target, idle=True)
    settler._set_after_full(_created(10))
    alone = {name for name, _, _ in target.single}
    assert "bak/r/d03" in alone and len(alone) > 1  # its share, each alone
    assert settler.settled.refused == {DatasetName("bak/r/d03")}
    errors = sorted(str(e) for e in settler.settled.property_errors)  # one per property
    assert len(errors) == 2 and all("bak/r/d03 was received" in e for e in errors)
    assert "zfs set canmount=noauto" in errors[0] and "zfs set readonly=on" in errors[1]
