"""The scratch datasets a file restore receives an archive chain into, and their removal.

``[restore] scratch = "POOL/PATH"`` names a dataset on this machine; a file restore from the
archive receives the chain as ``POOL/PATH/zbak-files-<hex>`` (``files.plan.scratch_child``)
while it holds that dataset's lock (``Context.lock``, ``local:POOL/PATH/zbak-files-<hex>``),
reads the files and destroys it, on success and on failure alike; only a restore waiting
for a thaw (exit 75) keeps what it received for its rerun. A run killed with SIGKILL cannot
clean up, so every file restore from the archive first removes the children
``zbak-files-*`` of the scratch whose lock nobody holds (their run is gone), except its own,
which it continues (docs/files.md#the-scratch-dataset), and the view clones killed runs left
on the scratch's pool (``replication.snapshot_view.remove_dead_views``).

A scratch dataset is destroyed snapshot by snapshot, then itself (plain ``zfs destroy``,
never ``-r``): a child, clone or hold someone else put on it makes the destroy fail, loudly,
instead of taking that along.
"""

from __future__ import annotations

import logging

from zrepl_py.catalog.rows import LOCAL_HOST
from zrepl_py.errors import Locked
from zrepl_py.files.plan import SCRATCH_PREFIX
from zrepl_py.invocation.context import Context
from zrepl_py.replication.snapshot_view import remove_dead_views
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName

log = logging.getLogger(__name__)


def lock_key(child: DatasetName) -> str:
    """The lock a run holds while it uses the scratch dataset ``child``."""
    return f"{LOCAL_HOST}:{child}"


def destroy_scratch(zfs: Zfs, child: DatasetName) -> None:
    """Destroy the scratch dataset ``child`` (its snapshots one by one, then itself), if it
    exists.

    Raises:
        ZfsError: a snapshot or the dataset could not be destroyed (held, cloned, with
            children): the message names it.
    """
    if not zfs.exists(child):
        return
    for snap in reversed(zfs.tree(child, recursive=False).snapshots(child)):
        zfs.destroy_snapshot(snap.name)
    zfs.destroy_filesystem(child)


def remove_leftovers(ctx: Context, scratch: DatasetName, own: DatasetName) -> list[DatasetName]:
    """Destroy the children ``zbak-files-*`` of ``scratch`` that no run holds, except
    ``own``, after the dead view clones of its pool; return those destroyed.

    Raises:
        DatasetNotFound: ``scratch`` does not exist.
        ZfsError, SnapshotViewError: a leftover could not be destroyed.
    """
    zfs = ctx.zfs(LOCAL_HOST, scratch.pool)
    remove_dead_views(zfs, scratch.pool)
    below = zfs.dataset_properties(scratch, ["type"], recursive=True)
    children = sorted(c for c in below if c != own and c.rpartition("/")[0] == scratch
                      and c.rpartition("/")[2].startswith(SCRATCH_PREFIX))
    removed = []
    for child in children:
        try:
            with ctx.lock(lock_key(child), "restore"):
                log.warning("removing %s, left by a file restore that was interrupted", child)
                destroy_scratch(zfs, child)
                removed.append(child)
        except Locked:
            continue  # a running restore's
    return removed
