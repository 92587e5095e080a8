"""Carry out a chain retention plan: tombstone, delete objects, delete rows (in that order).

Order (docs/design.md#chain-prune-order):

0. when the plan deletes chains, every chain that releases one (``ChainPlan.releasers``) is
   re-checked against the catalog (``pruning.recheck``,
   docs/decisions.md#the-releasing-chain-is-rechecked-before-any-delete); a mismatch marks the
   mismatching streams ``bad`` and stops here: nothing of the dataset is deleted, and the
   next plan sees the bad stream and releases nothing with it; then each deleted chain that
   relies on a copy in another store (``ChainDecision.copies``) has that copy re-checked
   (``pruning.recheck.copy_problem``,
   docs/decisions.md#a-copy-relied-on-is-rechecked-at-delete-time): a chain whose copies of a
   stream are all gone or unsound now is kept (logged, ``ChainPruneOutcome.kept``);
1. streams left ``condemned`` by an earlier prune that stopped (crash, store error) are
   finished first, leaf first: their objects, then their rows;
2. every stream of the planned chains is condemned in ONE catalog transaction
   (``Catalog.condemn_streams``): from here on no restore or archive run uses them;
3. per stream, leaf first: the manifest's ``.copy``, the manifest, every volume,
   ``progress.json``, then anything
   else a listing of the stream's prefix still shows; then the stream's catalog row
   (``Catalog.delete_stream``, which the database refuses while children exist). On a
   store that keeps versions (Object Lock) each key goes by version id, every version and
   delete marker a version listing of the prefix shows, in the same key order: a delete
   by key there only adds a delete marker and leaves the versions billed
   (docs/security.md#prune-on-a-lock-store).

A crash at any step leaves either condemned rows whose objects may be partly gone (the
audit reports them; the next prune finishes them, ``Backend.delete`` being idempotent) or
nothing changed, never an object the catalog forgot: a row goes only after a listing of
its prefix came back empty of everything but what was just deleted. The manifest goes
first (its copy before it, so no copy outlives its primary) so that ``zbak catalog rebuild``
never resurrects a half-deleted stream.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Mapping, Sequence

from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import StreamRow, VolumeRow, bad_reason, first_three
from zrepl_py.errors import CatalogConflict, ReleaserMismatch, StoreInconsistent, ZbakError
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY, PROGRESS
from zrepl_py.pruning.chain_plan import ChainDecision, ChainPlan, stream_label
from zrepl_py.pruning.recheck import Recheck, copy_problem, recheck_chain
from zrepl_py.stores.base import Backend

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ChainPruneOutcome:
    """What executing one dataset's plan did.

    Attributes:
        finished: ids of streams condemned by an earlier run, now deleted.
        deleted: ids of streams this plan deleted (objects and rows).
        objects: number of object deletes issued (missing objects included).
        rechecks: the re-check of each releasing chain, in the order done (the first
            mismatch stops the rest).
        kept: the streams of each planned chain kept because a copy in another store its
            delete relied on was gone at delete time: ``{stream id: why}``.
        error: the error that stopped execution (the rest waits for the next prune), or None.
    """

    finished: list[int] = dataclasses.field(default_factory=list)
    deleted: list[int] = dataclasses.field(default_factory=list)
    objects: int = 0
    rechecks: list[Recheck] = dataclasses.field(default_factory=list)
    kept: dict[int, str] = dataclasses.field(default_factory=dict)
    error: str | None = None

    @property
    def mismatch(self) -> bool:
        """True when a releasing chain failed its re-check (nothing was condemned)."""
        return any(not check.ok for check in self.rechecks)


def find_damaged(listing: Mapping[str, int], volumes: Mapping[int, Sequence[VolumeRow]],
                 streams: Sequence[StreamRow]) -> dict[int, str]:
    """Check that every catalogued object of the not-condemned ``streams`` is in the store
    (PURE; no object is read): each volume (``volumes``: the catalog's rows by stream id)
    listed with its recorded size, and the manifest of each stream not still
    ``uploading`` listed.

    Args:
        listing: ``{key: stored bytes}`` of a listing of the store covering the streams'
            prefixes (``Backend.sizes``).

    Returns:
        ``{stream id: what is wrong}`` for each stream with a missing or resized object.
    """
    damaged: dict[int, str] = {}
    for stream in streams:
        if stream.state == "condemned":
            continue
        problems = []
        for volume in volumes.get(stream.id, ()):
            size = listing.get(volume.key)
            if size is None:
                problems.append(f"{volume.key} missing")
            elif size != volume.stored_bytes:
                problems.append(f"{volume.key} has {size} bytes, the catalog says"
                                f" {volume.stored_bytes}")
        if stream.state != "uploading" and stream.object_prefix + MANIFEST not in listing:
            problems.append(f"{stream.object_prefix}{MANIFEST} missing")
        if problems:
            damaged[stream.id] = "; ".join(problems[:3]) + (
                f"; {len(problems) - 3} more" if len(problems) > 3 else "")
    return damaged


def delete_stream(backend: Backend, catalog: Catalog, stream: StreamRow) -> int:
    """Delete a CONDEMNED stream's objects, then its catalog row; return the deletes issued.

    Raises:
        CatalogConflict: the stream is not condemned (nothing is deleted).
        NotInCatalog: the stream is gone from the catalog.
        StoreError: a delete or the listing failed (the row stays, condemned).
        CatalogError: the row could not be deleted (e.g. ``ChainBroken``: a child remains).
    """
    current = catalog.stream(stream.id)
    if current.state != "condemned":
        raise CatalogConflict(f"stream {stream.id} ({stream.dataset}@{stream.to_name}) is"
                              f" {current.state}, not condemned: its objects are kept")
    prefix = stream.object_prefix
    keys = [prefix + MANIFEST_COPY, prefix + MANIFEST]
    keys += [v.key for v in reversed(catalog.volumes(stream.id))]
    keys.append(prefix + PROGRESS)
    issued = (_delete_versions(backend, prefix, keys) if backend.keeps_versions
              else _delete_keys(backend, prefix, keys))
    catalog.delete_stream(stream.id)
    log.info("deleted stream %d (%s@%s, %s) from store %s: %d object deletes", stream.id,
             stream.dataset, stream.to_name, stream.kind, stream.store, issued)
    return issued


def _own(prefix: str, key: str) -> bool:
    """Whether ``key`` is the stream's own object: a child dataset could be named like a
    stream directory, so nothing below a further ``/`` is."""
    return key.startswith(prefix) and "/" not in key[len(prefix):]


def _delete_keys(backend: Backend, prefix: str, keys: Sequence[str]) -> int:
    """Delete ``keys``, then whatever else a listing of ``prefix`` shows of the stream."""
    for key in keys:
        backend.delete(key)
    rest = [info.key for info in backend.list(prefix)
            if info.key not in keys and _own(prefix, info.key)]
    for key in rest:
        backend.delete(key)
    return len(keys) + len(rest)


def _delete_versions(backend: Backend, prefix: str, keys: Sequence[str]) -> int:
    """Delete every version and delete marker of the stream's objects by version id: those
    of ``keys`` first, in that order, then the rest of a version listing of ``prefix``."""
    found: dict[str, list[str]] = {}
    for version in backend.list_versions(prefix):
        if _own(prefix, version.info.key):
            found.setdefault(version.info.key, []).append(version.version_id)
    order = [k for k in keys if k in found] + [k for k in found if k not in keys]
    for key in order:
        for version_id in found[key]:
            backend.delete_version(key, version_id)
    return sum(len(ids) for ids in found.values())


def _recheck_releasers(plan: ChainPlan, backend: Backend, catalog: Catalog,
                       outcome: ChainPruneOutcome, now: dt.datetime) -> None:
    """Re-check each releasing chain; on a mismatch mark its streams bad and raise.

    Raises:
        ReleaserMismatch: an object of a releasing chain differs from the catalog.
        StoreError, CatalogError: a check could not be made (nothing is marked).
    """
    for chain in plan.releasers:
        check = recheck_chain(backend, catalog, chain)
        outcome.rechecks.append(check)
        if check.ok:
            continue
        for stream_id in check.bad_streams:
            catalog.set_stream_state(stream_id, "bad", now, reason=bad_reason(
                first_three([f"{m.key}: {m.problem}" for m in check.mismatches
                             if m.stream_id == stream_id]), "prune", now))
        raise ReleaserMismatch(
            f"the chain {check.full_name} (stream {check.full}) that"
            f" releases the older chain(s) no longer matches the catalog: {check.summary()};"
            f" stream(s) {check.bad_streams} marked bad, nothing deleted. The older chain is"
            " what restores now: run zbak audit, then zbak archive --full for a new chain")


def _lost_copy(chain: ChainDecision, stores: Mapping[str, Backend],
               catalog: Catalog) -> str | None:
    """Why ``chain`` must stay after all: a stream whose copies in other stores
    (``chain.copies``, one group per stream) are none of them sound now; None: it may go.

    Raises:
        StoreError, CatalogError: a copy could not be checked (no verdict).
    """
    for group in chain.copies:
        problems = []
        for copy in group:
            backend = stores.get(copy.store)
            problem = ("the store is not open" if backend is None
                       else copy_problem(backend, catalog, copy))
            if problem is None:
                break
            problems.append(f"{copy.store}: {problem}")
        else:
            where = ", ".join(sorted({c.store for c in group}))
            return (f"its delete relied on the copy of {stream_label(group[0])} in store"
                    f" {where}, not sound at delete time ({'; '.join(problems)}): run zbak audit")
    return None


def _still_copied(plan: ChainPlan, backend: Backend, stores: Mapping[str, Backend],
                  catalog: Catalog, outcome: ChainPruneOutcome) -> list[ChainDecision]:
    """The chains of ``plan.to_delete`` whose copies elsewhere still hold; the others are
    kept, each logged in one line and recorded in ``outcome.kept``."""
    going = []
    for chain in plan.to_delete:
        why = _lost_copy(chain, stores, catalog)
        if why is None:
            going.append(chain)
            continue
        outcome.kept.update(dict.fromkeys((s.id for s in chain.leaf_first), why))
        log.warning("kept the chain %s (stream %d) of %s in store %s: %s",
                    stream_label(chain.full), chain.full.id, chain.full.dataset, backend.name, why)
    return going


def execute_chain_prune(plan: ChainPlan, backend: Backend, catalog: Catalog, *,
                        now: dt.datetime,
                        stores: Mapping[str, Backend] | None = None) -> ChainPruneOutcome:
    """Re-check the releasing chains and the copies in other stores the deletes rely on,
    finish the plan's unfinished streams, then delete its chains (module doc order); ``now``
    (aware UTC) stamps a stream marked bad; ``stores``: the backends of the job's other
    stores by name (a copy in a store not given counts as gone).

    Stops at the first store or catalog error, or re-check mismatch, and reports it in the
    outcome: what is condemned stays condemned and the next prune finishes it.

    Raises:
        StoreInconsistent: the plan is ``refused`` (a damaged stream); nothing was deleted.
    """
    if plan.refused:
        raise StoreInconsistent(f"store {backend.name}: {plan.refused}")
    outcome = ChainPruneOutcome()
    try:
        going: Sequence[ChainDecision] = ()
        if plan.to_delete:
            _recheck_releasers(plan, backend, catalog, outcome, now)
            going = _still_copied(plan, backend, stores or {}, catalog, outcome)
        for stream in plan.unfinished:
            outcome.objects += delete_stream(backend, catalog, stream)
            outcome.finished.append(stream.id)
        doomed = [s for chain in going for s in chain.leaf_first]
        if not doomed:
            return outcome
        catalog.condemn_streams([s.id for s in doomed])
        for stream in doomed:
            outcome.objects += delete_stream(backend, catalog, stream)
            outcome.deleted.append(stream.id)
    except ReleaserMismatch as exc:
        log.error("pruning chains in store %s refused: %s", backend.name, exc)
        outcome.error = str(exc)
    except ZbakError as exc:
        log.error("pruning chains in store %s stopped: %s; the next zbak prune finishes the"
                  " condemned streams", backend.name, exc)
        outcome.error = str(exc)
    return outcome
