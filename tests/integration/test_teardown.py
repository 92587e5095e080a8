"""``zfs.teardown.destroy_tree`` on zfs-fuse: a scratch tree is destroyed one name at a time,
and a name that vanished between the listing and its destroy (the partial dataset of a
cancelled ``zfs receive``, cleaned up by the daemon after the command was reaped) is skipped,
never the reason the tree is called left behind."""

from __future__ import annotations

import subprocess
import time

import pytest
from support.cli import zfs
from support.zfs import COMMAND_TIMEOUT

from zrepl_py.errors import DatasetNotFound
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.zfs.capabilities import detect
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName
from zrepl_py.zfs.teardown import destroy_tree

pytestmark = pytest.mark.zfs


class VanishingZfs(Zfs):
    """A client whose first ``tree`` listing is followed, before it is returned, by a real
    ``zfs destroy`` of ``vanish``: the name is listed but gone when its destroy runs."""

    def __init__(self, *args, vanish: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.vanish: str | None = vanish

    def tree(self, root, *, recursive):
        listed = super().tree(root, recursive=recursive)
        if self.vanish is not None:
            gone(self.vanish)
            self.vanish = None
        return listed


def gone(name: str) -> None:
    """``zfs destroy -r NAME``, retried while zfs-fuse says the just-made dataset is busy."""
    for _ in range(40):
        done = subprocess.run(["zfs", "destroy", "-r", name], capture_output=True, text=True,
                              timeout=60)
        if done.returncode == 0:
            return
        assert "busy" in done.stderr, done.stderr
        time.sleep(0.25)
    raise AssertionError(f"{name} stayed busy: {done.stderr}")


def client(pool: str, vanish: str) -> VanishingZfs:
    executor = LocalExecutor()
    return VanishingZfs(executor, capabilities=detect(executor, pool, timeout=COMMAND_TIMEOUT),
                        timeout=COMMAND_TIMEOUT, vanish=vanish)


def names(root: str) -> list[str]:
    return zfs("list", "-H", "-o", "name", "-t", "all", "-r", root.split("/")[0]).split()


def test_a_listed_dataset_gone_before_its_destroy_is_skipped_and_the_rest_destroyed(zpool):
    root = f"{zpool.name}/scratch"
    for name in (root, f"{root}/d0", f"{root}/d1"):
        zfs("create", name)
        zfs("snapshot", f"{name}@s1")
    zfs("create", f"{zpool.name}/other")

    destroy_tree(client(zpool.name, vanish=f"{root}/d0"), root, attempts=2, delay=0.1)

    assert names(root) == [zpool.name, f"{zpool.name}/other"]


def test_a_root_that_is_not_there_is_still_an_error(zpool):
    with pytest.raises(DatasetNotFound):
        destroy_tree(client(zpool.name, vanish=f"{zpool.name}/nothing"),
                     DatasetName(f"{zpool.name}/nothing"), attempts=1, delay=0)
