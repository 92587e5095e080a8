"""Protect the replication base on the source: a hold per (job, target), plus a bookmark.

A hold (zfs-hold(8)) makes ``zfs destroy`` of the snapshot fail, whoever prunes, so the
next incremental's base survives while a target is offline. The new base is held BEFORE the
old one is released, so there is never a moment without protection. Where the pool has
bookmarks, the base is also bookmarked: even if an admin releases the hold and destroys the
snapshot, ``zfs send -i DS#bookmark`` can still continue the chain (zfs-bookmark(8)).

A bookmark is trusted by guid, never by name: one that already carries the cursor's name
but was made from another snapshot (by hand, or left by a dataset that was renamed into
place) would be no base at all once the snapshot is gone, and the next run would stop as
diverged. It is destroyed and made again from the right snapshot, with a warning
(docs/decisions.md#a-cursor-bookmark-is-trusted-by-guid).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Sequence

from zrepl_py.errors import DatasetNotFound, HoldExists, HoldNotFound, HoldNotReleased, ZfsError
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.model import BookmarkInfo
from zrepl_py.zfs.names import BookmarkName, DatasetName, SnapshotName, check_hold_tag

log = logging.getLogger(__name__)


def hold_tag(job: str, target: str) -> str:
    """The hold tag ``zbak:<job>:<target>`` for one job and target (validated)."""
    return check_hold_tag(f"zbak:{job}:{target}")


def bookmark_prefix(job: str, target: str) -> str:
    """Prefix of zbak's cursor bookmarks for (job, target); a hash keeps it a valid short name."""
    return "zbak_" + hashlib.sha256(f"{job}\0{target}".encode()).hexdigest()[:10] + "_"


@dataclasses.dataclass(frozen=True)
class BaseMove:
    """One dataset's replication base moving: hold ``dataset@new_short`` (guid ``new_guid``),
    then release ``dataset@old_short`` (None on the first replication)."""

    dataset: DatasetName
    new_short: str
    new_guid: int
    old_short: str | None


@dataclasses.dataclass
class Moved:
    """What ``move_protection_many`` did not do.

    Attributes:
        failed: ``{dataset: error}`` of each dataset whose new base could not be held or
            bookmarked: its old base keeps its hold; the caller must not move its cursor.
        unreleased: a ``HoldNotReleased`` naming the old bases whose hold zfs would not
            release (their new bases are held: the cursors may move), or None.
    """

    failed: dict[DatasetName, ZfsError] = dataclasses.field(default_factory=dict)
    unreleased: HoldNotReleased | None = None


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
        HoldNotReleased: the new base is held, the old one's hold stays (``Moved``).
    """
    moved = move_protection_many(zfs, [BaseMove(dataset, new_short, new_guid, old_short)],
                                 job=job, target=target)
    if moved.failed:
        raise moved.failed[dataset]
    if moved.unreleased:
        raise moved.unreleased


def move_protection_many(zfs: Zfs, moves: Sequence[BaseMove], *, job: str, target: str
                         ) -> Moved:
    """``move_protection`` for several datasets of one source host, batched: one ``zfs hold``
    of every new base, the bookmarks (one listing; ``zfs bookmark`` takes one snapshot, so
    one per dataset), then one ``zfs release`` of the old bases. Every new hold is placed
    before any old one is released.

    zfs goes on past a snapshot it cannot hold or release and fails at the end
    (``Zfs.hold_many``), so after a failed batch each snapshot is tried alone: an existing
    hold counts as placed, a missing hold or snapshot as released. A release zfs refuses
    otherwise (permission, a lost connection) leaves one hold too many, never one too few:
    it is reported (``Moved.unreleased``) and the other datasets go on.

    Returns:
        What was not done (``Moved``); nothing raised for a single dataset.
    """
    tag = hold_tag(job, target)
    failed: dict[DatasetName, ZfsError] = {}
    held = _hold_each(zfs, moves, tag, failed)
    caps = zfs.capabilities
    if caps is not None and caps.bookmarks and held:
        prefix = bookmark_prefix(job, target)
        try:
            marks = zfs.bookmarks_of([m.dataset for m in held])
        except ZfsError as exc:
            failed.update((m.dataset, exc) for m in held)
            held = []
        else:
            for move in list(held):
                try:
                    _bookmark(zfs, move, prefix, marks.get(move.dataset, []))
                except ZfsError as exc:
                    failed[move.dataset] = exc
            held = [m for m in held if m.dataset not in failed]
    olds = [SnapshotName.of(m.dataset, m.old_short) for m in held
            if m.old_short and m.old_short != m.new_short]
    try:
        zfs.release_many(olds, tag)
    except ZfsError:
        return Moved(failed, _release_each(zfs, olds, tag))
    return Moved(failed)


def _release_each(zfs: Zfs, olds: Sequence[SnapshotName], tag: str) -> HoldNotReleased | None:
    """Release ``tag`` on each of ``olds`` alone; the refusals, as one error (or None)."""
    refused = []
    for old in olds:
        try:
            zfs.release(old, tag)
        except (HoldNotFound, DatasetNotFound):
            pass  # already released or destroyed: nothing left to protect
        except ZfsError as exc:
            log.warning("could not release hold %s on %s, the old base: %s", tag, old, exc)
            refused.append(f"{old}: {exc}")
    if not refused:
        return None
    return HoldNotReleased(
        f"hold {tag} stays on {len(refused)} old base snapshot(s) zfs would not release "
        f"({'; '.join(refused)}); the new bases are held and the cursors moved. Until it "
        f"goes, such a snapshot cannot be pruned: run zbak holds release-stale")


def _hold_each(zfs: Zfs, moves: Sequence[BaseMove], tag: str,
               failed: dict[DatasetName, ZfsError]) -> list[BaseMove]:
    """Hold every new base (one command; alone after a failure); return the moves held."""
    news = [SnapshotName.of(m.dataset, m.new_short) for m in moves]
    try:
        zfs.hold_many(news, tag)
        return list(moves)
    except ZfsError:
        pass
    held = []
    for move, new in zip(moves, news, strict=True):
        try:
            zfs.hold(new, tag)
        except HoldExists:
            pass
        except ZfsError as exc:
            failed[move.dataset] = exc
            continue
        held.append(move)
    return held


def _bookmark(zfs: Zfs, move: BaseMove, prefix: str, marks: list[BookmarkInfo]) -> None:
    """Bookmark the new base as zbak's cursor (by guid, see the module doc) and remove the
    older cursor bookmarks of this (job, target)."""
    new = SnapshotName.of(move.dataset, move.new_short)
    mark = BookmarkName(f"{move.dataset}#{prefix}{move.new_guid:016x}")
    existing = {str(b.name): b.guid for b in marks}
    if str(mark) in existing and existing[str(mark)] != move.new_guid:
        log.warning("%s has the name of zbak's cursor for %s but was made from another "
                    "snapshot (guid %d, not %d): replacing it with a bookmark of %s",
                    mark, new, existing[str(mark)], move.new_guid, new)
        zfs.destroy_bookmark(mark)
        del existing[str(mark)]
    if str(mark) not in existing:
        zfs.bookmark(new, mark)
    for name in existing:
        if name.split("#", 1)[1].startswith(prefix) and name != str(mark):
            _quietly(zfs.destroy_bookmark, BookmarkName(name))


def _quietly(action: Callable[[BookmarkName], None], name: BookmarkName) -> None:
    try:
        action(name)
    except ZfsError as exc:
        log.warning("could not remove old cursor bookmark %s: %s", name, exc)
