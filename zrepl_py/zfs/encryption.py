"""Which datasets are encrypted, and which of those have their key loaded: the one probe of
``encryption`` and ``keystatus`` (zfsprops(7)) that replication, archive and restore ask."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from zrepl_py.errors import Unsupported
from zrepl_py.zfs.capabilities import FEATURE_FLAGS_VERSION, Capabilities
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName

_OFF = ("off", "-", "")
"""``encryption`` values of a dataset that is not encrypted (``-``: not applicable)."""


@dataclasses.dataclass(frozen=True)
class Encryption:
    """What the probe found among the datasets it was asked about.

    Attributes:
        encrypted: those whose ``encryption`` is not ``off``.
        locked: those of ``encrypted`` whose ``keystatus`` is ``unavailable`` (their key is
            not loaded: zfs-load-key(8)); empty unless the probe asked for ``keystatus``.
    """

    encrypted: frozenset[DatasetName] = frozenset()
    locked: frozenset[DatasetName] = frozenset()


def may_be_encrypted(caps: Capabilities) -> bool:
    """False where no dataset can be encrypted: a pool without feature flags (zfs-fuse, pool
    v23; encryption is ``feature@encryption``, zpool-features(7)) on a ZFS without
    ``zfs send -w``."""
    return caps.raw_send or caps.pool_version == FEATURE_FLAGS_VERSION


def is_encryption_on(value: str) -> bool:
    """True for an ``encryption`` value as ``zfs get`` prints it that is not ``off``."""
    return value not in _OFF


def probe_encryption(zfs: Zfs, datasets: Sequence[DatasetName], *,
                     keystatus: bool = False) -> Encryption:
    """Which of ``datasets`` are encrypted (and with ``keystatus``, which of those are locked).

    One command for all of them, ``zfs get -Hp -o name,property,value,source encryption[,keystatus]
    DS...`` (never one per dataset or snapshot). Not asked where no dataset can be encrypted
    (``may_be_encrypted``); a ZFS that does not know the property (before OpenZFS 0.8, "bad
    property list") has no encryption either, unless it has ``zfs send -w``.

    Raises:
        DatasetNotFound: a dataset vanished since it was listed.
        Unsupported: a ZFS with ``zfs send -w`` refused the property.
        ZfsError, HostUnreachable: the command failed.
    """
    caps = zfs.capabilities
    if not datasets or not may_be_encrypted(caps):
        return Encryption()
    props = ["encryption", "keystatus"] if keystatus else ["encryption"]
    try:
        found = zfs.property_sources([str(d) for d in datasets], props)
    except Unsupported:
        if caps.raw_send:
            raise
        return Encryption()
    encrypted = {DatasetName(name) for name, got in found.items()
                 if is_encryption_on(got.get("encryption", ("off", "-"))[0])}
    locked = {name for name in encrypted
              if found[str(name)].get("keystatus", ("-", "-"))[0] == "unavailable"}
    return Encryption(frozenset(encrypted), frozenset(locked))
