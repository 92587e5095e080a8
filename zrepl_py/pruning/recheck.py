"""Re-check the chain that releases an old one, right before prune deletes anything
(docs/decisions.md#the-releasing-chain-is-rechecked-before-any-delete).

A chain may be deleted only because a newer chain was verified (``pruning.chain_plan``). That
verification is a fact about the bytes on the day ``zbak audit --deep`` read them; a byte
that flips afterwards would let prune take the last restorable chain. So right before the
first delete, every object of each releasing chain (``ChainPlan.releasers``) is compared
with the catalog again:

* every volume: ``stat`` (HEAD) for presence and stored size, and the store's own SHA-256
  when it keeps one (``ObjectInfo.sha256``: S3's full-object checksum);
* a volume in a class read without a thaw or a retrieval fee (``REREAD_CLASSES``; a
  ``file://`` store is STANDARD) is also read back whole and its SHA-256 and length
  compared with the catalog's; GLACIER / DEEP_ARCHIVE would need a thaw and the IA and
  GLACIER_IR classes bill every byte read, so their volumes get the HEAD checks only;
* each stream's manifest: present (not for a stream still ``uploading``: its manifest is
  written last, as ``pruning.chain_delete.find_damaged`` knows too).

On a store that keeps versions (Object Lock) every check is made on zbak's own version of
each key (``objects.versions.pin`` of one version listing per stream: the recorded version,
else the key's first), as ``zbak audit`` does: an intruder's overwrite or delete marker
changes nothing zbak restores, so it does not mark the releasing chain bad
(docs/security.md#prune-on-a-lock-store); a version of zbak's that is gone is missing.

A copy in another store that a delete relies on (``ChainDecision.copies``: the chain goes
from this store because that store holds the stream soundly, ``pruning.last_copy``) is
re-checked too, right before the delete (``copy_problem``,
docs/decisions.md#a-copy-relied-on-is-rechecked-at-delete-time): its catalog row read again
(still ``uploaded`` or ``verified``: not marked bad, condemned or deleted since the plan), each
volume HEADed with the catalog's size (and stored SHA-256), its manifest present. Nothing is
read back: the copy's own audit reads its bytes.

The comparisons are pure (``head_problem``, ``read_problem``); ``recheck_chain`` and
``copy_problem`` do the I/O. A store error (transient or not) propagates: the caller deletes
nothing and reports it, since an unanswered check is no proof.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping, Sequence

from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import LIVING_STATES, StreamRow, VolumeRow, recorded_versions
from zrepl_py.errors import NeedsThaw, NotInCatalog, ObjectNotFound, StoreReadCorrupt
from zrepl_py.objects.layout import MANIFEST
from zrepl_py.objects.versions import pin
from zrepl_py.stores.base import Backend, ObjectInfo, get_recorded, stat_recorded

log = logging.getLogger(__name__)

# Classes whose GET costs no retrieval fee and needs no thaw (AWS S3 pricing, "Requests &
# data retrievals": STANDARD_IA, ONEZONE_IA and GLACIER_IR bill per GB retrieved;
# INTELLIGENT_TIERING's frequent/infrequent tiers do not; an object in its archive tiers
# answers InvalidObjectState, which ``recheck_chain`` takes as "HEAD checks only").
REREAD_CLASSES = frozenset({"STANDARD", "REDUCED_REDUNDANCY", "INTELLIGENT_TIERING"})


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One object of the releasing chain that does not match the catalog."""

    stream_id: int
    key: str
    problem: str


@dataclasses.dataclass
class Recheck:
    """The re-check of one releasing chain.

    Attributes:
        chain: the chain's stream ids, full first; ``full`` / ``full_name`` name it.
        objects: objects checked (volumes and manifests).
        reread: volumes read back whole and hashed.
        mismatches: what did not match, in check order (empty: ok).
    """

    chain: tuple[int, ...]
    full_name: str
    objects: int = 0
    reread: int = 0
    mismatches: list[Mismatch] = dataclasses.field(default_factory=list)

    @property
    def full(self) -> int:
        """The chain's full stream id."""
        return self.chain[0]

    @property
    def ok(self) -> bool:
        """True when every object matched the catalog."""
        return not self.mismatches

    @property
    def bad_streams(self) -> list[int]:
        """Ids of the streams with a mismatching object, in chain order."""
        found = {m.stream_id for m in self.mismatches}
        return [s for s in self.chain if s in found]

    def summary(self) -> str:
        """One line: ``ok (N objects, M re-read)`` or ``mismatch in stream N: ...``."""
        if self.ok:
            return f"ok ({self.objects} objects, {self.reread} re-read)"
        first = self.mismatches[0]
        more = f"; {len(self.mismatches) - 1} more" if len(self.mismatches) > 1 else ""
        return f"mismatch in stream {first.stream_id}: {first.key}: {first.problem}{more}"


def head_problem(volume: VolumeRow, info: ObjectInfo) -> str | None:
    """What the store's metadata says is wrong with ``volume`` (size, stored SHA-256), or
    None (PURE)."""
    if info.size != volume.stored_bytes:
        return f"the store has {info.size} bytes, the catalog says {volume.stored_bytes}"
    if info.sha256 is not None and info.sha256 != volume.sha256:
        return (f"the store's checksum is sha256 {info.sha256[:16]}..., the catalog says"
                f" {volume.sha256[:16]}...")
    return None


def read_problem(volume: VolumeRow, size: int, sha256: str) -> str | None:
    """What reading ``volume`` back (``size`` bytes hashing to ``sha256``) shows is wrong,
    or None (PURE)."""
    if size != volume.stored_bytes or sha256 != volume.sha256:
        return (f"re-read {size} bytes with sha256 {sha256[:16]}..., the catalog says"
                f" {volume.stored_bytes} bytes with sha256 {volume.sha256[:16]}...")
    return None


def planned_objects(volumes: Mapping[int, Sequence[VolumeRow]],
                    chain: Sequence[StreamRow]) -> int:
    """How many objects ``recheck_chain`` will check: every volume (``volumes``: the
    catalog's rows by stream id) and every manifest (PURE)."""
    return sum(len(volumes.get(s.id, ())) + (s.state != "uploading") for s in chain)


def _read(backend: Backend, key: str, version_id: str | None) -> tuple[int, str]:
    """``(bytes, sha256 hex)`` of the object under ``key`` (version ``version_id``, else the
    newest), read once more when the store's own checksum check failed (damage in transit;
    docs/reliability.md#r11-flaky-read).

    Raises:
        StoreReadCorrupt: the store's check failed twice (damaged where it is stored).
        NeedsThaw, ObjectNotFound, StoreTransient, StorePermanent.
    """
    for attempt in (1, 2):
        digest, size = hashlib.sha256(), 0
        try:
            for chunk in get_recorded(backend, key, version_id):
                digest.update(chunk)
                size += len(chunk)
        except StoreReadCorrupt:
            if attempt == 2:
                raise
            continue
        return size, digest.hexdigest()
    raise AssertionError("unreachable")  # the loop returns or raises


def _head(backend: Backend, volume: VolumeRow,
          versions: Mapping[str, str] | None) -> tuple[str | None, ObjectInfo | None]:
    """The HEAD checks of ``volume``: what is wrong (None: nothing) and what ``stat`` said
    (None: missing). ``versions``: zbak's version of each key on a store that keeps
    versions, else None."""
    version_id = None if versions is None else versions.get(volume.key)
    if versions is not None and version_id is None:
        return "missing", None
    try:
        info = stat_recorded(backend, volume.key, version_id)
    except ObjectNotFound:
        return "missing", None
    return head_problem(volume, info), info


def _check_volume(backend: Backend, volume: VolumeRow, versions: Mapping[str, str] | None,
                  result: Recheck) -> str | None:
    """``versions``: zbak's version of each key on a store that keeps versions, else None."""
    problem, info = _head(backend, volume, versions)
    if problem is not None or info is None or info.storage_class not in REREAD_CLASSES \
            or not info.readable:
        return problem
    version_id = None if versions is None else versions.get(volume.key)
    try:
        size, sha256 = _read(backend, volume.key, version_id)
    except NeedsThaw:
        return None  # an INTELLIGENT_TIERING archive tier: the HEAD checks passed
    except ObjectNotFound:
        return "missing"
    except StoreReadCorrupt as exc:
        return f"the store's own checksum check failed on two reads: {exc}"
    result.reread += 1
    return read_problem(volume, size, sha256)


def recheck_chain(backend: Backend, catalog: Catalog, chain: Sequence[StreamRow]) -> Recheck:
    """Compare every object of ``chain`` (full first) with the catalog (module doc).

    Returns:
        A Recheck; ``ok`` False names each mismatching object. Nothing is changed.

    Raises:
        StoreTransient, StorePermanent: the store did not answer a check (no verdict).
        CatalogError: reading the volumes failed.
    """
    result = Recheck(tuple(s.id for s in chain), f"@{chain[0].to_name}")
    for stream in chain:
        volumes = catalog.volumes(stream.id)
        versions = _own_versions(backend, stream, volumes)
        for volume in volumes:
            result.objects += 1
            problem = _check_volume(backend, volume, versions, result)
            if problem is not None:
                result.mismatches.append(Mismatch(stream.id, volume.key, problem))
        if stream.state == "uploading":
            continue
        result.objects += 1
        key = stream.object_prefix + MANIFEST
        if not _present(backend, key, versions):
            result.mismatches.append(Mismatch(stream.id, key, "manifest missing"))
    log.info("re-checked the releasing chain %s (stream %d) in store %s: %s",
             result.full_name, result.full, backend.name, result.summary())
    return result


def copy_problem(backend: Backend, catalog: Catalog, copy: StreamRow) -> str | None:
    """Why ``copy`` (a stream row of ``backend``'s store that a delete in another store relies
    on) is no longer a sound copy now, or None when it still is (module doc: the catalog row
    read again, every volume HEADed, the manifest present).

    Raises:
        StoreTransient, StorePermanent: the store did not answer a check (no verdict).
        CatalogError: reading the row or its volumes failed.
    """
    try:
        row = catalog.stream(copy.id)
    except NotInCatalog:
        return f"stream {copy.id} is no longer in the catalog"
    if row.state not in LIVING_STATES:
        why = f" ({row.why_bad})" if row.state == "bad" and row.why_bad else ""
        return f"stream {copy.id} is {row.state}{why}"
    volumes = catalog.volumes(copy.id)
    versions = _own_versions(backend, copy, volumes)
    for volume in volumes:
        problem, _ = _head(backend, volume, versions)
        if problem is not None:
            return f"{volume.key}: {problem}"
    key = copy.object_prefix + MANIFEST
    if not _present(backend, key, versions):
        return f"{key}: missing"
    return None


def _own_versions(backend: Backend, stream: StreamRow,
                  volumes: Sequence[VolumeRow]) -> dict[str, str] | None:
    """zbak's version of each key of ``stream`` (``pin`` of a version listing of its prefix)
    on a store that keeps versions, else None.

    Raises:
        StoreTransient, StorePermanent: the listing failed.
    """
    if not backend.keeps_versions:
        return None
    return pin(backend.list_versions(stream.object_prefix),
               recorded_versions({stream.id: volumes})).versions


def _present(backend: Backend, key: str, versions: Mapping[str, str] | None) -> bool:
    """Whether ``key`` is in the store: zbak's version of it (``versions``), else a HEAD."""
    if versions is not None:
        return key in versions
    try:
        backend.stat(key)
    except ObjectNotFound:
        return False
    return True
