"""Destroy a dataset tree zbak created for itself (a scratch copy), one name at a time.

Used for the scratch datasets a deep audit (``audit --receive-into``) and a drill
(``zrepl_py.drill``) receive into: every snapshot of a dataset, then the dataset, deepest
dataset first, each with a plain ``zfs destroy NAME`` (never ``-r``/``-R``/``-f``:
docs/design.md#invariants), so nothing outside the tree can go with it. zfs-fuse answers
"dataset is busy" for a moment after a clone of a snapshot was read and destroyed
(docs/testbed.md#zfs-fuse): each destroy is retried while it says so. A name listed but gone
when its destroy runs is skipped: zfs-fuse's daemon destroys the partial dataset of a
cancelled ``zfs receive`` into the tree a moment after the command was reaped, possibly
between the listing and its destroy (docs/testbed.md#zfs-fuse).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from zrepl_py.errors import DatasetBusy, DatasetNotFound
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName, SnapshotName

BUSY_ATTEMPTS = 20
BUSY_DELAY = 0.5  # seconds between "dataset is busy" retries: up to ~10 s in all


def _retrying(destroy: Callable[[], None], attempts: int, delay: float) -> None:
    for attempt in range(1, attempts + 1):
        try:
            destroy()
            return
        except DatasetNotFound:
            return  # gone already: what the destroy was for
        except DatasetBusy:
            if attempt >= attempts:
                raise
            time.sleep(delay)


def destroy_tree(zfs: Zfs, root: DatasetName | str, *, attempts: int = BUSY_ATTEMPTS,
                 delay: float = BUSY_DELAY) -> None:
    """Destroy ``root``, everything below it and all their snapshots (see the module doc).

    Args:
        zfs: the client of the tree's host.
        root: the tree's top dataset.
        attempts / delay: tries of each destroy while it answers "dataset is busy", and the
            seconds between them.

    Raises:
        DatasetNotFound: ``root`` does not exist when listed (a name below it gone by the
            time it is destroyed is skipped).
        DatasetBusy: a name stayed busy; SnapshotHeld, SnapshotHasClones: a snapshot of the
            tree is held or cloned (never forced); ZfsError, HostUnreachable.
    """
    tree = zfs.tree(root, recursive=True)
    for info in reversed(tree.datasets):
        for snap in reversed(tree.snapshots(info.name)):
            _retrying(functools.partial(zfs.destroy_snapshot, SnapshotName(snap.name)),
                      attempts, delay)
        _retrying(functools.partial(zfs.destroy_filesystem, info.name, attempts=1),
                  attempts, delay)
