"""Protect the replication base on the source: a hold per (job, target), plus a bookmark.

A hold (zfs-hold(8)) makes ``zfs destroy`` of the snapshot fail, whoever prunes, so the
next incremental's base survives while a target is offline. The new base is held BEFORE the
old one is released, so there is never a moment without protection. Where the pool has
bookmarks, the base is also bookmarked: even if an admin releases the hold and destroys the
snapshot, ``zfs send -i DS#bookmark`` can still continue the chain (zfs-bookmark(8)).

A bookmark is trusted by guid, never by name: one that already carries the cursor's name
but was made from another snapshot (by hand, or left by a dataset that was renamed into
place) would be no base at all once the snapshot is gone, and the next run would stop as
diverged. It is destroyed and made again from the right snapshot, with a warning (issue 18
item 5).
"""

from __future__ import annotations

import hashlib
import logging

from zrepl_py.errors import DatasetNotFound, HoldExists, HoldNotFound, ZfsError
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import BookmarkName, DatasetName, SnapshotName, check_hold_tag

log = logging.getLogger(__name__)


def hold_tag(job: str, target: str) -> str:
    """The hold tag ``zbak:<job>:<target>`` for one job and target (validated)."""
    return check_hold_tag(f"zbak:{job}:{target}")


def bookmark_prefix(job: str, target: str) -> str:
    """Prefix of zbak's cursor bookmarks for (job, target); a hash keeps it a valid short name."""
    return "zbak_" + hashlib.sha256(f"{job}\0{target}".encode()).hexdigest()[:10] + "_"


def move_protection(
    zfs: Zfs,
    dataset: DatasetName,
    new_short: str,
    new_guid: int,
    old_short: str | None,
    *,
    job: str,
    target: str,
) -> None:
    """Hold (and bookmark) ``dataset@new_short``, then release the hold on ``old_short``.

    Args:
        zfs: client for the SOURCE host, with capabilities probed.
        dataset: the source dataset.
        new_short / new_guid: the snapshot the target now has (the new incremental base).
        old_short: the previous base, or None on the first replication.
        job / target: identify the tag and bookmark.

    Raises:
        ZfsError: the hold could not be placed (the old one is then kept).
    """
    tag = hold_tag(job, target)
    new = SnapshotName.of(dataset, new_short)
    try:
        zfs.hold(new, tag)
    except HoldExists:
        pass
    caps = zfs.capabilities
    if caps is not None and caps.bookmarks:
        prefix = bookmark_prefix(job, target)
        mark = BookmarkName(f"{dataset}#{prefix}{new_guid:016x}")
        existing = {str(b.name): b.guid for b in zfs.bookmarks(dataset)}
        if str(mark) in existing and existing[str(mark)] != new_guid:
            log.warning("%s has the name of zbak's cursor for %s but was made from another "
                        "snapshot (guid %d, not %d): replacing it with a bookmark of %s",
                        mark, new, existing[str(mark)], new_guid, new)
            zfs.destroy_bookmark(mark)
            del existing[str(mark)]
        if str(mark) not in existing:
            zfs.bookmark(new, mark)
        for name in existing:
            if name.split("#", 1)[1].startswith(prefix) and name != str(mark):
                _quietly(zfs.destroy_bookmark, BookmarkName(name))
    if old_short and old_short != new_short:
        try:
            zfs.release(SnapshotName.of(dataset, old_short), tag)
        except (HoldNotFound, DatasetNotFound):
            pass  # already released or destroyed: nothing left to protect


def _quietly(action, name) -> None:
    try:
        action(name)
    except ZfsError as exc:
        log.warning("could not remove old cursor bookmark %s: %s", name, exc)
