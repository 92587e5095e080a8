"""The steps a replication or archive plan is made of: what to send and what to do on the
receiving side (PURE data; ``zfs.sendrecv`` turns a step into ``zfs send``/``receive`` argv).

Snapshots are referred to by guid and createtxg as well as name (``SnapRef``): replication
decides what is common by guid, never by name (docs/design.md#replication).
"""

from __future__ import annotations

import dataclasses

from zrepl_py.zfs.resume import ResumeToken


@dataclasses.dataclass(frozen=True)
class SnapRef:
    """One snapshot of one side.

    Attributes:
        name: the short name (after ``@``).
        guid: its guid (64-bit unsigned), equal on source and replica.
        createtxg: its createtxg on the side it was listed on (differs between sides).
    """

    name: str
    guid: int
    createtxg: int


@dataclasses.dataclass(frozen=True)
class BookmarkRef:
    """One bookmark of the source dataset.

    Attributes:
        name: the short name (after ``#``).
        guid: the guid of the snapshot it was made from.
        createtxg: that snapshot's createtxg.
    """

    name: str
    guid: int
    createtxg: int


@dataclasses.dataclass(frozen=True)
class AbortResume:
    """``zfs receive -A TARGET``: drop the partial receive. ``reason`` is logged."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Resume:
    """``zfs send -t TOKEN | zfs receive -s``: finish the interrupted stream to ``to``
    (the source snapshot with the token's toguid)."""

    token: ResumeToken
    to: SnapRef


@dataclasses.dataclass(frozen=True)
class Full:
    """``zfs send DS@to | zfs receive``: a full stream of ``to`` into a new target dataset."""

    to: SnapRef


@dataclasses.dataclass(frozen=True)
class Incremental:
    """An incremental stream from ``base`` (on the source) to ``to``.

    ``intermediates`` sends every snapshot in between (``zfs send -I``); without it only
    ``to`` arrives (``-i``). A bookmark base only allows ``-i`` (zfs-send(8)).

    Raises:
        ValueError: ``intermediates`` with a bookmark base.
    """

    base: SnapRef | BookmarkRef
    to: SnapRef
    intermediates: bool

    def __post_init__(self) -> None:
        if self.intermediates and isinstance(self.base, BookmarkRef):
            raise ValueError("zfs send -I does not take a bookmark as its base; use -i")


@dataclasses.dataclass(frozen=True)
class Rollback:
    """Destroy the target snapshots ``destroy`` (short names, newest first, plain
    ``zfs destroy`` each), then ``zfs rollback TARGET@to`` (no ``-r``). Only planned with
    ``on_divergence="rollback"``."""

    to: SnapRef
    destroy: tuple[str, ...]


Step = AbortResume | Resume | Full | Incremental | Rollback
