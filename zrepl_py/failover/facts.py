"""The listings the failover and failback planners read (``failover.plan``).

Per side, two commands: the tree with every snapshot (``Zfs.tree``: guids and createtxg) and
one ``zfs get`` of the properties the plans need, with their sources
(``Zfs.dataset_properties``). What a ZFS does not know is not asked: zfs-fuse has no
``written``, ``encryption`` or ``dnodesize`` (their values then count as unknown, not
encrypted and legacy). Where ``written`` exists the pool is synced first (``zpool sync``:
until a transaction group is written out, ``written`` still reads 0 for data written
seconds ago).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from zrepl_py.errors import DatasetNotFound, InvalidName, UsageError, ZfsError
from zrepl_py.failover.plan import ReceiverLimits, ReplicaState, SourceState
from zrepl_py.values.failover import (
    FAILOVER_PROPERTY,
    MOUNTPOINT_PROPERTY,
    SOURCE_PROPERTY,
    FailoverMark,
    SourceMark,
)
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.encryption import is_encryption_on
from zrepl_py.zfs.model import PropertyValue, Tree
from zrepl_py.zfs.names import DatasetName
from zrepl_py.zfs.steps import SnapRef

log = logging.getLogger(__name__)

_UNSET = PropertyValue("-", "-")


def _refs(tree: Tree, dataset: DatasetName) -> tuple[SnapRef, ...]:
    return tuple(SnapRef(s.short, s.guid, s.createtxg) for s in tree.snapshots(dataset))


def _mark(value: PropertyValue, dataset: DatasetName, prop: str,
          kind: type[FailoverMark] | type[SourceMark]) -> FailoverMark | SourceMark | None:
    if value.source != "local" or value.value == "-":
        return None
    try:
        return kind.parse(value.value)
    except InvalidName as exc:
        raise UsageError(f"{dataset} carries a {prop} zbak did not write ({exc}): nothing was "
                         f"done; look at it, then remove it (zfs inherit {prop} {dataset})"
                         ) from None


def _written(zfs: Zfs, pool: str) -> bool:
    """Whether ``written`` can be read and trusted on ``pool`` now (synced first)."""
    if not zfs.capabilities.written:
        return False
    try:
        zfs.sync_pool(pool)
    except ZfsError as exc:
        log.warning("zpool sync %s failed (%s): 'written' is not trusted", pool, exc)
        return False
    return True


def _tree(zfs: Zfs, root: DatasetName, *, recursive: bool) -> Tree | None:
    try:
        return zfs.tree(root, recursive=recursive)
    except DatasetNotFound:
        return None


def _int(value: PropertyValue) -> int | None:
    return int(value.value) if value.value.isdigit() else None


def readonly_values(zfs: Zfs, root: DatasetName, listed: Mapping[DatasetName,
                    Mapping[str, PropertyValue]], *, recursive: bool) -> dict[DatasetName,
                                                                          PropertyValue]:
    """Each dataset's ``readonly``. zfs-fuse shows a mounted dataset's as ``off``, source
    ``temporary`` (its mount's option), whatever was set and is enforced, and hides the set
    value from ``zfs get -s local`` too (seen on zfs-fuse 0.7: writes fail with "Read-only
    file system" while it reads ``off temporary``): where a listing says ``temporary``, the
    value set on the dataset is looked for with ``zfs get -s local`` and, not found, is
    ``-`` (unknown)."""
    found = {name: got.get("readonly", _UNSET) for name, got in listed.items()}
    if any(value.source == "temporary" for value in found.values()):
        local = zfs.set_here(root, "readonly", recursive=recursive)
        for name, value in found.items():
            if value.source == "temporary":
                here = local.get(str(name))
                found[name] = PropertyValue(here, "local") if here is not None else _UNSET
    return found


def replica_states(zfs: Zfs, root: DatasetName, *, recursive: bool) -> tuple[ReplicaState, ...]:
    """The replica datasets at and below ``root`` (only ``root`` unless ``recursive``),
    parents first; () when ``root`` does not exist.

    Raises:
        UsageError: a dataset carries a mark zbak did not write.
        ZfsError, HostUnreachable: the listing failed.
    """
    tree = _tree(zfs, root, recursive=recursive)
    if tree is None:
        return ()
    caps = zfs.capabilities
    props = ["type", FAILOVER_PROPERTY, "readonly", "mountpoint", "canmount", "mounted",
             MOUNTPOINT_PROPERTY, "version"]
    written = _written(zfs, root.pool)
    props += ["written"] if written else []
    props += ["encryption"] if caps.raw_send else []
    props += ["dnodesize"] if caps.receive_properties else []
    listed = zfs.dataset_properties(root, props, recursive=recursive)
    readonly = readonly_values(zfs, root, listed, recursive=recursive)
    states = []
    for info in tree.datasets:
        got = listed.get(info.name, {})
        mark = _mark(got.get(FAILOVER_PROPERTY, _UNSET), info.name, FAILOVER_PROPERTY,
                     FailoverMark)
        recorded = got.get(MOUNTPOINT_PROPERTY, _UNSET)
        states.append(ReplicaState(
            name=info.name, kind=info.kind, snapshots=_refs(tree, info.name),
            mark=mark if isinstance(mark, FailoverMark) else None,
            readonly=readonly.get(info.name, _UNSET).value == "on",
            mountpoint=got.get("mountpoint", _UNSET).value,
            mountpoint_local=got.get("mountpoint", _UNSET).source == "local",
            canmount=got.get("canmount", _UNSET).value,
            mounted=got.get("mounted", _UNSET).value == "yes",
            source_mountpoint=recorded.value if recorded.source == "local" else None,
            written=_int(got.get("written", _UNSET)) if written else None,
            zpl_version=_int(got.get("version", _UNSET)),
            encrypted=is_encryption_on(got.get("encryption", _UNSET).value),
            large_dnodes=got.get("dnodesize", PropertyValue("legacy", "-")).value
            not in ("legacy", "-")))
    return tuple(states)


def source_states(zfs: Zfs, root: DatasetName) -> dict[str, SourceState]:
    """The datasets at and below ``root`` (every one: a failback's rename moves them all)
    by their path below it; {} when ``root`` does not exist.

    Raises:
        UsageError: a dataset carries a mark zbak did not write.
        ZfsError, HostUnreachable: the listing failed.
    """
    tree = _tree(zfs, root, recursive=True)
    if tree is None:
        return {}
    written = _written(zfs, root.pool)
    props = ["type", SOURCE_PROPERTY, "readonly", "mounted",
             *(["written"] if written else [])]
    listed = zfs.dataset_properties(root, props, recursive=True)
    readonly_of = readonly_values(zfs, root, listed, recursive=True)
    found = {}
    for info in tree.datasets:
        got = listed.get(info.name, {})
        mark = _mark(got.get(SOURCE_PROPERTY, _UNSET), info.name, SOURCE_PROPERTY, SourceMark)
        readonly = readonly_of.get(info.name, _UNSET)
        found[info.name.relative_to(root)] = SourceState(
            name=info.name, kind=info.kind, snapshots=_refs(tree, info.name),
            origin=info.origin, mark=mark if isinstance(mark, SourceMark) else None,
            readonly=None if readonly.value == "-" else readonly.value == "on",
            readonly_local=readonly.value if readonly.source == "local" else None,
            mounted=got.get("mounted", _UNSET).value == "yes",
            written=_int(got.get("written", _UNSET)) if written else None)
    return found


def receiver_limits(zfs: Zfs, pool: str) -> ReceiverLimits:
    """What ``pool`` can receive: its root dataset's ZPL ``version`` (the newest its ZFS
    writes there) and its encryption and large_dnode features (``zfs`` with capabilities).

    Raises:
        ZfsError: the version cannot be read.
    """
    version = zfs.get_properties(pool, ["version"]).get("version", "-")
    caps = zfs.capabilities
    return ReceiverLimits(int(version) if version.isdigit() else None,
                          caps.feature_enabled("encryption"), caps.feature_enabled("large_dnode"))

