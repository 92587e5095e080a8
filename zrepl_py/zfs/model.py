"""Plain, frozen values the ZFS client returns: snapshots, bookmarks, datasets, a listed tree,
property values with their source, pool health.

Nothing here runs a command. ``build_tree`` turns parsed listing rows into a ``Tree`` so the
two listing commands (``zfs get`` and ``zfs list -p``) share one code path and give equal
results.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping

from zrepl_py.clock import from_epoch
from zrepl_py.zfs.names import BookmarkName, DatasetName, SnapshotName


@dataclasses.dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot as ZFS reports it.

    Attributes:
        name: the full name ``DATASET@SHORT``.
        guid: the snapshot's guid (64-bit unsigned); equal guids mean the same snapshot
            on any pool (replication's notion of "common", docs/design.md#replication).
        createtxg: the transaction group it was created in; orders snapshots of one
            dataset (docs/style.md#utc-everywhere-and-order-by-createtxg), unique within a dataset.
        creation: creation time, aware UTC, whole seconds (``zfs get -p creation``).
        userrefs: number of user holds on it (``zfs hold``).
    """

    name: SnapshotName
    guid: int
    createtxg: int
    creation: dt.datetime
    userrefs: int

    @property
    def dataset(self) -> DatasetName:
        """The dataset the snapshot belongs to."""
        return self.name.dataset

    @property
    def short(self) -> str:
        """The part after ``@``."""
        return self.name.short


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """One filesystem or volume.

    Attributes:
        name: its name.
        guid: its guid (64-bit unsigned).
        createtxg: the transaction group it was created in.
        origin: for a clone, the snapshot it was cloned from; ``None`` otherwise.
        kind: ``"filesystem"`` or ``"volume"`` (the ``type`` property).
    """

    name: DatasetName
    guid: int
    createtxg: int
    origin: SnapshotName | None
    kind: str


@dataclasses.dataclass(frozen=True)
class Tree:
    """A dataset, optionally its descendants, and their snapshots, from one listing command.

    Attributes:
        root: the dataset the listing started at.
        datasets: ``root`` first, then descendants, each parent before its children and
            siblings in name order.
    """

    root: DatasetName
    datasets: list[DatasetInfo]
    _snapshots: dict[str, list[SnapshotInfo]] = dataclasses.field(repr=False)

    def dataset(self, name: DatasetName | str) -> DatasetInfo:
        """Return the listed dataset ``name``.

        Raises:
            KeyError: when ``name`` was not part of the listing.
        """
        for info in self.datasets:
            if info.name == name:
                return info
        raise KeyError(f"{name} is not in the listing of {self.root}")

    def snapshots(self, dataset: DatasetName | str) -> list[SnapshotInfo]:
        """Return the snapshots of ``dataset``, oldest first (by createtxg).

        Raises:
            KeyError: when ``dataset`` was not part of the listing.
        """
        if dataset not in self._snapshots:
            raise KeyError(f"{dataset} is not in the listing of {self.root}")
        return list(self._snapshots[dataset])


@dataclasses.dataclass(frozen=True)
class BookmarkInfo:
    """One bookmark as ZFS reports it (zfs-bookmark(8)).

    Attributes:
        name: the full name ``DATASET#SHORT``.
        guid: the guid of the snapshot it was made from (a bookmark keeps it, so it still
            counts as "common" with a replica holding that snapshot).
        createtxg: that snapshot's createtxg.
        creation: that snapshot's creation time, aware UTC, whole seconds.
    """

    name: BookmarkName
    guid: int
    createtxg: int
    creation: dt.datetime

    @property
    def dataset(self) -> DatasetName:
        """The dataset the bookmark belongs to."""
        return DatasetName(self.name.split("#", 1)[0])

    @property
    def short(self) -> str:
        """The part after ``#``."""
        return self.name.split("#", 1)[1]


@dataclasses.dataclass(frozen=True)
class PropertyValue:
    """One property of one dataset as ``zfs get -o value,source`` prints it.

    Attributes:
        value: the value (parsable with ``-p``); ``-`` when a user property is not set.
        source: ``local``, ``received``, ``default``, ``temporary``, ``-`` (not set or not
            settable), or ``inherited from DATASET`` (zfs-get(8) "source" column).
    """

    value: str
    source: str

    @property
    def inherited_from(self) -> str | None:
        """The dataset the value is inherited from (where it is set), else None."""
        head = "inherited from "
        return self.source[len(head):] if self.source.startswith(head) else None


@dataclasses.dataclass(frozen=True)
class PoolHealth:
    """A pool's state before a run (docs/design.md#operations: ``zpool status``, not
    ``-x``).

    Attributes:
        pool: the pool name.
        state: the ``state:`` line of ``zpool status``: ONLINE, DEGRADED, FAULTED,
            OFFLINE, UNAVAIL, REMOVED, SUSPENDED; ``UNKNOWN`` if the line is missing.
        free_bytes: bytes writable at the pool's root dataset (``zfs get -p available``),
            which is below ``zpool free`` by the reserved slop space.
        status_text: the full ``zpool status POOL`` output, for alerts.
    """

    pool: str
    state: str
    free_bytes: int
    status_text: str

    @property
    def online(self) -> bool:
        """True when the pool state is ONLINE."""
        return self.state == "ONLINE"


class ListingError(ValueError):
    """A listing row misses a property or holds a value that does not parse."""


def _int(props: Mapping[str, str], key: str, name: str) -> int:
    try:
        return int(props[key])
    except KeyError:
        raise ListingError(f"{name}: no {key} in the listing") from None
    except ValueError:
        raise ListingError(f"{name}: {key}={props[key]!r} is not an integer") from None


def build_tree(
    root: DatasetName, rows: Iterable[tuple[str, Mapping[str, str]]], *, recursive: bool
) -> Tree:
    """Build a Tree from listing rows ``(name, {property: parsable value})``.

    Args:
        root: the listed dataset.
        rows: one per object with at least ``type``, ``guid``, ``createtxg``, ``creation``
            (epoch seconds), ``userrefs`` (snapshots; ``-`` counts as 0) and ``origin``
            (``-`` for none). Bookmarks and names holding ``%`` (ZFS-internal temporary
            datasets such as a partial receive's ``%recv``) are skipped.
        recursive: False keeps only ``root`` and its snapshots (a ``-d 1`` listing also
            shows direct children).

    Raises:
        ListingError: a row misses a property or has an unparsable value.
        InvalidName: a listed name breaks the naming rules.
    """
    datasets: list[DatasetInfo] = []
    snapshots: dict[DatasetName, list[SnapshotInfo]] = {}
    for name, props in rows:
        if "%" in name:
            continue
        kind = props.get("type")
        if kind == "snapshot":
            snap = SnapshotName(name)
            if not recursive and snap.dataset != root:
                continue
            refs = props.get("userrefs", "-")
            snapshots.setdefault(snap.dataset, []).append(
                SnapshotInfo(
                    name=snap,
                    guid=_int(props, "guid", name),
                    createtxg=_int(props, "createtxg", name),
                    creation=from_epoch(_int(props, "creation", name)),
                    userrefs=0 if refs in ("-", "") else _int(props, "userrefs", name),
                )
            )
        elif kind in ("filesystem", "volume"):
            ds = DatasetName(name)
            if not recursive and ds != root:
                continue
            origin = props.get("origin", "-")
            datasets.append(
                DatasetInfo(
                    name=ds,
                    guid=_int(props, "guid", name),
                    createtxg=_int(props, "createtxg", name),
                    origin=None if origin in ("-", "") else SnapshotName(origin),
                    kind=kind,
                )
            )
        elif kind is None:
            raise ListingError(f"{name}: no type in the listing")
    datasets.sort(key=lambda info: tuple(info.name.split("/")))
    if not datasets or datasets[0].name != root:
        raise ListingError(f"{root} itself is missing from its listing")
    known = {info.name for info in datasets}
    stray = sorted(set(snapshots) - known)
    if stray:
        raise ListingError(f"snapshots of unlisted datasets: {', '.join(stray)}")
    ordered: dict[str, list[SnapshotInfo]] = {
        info.name: sorted(snapshots.get(info.name, []), key=lambda s: (s.createtxg, s.guid))
        for info in datasets
    }
    return Tree(root=root, datasets=datasets, _snapshots=ordered)
