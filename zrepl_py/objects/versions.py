"""Which version of each key is zbak's, in a store whose keys are write-once (S3 Object
Lock, ``Backend.keeps_versions``; docs/design.md#immutable-cold-storage).

zbak writes each key once, so its version of a key is the one the catalog records
(``volumes.version_id``), or, where the catalog records none (manifests, a stream catalogued
from its manifest), the key's first version. Whatever is newer, a version or a delete
marker, was written by someone else: tampering, which changes nothing zbak reads. Any
other version is one the catalog does not know (an intruder's, an abandoned upload's).

:func:`pin` is the rule (pure); :func:`as_written` lists a store's versions and applies it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence

from zrepl_py.stores.base import Backend, ObjectInfo, Version, under_any


@dataclasses.dataclass(frozen=True)
class Tampered:
    """A key whose newest version (``latest``, a version or a delete marker) is not zbak's
    (``own``, still in the store)."""

    key: str
    own: Version
    latest: Version


@dataclasses.dataclass
class Pinned:
    """What :func:`pin` found.

    Attributes:
        listing: key -> zbak's version of it as a listing shows it; a key whose recorded
            version is gone is left out (it is lost, as a deleted object is).
        versions: key -> the version id of zbak's version, for reads
            (``stores.base.get_recorded``).
        tampered: the keys whose newest version or delete marker is not zbak's.
        unknown: key -> its versions (no delete markers) that are not zbak's, newest
            first.
    """

    listing: dict[str, ObjectInfo] = dataclasses.field(default_factory=dict)
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    tampered: list[Tampered] = dataclasses.field(default_factory=list)
    unknown: dict[str, list[Version]] = dataclasses.field(default_factory=dict)


def pin(versions: Iterable[Version], recorded: Mapping[str, str]) -> Pinned:
    """Apply the write-once rule (module docstring) to a version listing (pure).

    Args:
        versions: every version and delete marker under the listed prefixes, a key's
            versions newest first (``Backend.list_versions``).
        recorded: key -> the version id the catalog records for it.
    """
    by_key: dict[str, list[Version]] = {}
    for version in versions:
        by_key.setdefault(version.info.key, []).append(version)
    pinned = Pinned()
    for key, entries in by_key.items():
        _pin_key(pinned, key, entries, recorded.get(key))
    return pinned


def _pin_key(pinned: Pinned, key: str, entries: Sequence[Version], recorded: str | None) -> None:
    stored = [v for v in entries if not v.marker]
    if recorded is None:
        own = stored[-1] if stored else None  # the first version written
    else:
        own = next((v for v in stored if v.version_id == recorded), None)
    others = [v for v in stored if own is None or v.version_id != own.version_id]
    if others:
        pinned.unknown[key] = others
    if own is None:
        return
    pinned.listing[key] = own.info
    pinned.versions[key] = own.version_id
    latest = next((v for v in entries if v.latest), own)
    if latest.version_id != own.version_id:
        pinned.tampered.append(Tampered(key, own, latest))


def as_written(backend: Backend, listing: Mapping[str, ObjectInfo], directories: Iterable[str],
               streams: Collection[str], recorded: Mapping[str, str]
               ) -> tuple[dict[str, ObjectInfo], Pinned]:
    """``listing`` (``Backend.list`` of ``directories``) with the objects under the
    catalogued stream prefixes ``streams`` as zbak wrote them (:func:`pin`; one version
    listing per directory), and what :func:`pin` found of them. Other keys stay as listed
    (the newest): a pruned stream's delete markers keep hiding its keys.

    Raises:
        StoreTransient, StorePermanent: the version listing failed.
    """
    pinned = pin((v for directory in directories for v in backend.list_versions(directory)
                  if under_any(v.info.key, streams)), recorded)
    merged = {k: info for k, info in listing.items() if not under_any(k, streams)}
    merged.update(pinned.listing)
    return merged, pinned
