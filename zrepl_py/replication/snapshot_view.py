"""A snapshot's files as a read-only directory on the snapshot's own host (rsync's source).

Two ways, tried in this order:

1. ``MOUNTPOINT/.zfs/snapshot/SHORT`` (OpenZFS, zfs-snapshot(8)/zfsprops(7) ``snapdir``):
   reachable by path even when ``snapdir=hidden``, automounted on first access, read-only.
   Used when the dataset is mounted and ``test -d`` finds that directory there.
2. Otherwise (zfs-fuse has no ``.zfs`` directory, docs/testbed.md#zfs-fuse; an unmounted or
   legacy-mounted dataset) a temporary clone ``POOL/zbak-view-<12 hex>`` made with
   ``zfs clone -o mountpoint=<mktemp -d dir> -o readonly=on -o zbak:view-of=SNAPSHOT
   -o zbak:view-owner=STAMP``.
   A clone must live in its origin's pool (zfs-clone(8)). Seen on zfs-fuse 0.7: both ``-o``
   options work at clone time and the clone is mounted when ``zfs clone`` returns; the mount
   refuses writes ("Read-only file system") although ``zfs get readonly`` then prints
   ``off`` with source ``temporary``; ``zfs destroy`` of the clone answers "dataset is busy"
   for a moment after use, so it is retried. The user properties name the snapshot and
   the process that made the clone (``runtime.owner``), so a leftover (after ``kill -9``)
   is recognised and ``remove_dead_views`` removes it once that process is gone
   (docs/decisions.md#temporary-datasets-carry-their-owner).

Every command runs through the Zfs client or its executor, so the source may be this machine
or an SSH host. The clone is destroyed (plain ``zfs destroy``, never ``-r``/``-R``) and its
mount directory removed (``rmdir``, never ``rm -r``) when the ``with`` block ends, on success,
on error and on KeyboardInterrupt.

While a view clone exists, ``Zfs.clones`` shows it as a dependent of the snapshot, so the
pruner keeps that snapshot; a recursive ``zfs snapshot -r POOL@x`` taken meanwhile would
snapshot the clone too and make its destroy fail (reported, never forced): the per-dataset
lock keeps zbak's own runs apart.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import secrets
from collections.abc import Iterator

from zrepl_py.errors import SnapshotViewError, ZbakError
from zrepl_py.runtime.owner import owner_gone, this_process
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName, SnapshotName

log = logging.getLogger(__name__)

VIEW_PREFIX = "zbak-view-"
"""Name prefix of temporary view clones, directly below the pool: ``POOL/zbak-view-<hex>``."""

VIEW_PROPERTY = "zbak:view-of"
"""User property set on a view clone: the snapshot it shows."""

OWNER_PROPERTY = "zbak:view-owner"
"""User property set on a view clone: the stamp of the process that made it
(``runtime.owner``)."""

MOUNT_TEMPLATE = "/tmp/zbak-view.XXXXXXXXXX"
"""``mktemp -d`` template for a clone's mountpoint on the source host (GNU, BSD, busybox)."""

DESTROY_ATTEMPTS = 20
DESTROY_DELAY = 0.5  # seconds between "dataset is busy" retries: up to ~10 s in all


def snapdir_path(mountpoint: str, snapshot: SnapshotName) -> str:
    """Return ``MOUNTPOINT/.zfs/snapshot/SHORT`` for a dataset mounted at ``mountpoint``.

    Args:
        mountpoint: the dataset's absolute ``mountpoint`` property value.
        snapshot: the snapshot.
    """
    return posixpath.join(mountpoint, ".zfs", "snapshot", SnapshotName(snapshot).short)


@contextlib.contextmanager
def snapshot_view(
    zfs: Zfs,
    snapshot: SnapshotName | str,
    *,
    destroy_attempts: int = DESTROY_ATTEMPTS,
    destroy_delay: float = DESTROY_DELAY,
) -> Iterator[str]:
    """Yield an absolute directory on ``zfs``'s host holding ``snapshot``'s files, read-only.

    Usage::

        with snapshot_view(zfs, SnapshotName("tank/data@zbak_20240101T000000Z")) as path:
            ...  # read path (e.g. rsync path/ somewhere)

    The path is ``.zfs/snapshot/SHORT`` where the host has it, else the mountpoint of a
    temporary clone that is destroyed when the block ends (see the module doc). Only the
    dataset's own files are there: child datasets are separate file systems.

    Args:
        zfs: client for the snapshot's host (local or SSH executor).
        snapshot: the snapshot to show.
        destroy_attempts, destroy_delay: retries of the clone's ``zfs destroy`` while it
            answers "dataset is busy", ``destroy_delay`` seconds apart.

    Raises:
        DatasetNotFound: the snapshot or its dataset does not exist.
        SnapshotViewError: the dataset is a volume (no files); the clone did not mount; the
            clone could not be destroyed afterwards (the message names it; when the block
            itself raised, that error propagates instead and this one is logged and attached
            as a note).
        ZfsError, HostUnreachable: from the commands run.
    """
    snap = SnapshotName(snapshot)
    props = zfs.get_properties(snap.dataset, ["type", "mountpoint", "mounted"])
    if props.get("type") == "volume":
        raise SnapshotViewError(f"[{zfs.host}] {snap} is a volume snapshot: no files to read")
    mountpoint = props.get("mountpoint", "")
    if props.get("mounted") == "yes" and mountpoint.startswith("/"):
        path = snapdir_path(mountpoint, snap)
        if zfs.executor.run(["test", "-d", path], check=False).returncode == 0:
            log.debug("[%s] %s: reading %s", zfs.host, snap, path)
            yield path
            return
    with _temporary_clone(zfs, snap, destroy_attempts, destroy_delay) as path:
        yield path


@contextlib.contextmanager
def _temporary_clone(
    zfs: Zfs, snap: SnapshotName, attempts: int, delay: float
) -> Iterator[str]:
    """Clone ``snap`` read-only onto a fresh temporary directory; always clean up."""
    mount_dir = zfs.executor.run(["mktemp", "-d", MOUNT_TEMPLATE]).text.strip()
    if not mount_dir.startswith("/"):
        raise SnapshotViewError(f"[{zfs.host}] mktemp -d printed {mount_dir!r}, not a path")
    clone = DatasetName(f"{snap.dataset.pool}/{VIEW_PREFIX}{secrets.token_hex(6)}")
    properties = {"mountpoint": mount_dir, "readonly": "on", VIEW_PROPERTY: str(snap),
                  OWNER_PROPERTY: this_process().stamp()}
    try:
        zfs.clone(snap, clone, properties)
        log.info("[%s] reading %s through temporary clone %s at %s", zfs.host, snap, clone,
                 mount_dir)
        mounted = zfs.get_properties(clone, ["mounted"]).get("mounted")
        if mounted != "yes":
            raise SnapshotViewError(
                f"[{zfs.host}] temporary clone {clone} of {snap} is not mounted at {mount_dir} "
                f"(mounted={mounted})"
            )
        yield mount_dir
    except BaseException as exc:
        _cleanup(zfs, clone, mount_dir, attempts, delay, pending=exc)
        raise
    _cleanup(zfs, clone, mount_dir, attempts, delay, pending=None)


def _cleanup(
    zfs: Zfs,
    clone: DatasetName,
    mount_dir: str,
    attempts: int,
    delay: float,
    *,
    pending: BaseException | None,
) -> None:
    """Destroy the clone if it exists (retrying "busy"), then remove its empty mount dir.

    Raises:
        SnapshotViewError: the clone survives and no error is ``pending``; with one pending,
            the problem is logged and added to that error as a note instead, so the first
            cause stays the one raised.
    """
    try:
        if zfs.exists(clone):
            zfs.destroy_filesystem(clone, attempts=attempts, delay=delay)
    except ZbakError as exc:
        message = (
            f"[{zfs.host}] could not destroy temporary clone {clone} ({exc}); "
            f"destroy it with `zfs destroy {clone}`, then `rmdir {mount_dir}`"
        )
        log.error("%s", message)
        if pending is None:
            raise SnapshotViewError(message) from exc
        pending.add_note(message)
        return
    if not mount_dir:
        return
    done = zfs.executor.run(["rmdir", "--", mount_dir], check=False)
    if done.returncode != 0:
        log.warning("[%s] could not remove %s: %s", zfs.host, mount_dir, done.error_text)


def remove_dead_views(zfs: Zfs, pool: str, *, destroy_attempts: int = DESTROY_ATTEMPTS,
                      destroy_delay: float = DESTROY_DELAY) -> list[DatasetName]:
    """Destroy the view clones in ``pool`` (a pool, or a dataset of it) whose owner is gone
    (a run killed while it read a snapshot), with their empty mount directories; return the
    clones destroyed.

    A view clone is a dataset ``POOL/zbak-view-*`` with a ``VIEW_PROPERTY``; it is destroyed
    only when its ``OWNER_PROPERTY`` names a process of this machine that no longer runs
    (``runtime.owner.owner_gone``): a clone of a live run, of another machine's run, or
    without an owner (made before owners were recorded) is kept. Two commands when nothing
    is left over: the pool's clones (``Zfs.clones``) and, for each ``zbak-view-*`` among
    them, its properties.

    Raises:
        DatasetNotFound: no such pool.
        SnapshotViewError: a dead owner's clone could not be destroyed (the message names it).
        ZfsError, HostUnreachable: from the commands run.
    """
    removed: list[DatasetName] = []
    prefix = f"{DatasetName(pool).pool}/{VIEW_PREFIX}"
    views = sorted({c for clones in zfs.clones(DatasetName(pool).pool).values() for c in clones
                    if c.startswith(prefix) and "/" not in c[len(prefix):]})
    for clone in views:
        props = zfs.get_properties(clone, [VIEW_PROPERTY, OWNER_PROPERTY, "mountpoint"])
        stamp = props.get(OWNER_PROPERTY, "-")
        if props.get(VIEW_PROPERTY, "-") == "-" or owner_gone(stamp) is not True:
            continue
        log.warning("[%s] removing %s, the view of %s left by a run that is gone", zfs.host,
                    clone, props.get(VIEW_PROPERTY))
        mount_dir = props.get("mountpoint", "")
        ours = mount_dir.startswith(MOUNT_TEMPLATE.rstrip("X"))  # rmdir only what mktemp made
        _cleanup(zfs, clone, mount_dir if ours else "", destroy_attempts, destroy_delay,
                 pending=None)
        removed.append(clone)
    return removed
