"""``zfs.teardown.destroy_tree`` on zfs-fuse: a scratch tree is destroyed one name at a time,
and a name that vanished between the listing and its destroy (the partial dataset of a
cancelled ``zfs receive``, cleaned up by the daemon after the command was reaped) is skipped,
never the reason the tree is called left behind."""

from __future__ import annotations

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
    """A client whose first ``tree`` listing is followed, before it is returned, by the
    destroy of ``vanish`` (a filesystem with one snapshot, ``@s1``, through this client's own
    retrying destroys): the names are listed but gone when their destroys run."""

    def __init__(self, *args, vanish: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.vanish = vanish

    def tree(self, root, *, recursive):
        listed = super().tree(root, recursive=recursive)
        if self.vanish is not None:
            self.destroy_snapshot(f"{self.vanish}@s1")
            self.destroy_filesystem(self.vanish, attempts=40)
            self.vanish = None
        return listed


def client(pool: str, vanish: str | None = None) -> VanishingZfs:
    executor = LocalExecutor()
    return VanishingZfs(executor, capabilities=detect(executor, pool, timeout=COMMAND_TIMEOUT),
                        timeout=COMMAND_TIMEOUT, vanish=vanish)


def pool_names(pool: str) -> list[str]:
    return zfs("list", "-H", "-o", "name", "-t", "all", "-r", pool).split()


def test_a_listed_dataset_gone_before_its_destroy_is_skipped_and_the_rest_destroyed(zpool):
    root = f"{zpool.name}/scratch"
    for name in (root, f"{root}/d0", f"{root}/d1"):
        zfs("create", name)
        zfs("snapshot", f"{name}@s1")
    zfs("create", f"{zpool.name}/other")

    destroy_tree(client(zpool.name, vanish=f"{root}/d0"), root, attempts=2, delay=0.1)

    assert pool_names(zpool.name) == [zpool.name, f"{zpool.name}/other"]


def test_a_root_that_is_not_there_is_still_an_error(zpool):
    with pytest.raises(DatasetNotFound):
        destroy_tree(client(zpool.name), DatasetName(f"{zpool.name}/nothing"), attempts=1,
                     delay=0)
