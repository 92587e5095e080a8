"""Versions the catalog does not know, deleted by ``zbak prune`` once their own lock lapses
(docs/security.md#versions-the-catalog-does-not-know).

On a write-once store (``Backend.keeps_versions``) every version and delete marker of a key a
catalogued stream owns (its volumes, manifest and manifest copy, ``catalog.rows.owners``) that
is not zbak's (``objects.versions.pin``: the recorded version, volume's or manifest's, else
the key's first) was
written by someone else: an intruder's overwrite, an abandoned upload's version, a delete
marker. ``zbak audit`` names them; ``zbak prune`` deletes each by version id once the lock
the store holds on that version (whoever set it) has lapsed, and until then keeps it as
"unknown version, locked until DATE". A delete marker holds no lock: it goes at once, which
also makes zbak's version the key's newest again. zbak's own version is never among them.

:func:`strays` and :func:`decide` are the rules (pure); :func:`prune_unknown_versions` asks the
store and deletes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence

from zrepl_py.catalog.rows import (
    ManifestLock,
    StreamRow,
    VolumeRow,
    owners,
    recorded_manifest_versions,
    recorded_versions,
)
from zrepl_py.errors import ObjectNotFound, StoreError
from zrepl_py.objects.versions import pin
from zrepl_py.stores.base import Backend, Version

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Stray:
    """A version (or delete marker) of a catalogued stream's key that is not zbak's.

    Attributes:
        key: the key (relative to the store root).
        version_id: S3's ``VersionId``.
        marker: True for a delete marker.
        written: its LastModified (aware UTC).
        stream_id: the catalogued stream that owns the key.
        retain_until: the lock the store holds on it (aware UTC); None: none (a marker
            never has one), or not asked yet.
    """

    key: str
    version_id: str
    marker: bool
    written: dt.datetime
    stream_id: int
    retain_until: dt.datetime | None = None


@dataclasses.dataclass(frozen=True)
class StrayDecision:
    """What prune does with a :class:`Stray`: ``delete`` or not, and why."""

    stray: Stray
    delete: bool
    reason: str


@dataclasses.dataclass
class UnknownVersions:
    """What :func:`prune_unknown_versions` found and did in one store.

    Attributes:
        decisions: one per version of a catalogued key that is not zbak's, in listing order.
        deleted: the ``(key, version id)`` deleted (none on a dry run).
        error: the store error that stopped it (the rest waits for the next prune), or None.
    """

    decisions: list[StrayDecision] = dataclasses.field(default_factory=list)
    deleted: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    error: str | None = None


def strays(versions: Iterable[Version], streams: Sequence[StreamRow],
           volumes: Mapping[int, Sequence[VolumeRow]],
           manifests: Iterable[ManifestLock] = ()) -> list[Stray]:
    """The versions and delete markers of the keys the not-condemned ``streams`` own that
    are not zbak's (module docstring; pure).

    Args:
        versions: a version listing covering the streams' prefixes
            (``Backend.list_versions``: by key, newest first).
        volumes: the catalog's volume rows by stream id (their recorded versions).
        manifests: the recorded manifest versions (``Catalog.manifest_locks``).
    """
    listed = list(versions)
    owned = owners(streams, volumes)
    recorded = recorded_versions(volumes) | recorded_manifest_versions(streams, manifests)
    own = pin((v for v in listed if v.info.key in owned), recorded).versions
    return [Stray(v.info.key, v.version_id, v.marker, v.info.modified, owned[v.info.key].id)
            for v in listed
            if v.info.key in owned and v.version_id != own.get(v.info.key)]


def decide(stray: Stray, now: dt.datetime) -> StrayDecision:
    """Delete ``stray`` once its lock (``retain_until``) is not after ``now`` (aware UTC);
    until then keep it, saying until when (pure)."""
    until = stray.retain_until
    if stray.marker:
        return StrayDecision(stray, True, "delete marker, not zbak's (it holds no lock)")
    if until is None:
        return StrayDecision(stray, True, "unknown version, not locked")
    when = f"{until.strftime('%Y-%m-%d %H:%M:%S')} UTC (Object Lock)"
    if until > now:
        return StrayDecision(stray, False, f"unknown version, locked until {when}")
    return StrayDecision(stray, True, f"unknown version, its lock lapsed {when}")


def prune_unknown_versions(backend: Backend, prefix: str, streams: Sequence[StreamRow],
                           volumes: Mapping[int, Sequence[VolumeRow]],
                           manifests: Iterable[ManifestLock], now: dt.datetime, *,
                           dry_run: bool) -> UnknownVersions:
    """Find the :func:`strays` under ``prefix`` (one version listing), ask the store for the
    lock of each version (HeadObject, one per version: S3 lists no locks), and unless
    ``dry_run`` delete by version id each one :func:`decide` lets go. Store errors stop it
    and go in the result's ``error``.

    Args:
        backend: a store that keeps versions (``Backend.keeps_versions``).
        prefix: the job's tree (``objects.layout.dataset_prefix``).
        streams: the job's catalogued streams in this store.
        volumes: their volume rows by stream id.
        manifests: their recorded manifest versions (``Catalog.manifest_locks``).
        now: aware UTC.
    """
    result = UnknownVersions()
    try:
        for stray in strays(backend.list_versions(prefix), streams, volumes, manifests):
            if not stray.marker:
                try:
                    stray = dataclasses.replace(stray, retain_until=backend.retain_until(
                        stray.key, stray.version_id))
                except ObjectNotFound:
                    continue  # deleted since the listing
            decision = decide(stray, now)
            result.decisions.append(decision)
            if decision.delete and not dry_run:
                backend.delete_version(stray.key, stray.version_id)
                result.deleted.append((stray.key, stray.version_id))
                log.warning("store %s: deleted %s %s of %s (written %s): %s", backend.name,
                            "delete marker" if stray.marker else "version", stray.version_id,
                            stray.key, f"{stray.written:%Y-%m-%d %H:%M:%S}Z", decision.reason)
    except StoreError as exc:
        log.error("store %s: deleting versions the catalog does not know stopped: %s",
                  backend.name, exc)
        result.error = str(exc)
    return result
