"""Which snapshots each store can bring back, and which it holds but cannot
(docs/decisions.md#audit-names-stored-but-unrestorable-snapshots).

Per dataset and store the audit states three sets of snapshots:

* **restorable**: carried by a catalogued stream that ``zbak restore`` can use
  (``catalog.paths.restorable_streams``: living, with a living chain back to a full). The
  rule is the restore's own, so the audit never promises more than a restore does;
* **stored but unrestorable**: carried by a stream whose objects are in the store but that
  no restore can reach: a catalogued stream cut off from its full (also reported, per break,
  by the graph level), or a stream directory the catalog does not own (``Stray``) whose
  chain cannot be completed, because its manifest is gone (neither ``manifest.json`` nor its
  copy: ``zbak catalog rebuild`` cannot use it) or because it applies after such a stream;
* **not catalogued**: carried by stream directories the catalog does not own but whose
  chain to a full is complete through manifests: ``zbak catalog rebuild STORE --merge``
  makes them restorable.

A stray without manifest is told from an upload in progress by its ``progress.json`` (and,
while an archive of the job runs, by another stream applying on it: between a volume and its
``progress.json`` an upload looks the same). A stray's snapshots come from its manifest;
without one, only its to-snapshot is known
(guid and createtxg from its directory name, ``objects.layout``), named where another
stream or manifest names that guid. The snapshots between an -I stream's base and its
to-snapshot are then unknown and not listed.

Severity of the stored-but-unrestorable snapshots that only stray directories hold (the
catalogued breaks have their graph finding): an ERROR while one of them is newer than every
restorable snapshot of the dataset in that store (the store has lost its newest state:
``zbak archive --full`` starts a new chain); INFO once a newer restorable snapshot exists
(the loss is permanent and nothing zbak can do brings those snapshots back from this store;
deleting the listed directories reclaims their space).

Pure: :func:`coverage` takes the rows and strays, the driver (``audit.job``) lists and reads.
"""

from __future__ import annotations

import array
import dataclasses
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from zrepl_py.audit.findings import Finding, Severity
from zrepl_py.catalog.paths import restorable_streams
from zrepl_py.catalog.rows import StreamRow
from zrepl_py.objects.layout import (
    MANIFEST,
    MANIFEST_COPY,
    PROGRESS,
    is_stream_prefix,
    parse_stream_prefix,
    volume_index,
)
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest

MAX_NAMED = 12  # runs of snapshots named in one line before "and N more"


@dataclasses.dataclass(frozen=True)
class Stray:
    """A stream directory in a store that no catalogued stream owns, holding volumes.

    Attributes:
        host / dataset / store: whose stream it is (from the key) and where.
        prefix: the directory's key prefix (ends in ``/``).
        kind: ``full`` or ``incremental`` (from the directory name).
        from_guid: the base's guid (None for a full); to_guid / to_createtxg: the
            to-snapshot's.
        manifest: the manifest read (primary or copy), None when both are gone or unreadable.
        partial: a ``progress.json`` is there: an upload still running or interrupted, not
            a stream (never counted as stored).
    """

    host: str
    dataset: str
    store: str
    prefix: str
    kind: str
    from_guid: int | None
    to_guid: int
    to_createtxg: int
    manifest: Manifest | None
    partial: bool


class Snapshots(Sequence[CarriedSnapshot]):
    """An immutable sequence of :class:`CarriedSnapshot` kept as three columns (the names
    interned, guids and createtxgs in arrays of 8 bytes each): 24 bytes a snapshot instead
    of about 130 as objects. An audit keeps every dataset's :class:`Coverage` until it
    reports, 200,000 snapshots per 100,000 streams
    (docs/decisions.md#catalog-commands-stay-fast-at-100000-streams). Compares equal to a tuple
    or another ``Snapshots`` of the same snapshots; ``+`` gives a tuple.

    Args:
        snaps: the snapshots, in the order to keep (guids 0 .. 2**64-1).
    """

    __slots__ = ("_names", "_guids", "_txgs")

    def __init__(self, snaps: Iterable[CarriedSnapshot] = ()):
        snaps = list(snaps)
        intern = sys.intern
        self._names = tuple(intern(s.name) for s in snaps)
        self._guids = array.array("Q", [s.guid for s in snaps])
        self._txgs = array.array("q", [s.createtxg for s in snaps])

    def __len__(self) -> int:
        return len(self._names)

    @overload
    def __getitem__(self, index: int) -> CarriedSnapshot: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[CarriedSnapshot, ...]: ...
    def __getitem__(self, index: int | slice) -> CarriedSnapshot | tuple[CarriedSnapshot, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        return CarriedSnapshot(self._names[index], self._guids[index], self._txgs[index])

    def __iter__(self) -> Iterator[CarriedSnapshot]:
        return map(CarriedSnapshot, self._names, self._guids, self._txgs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Snapshots, tuple)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Sequence[CarriedSnapshot]) -> tuple[CarriedSnapshot, ...]:
        return tuple(self) + tuple(other)

    def __radd__(self, other: Sequence[CarriedSnapshot]) -> tuple[CarriedSnapshot, ...]:
        return tuple(other) + tuple(self)

    def __repr__(self) -> str:
        return f"Snapshots({list(self)!r})"


@dataclasses.dataclass(frozen=True)
class Coverage:
    """The snapshots of one dataset in one store, each set in createtxg order (see the
    module doc; :func:`coverage` gives the sets as :class:`Snapshots`). ``broken_at``: the
    to-snapshot of the oldest stray stream whose chain cannot be completed, as text
    (``@4``), None when there is none, and ``broken_why`` why; ``dead``: the key prefixes of
    every stray directory whose chain cannot be completed (no restore can use them)."""

    host: str
    dataset: str
    store: str
    restorable: Sequence[CarriedSnapshot]
    unrestorable: Sequence[CarriedSnapshot]
    not_catalogued: Sequence[CarriedSnapshot] = ()
    broken_at: str | None = None
    broken_why: str | None = None
    dead: tuple[str, ...] = ()
    stray_only: Sequence[CarriedSnapshot] = ()
    """The unrestorable snapshots that only stray directories hold (what the finding is about)."""
    others: Sequence[CarriedSnapshot] = ()
    """Other snapshots of the dataset the catalog knows (in no set): ``@0..@3`` is written
    only when no snapshot of the dataset lies between @0 and @3 outside the set."""

    def line(self) -> str:
        """``restorable: @0..@3 (4); stored but unrestorable: @4..@9 (6)`` (the audit's
        per-dataset line; runs of consecutive snapshots are shortened)."""
        order = self.order()
        parts = [f"restorable: {ranges(self.restorable, order)} ({len(self.restorable)})"]
        if self.unrestorable:
            parts.append(f"stored but unrestorable: {ranges(self.unrestorable, order)}"
                         f" ({len(self.unrestorable)})")
        if self.not_catalogued:
            parts.append(f"not in the catalog: {ranges(self.not_catalogued, order)}"
                         f" ({len(self.not_catalogued)})")
        return "; ".join(parts)

    def order(self) -> list[CarriedSnapshot]:
        """Every snapshot of the coverage and ``others``, by createtxg."""
        every = (*self.others, *self.restorable, *self.unrestorable, *self.not_catalogued)
        return sorted({s.guid: s for s in every}.values(), key=lambda s: s.createtxg)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: snapshot names (``guid N`` where the name is unknown) per set."""
        return {"host": self.host, "dataset": self.dataset, "store": self.store,
                "restorable": [_name(s) for s in self.restorable],
                "stored_unrestorable": [_name(s) for s in self.unrestorable],
                "not_catalogued": [_name(s) for s in self.not_catalogued],
                "broken_at": self.broken_at, "dead_prefixes": list(self.dead),
                "summary": self.line()}


def _by_txg(found: Mapping[int, CarriedSnapshot]) -> Snapshots:
    """The snapshots of ``found`` (guid -> snapshot) in createtxg order."""
    return Snapshots(sorted(found.values(), key=lambda c: c.createtxg))


def _name(snap: CarriedSnapshot) -> str:
    return f"@{snap.name}" if snap.name else f"guid {snap.guid}"


def ranges(snaps: Sequence[CarriedSnapshot], order: Sequence[CarriedSnapshot]) -> str:
    """``@0..@3, @7`` for ``snaps``: runs of snapshots adjacent in ``order`` (createtxg order
    of every snapshot the line mentions) shortened to ``first..last`` from three on."""
    if not snaps:
        return "none"
    wanted = {s.guid for s in snaps}
    runs: list[list[CarriedSnapshot]] = []
    prev_in = False
    for snap in order:
        inside = snap.guid in wanted
        if inside and prev_in:
            runs[-1].append(snap)
        elif inside:
            runs.append([snap])
        prev_in = inside
    texts = [f"{_name(r[0])}..{_name(r[-1])}" if len(r) > 2 else ", ".join(map(_name, r))
             for r in runs]
    more = len(texts) - MAX_NAMED
    return ", ".join(texts[:MAX_NAMED]) + (f" and {more} more" if more > 0 else "")


def strays_of(listing: Iterable[str], owned: set[str], host: str, store: str
              ) -> dict[str, tuple[str, set[str]]]:
    """Stream directories under ``listing`` (keys) that no catalogued stream owns (``owned``:
    their prefixes): ``{prefix: (dataset, leaf names)}`` for those holding a volume."""
    found: dict[str, tuple[str, set[str]]] = {}
    head = host + "/"
    for key in listing:
        prefix, _, leaf = key.rpartition("/")
        prefix += "/"
        if prefix in owned or not key.startswith(head) or not is_stream_prefix(prefix):
            continue
        dataset = prefix[len(head):].rstrip("/").rpartition("/")[0]
        found.setdefault(prefix, (dataset, set()))[1].add(leaf)
    return {p: v for p, v in found.items()
            if any(volume_index(leaf) is not None for leaf in v[1])}


def stray(host: str, dataset: str, store: str, prefix: str, leaves: set[str],
          manifest: Manifest | None) -> Stray:
    """A :class:`Stray` from its directory name (``objects.layout``) and what it holds."""
    kind, from_guid, to_guid, txg = parse_stream_prefix(prefix)
    partial = PROGRESS in leaves and MANIFEST not in leaves and MANIFEST_COPY not in leaves
    return Stray(host, dataset, store, prefix, kind, from_guid, to_guid, txg, manifest, partial)


def coverage(streams: Sequence[StreamRow], carried: Mapping[int, Sequence[CarriedSnapshot]],
             strays: Sequence[Stray],
             known: Mapping[tuple[str, str], Sequence[CarriedSnapshot]] | None = None, *,
             archive_running: bool = False) -> list[Coverage]:
    """The three sets per (host, dataset, store) of ``streams`` and ``strays`` (module doc).

    Args:
        archive_running: an archive of these datasets is running now: a stray without
            manifest or ``progress.json`` that no other stream applies on may be its upload
            between writing a volume and its ``progress.json`` (``archive.volumes``), so it
            is not counted as stored.
        known: the snapshots-table rows of the datasets (destroyed ones too) per ``(host,
            dataset)`` (``Catalog.known_snapshots``), for the order of the line only
            (``Coverage.others``); they also name guids no stream names.
        streams: catalogued streams (any state; condemned and uploading ones hold nothing
            stored for good and are left out).
        carried: their carried snapshots (``Catalog.bulk_carried``); a stream without rows
            carries its to-snapshot.
        strays: the stream directories no catalogued stream owns.
    """
    ok_ids = restorable_streams(streams)
    names: dict[int, str] = {}
    known = known or {}
    # The sets hold the snapshots-table rows (also in ``others``) where they agree with
    # what the streams carry, not copies: an audit keeps every dataset's coverage until it
    # reports.
    rows: dict[int, CarriedSnapshot] = {}
    for snaps in known.values():
        for snap in snaps:
            names.setdefault(snap.guid, snap.name)
            rows.setdefault(snap.guid, snap)
    for s in streams:
        if s.from_guid is not None and s.from_name:
            names.setdefault(s.from_guid, s.from_name)
        names.setdefault(s.to_guid, s.to_name)
        for c in carried.get(s.id, ()):
            if c.name:
                names.setdefault(c.guid, c.name)
    for st in strays:
        if st.manifest is not None:
            m = st.manifest
            if m.from_snap is not None:
                names.setdefault(m.from_snap.guid, m.from_snap.name)
            for c in m.snapshots:
                names.setdefault(c.guid, c.name)

    groups: dict[tuple[str, str, str], dict[str, dict[int, CarriedSnapshot]]] = {}

    def put(key: tuple[str, str, str], which: str, snaps: Iterable[CarriedSnapshot]) -> None:
        bucket = groups.setdefault(key, {"ok": {}, "lost": {}, "merge": {}, "stray": {}})[which]
        for c in snaps:
            if c.guid not in bucket:
                if not c.name:
                    c = CarriedSnapshot(names.get(c.guid, ""), c.guid, c.createtxg)
                row = rows.get(c.guid)
                bucket[c.guid] = (row if row is not None and row.name == c.name
                                  and row.createtxg == c.createtxg else c)

    for s in streams:
        if s.state in ("condemned", "uploading"):
            continue
        snaps = list(carried.get(s.id, ())) or [CarriedSnapshot(s.to_name, s.to_guid,
                                                                s.to_createtxg)]
        put((s.host, s.dataset, s.store), "ok" if s.id in ok_ids else "lost", snaps)

    # A stray's chain: its base is a restorable catalogued stream, or a stray with a manifest
    # whose own chain completes; a full stray with a manifest completes by itself.
    tips = {(s.host, s.dataset, s.store, s.to_guid) for s in streams if s.id in ok_ids}
    bases = ({(s.host, s.dataset, s.store, s.from_guid) for s in streams}
             | {(s.host, s.dataset, s.store, s.from_guid) for s in strays})
    by_to: dict[tuple[str, str, str, int | None], list[Stray]] = {}
    for st in strays:
        to = (st.host, st.dataset, st.store, st.to_guid)
        if st.partial or (archive_running and st.manifest is None and to not in bases):
            continue
        by_to.setdefault(to, []).append(st)
    verdict: dict[str, bool] = {}

    def complete(st: Stray, depth: int = 0) -> bool:
        if st.prefix not in verdict:
            verdict[st.prefix] = False  # a cycle or too deep stays incomplete
            ok = st.manifest is not None and depth < 10_000 and (
                st.kind == "full" or (st.host, st.dataset, st.store, st.from_guid) in tips
                or any(complete(p, depth + 1)
                       for p in by_to.get((st.host, st.dataset, st.store, st.from_guid), ())))
            verdict[st.prefix] = ok
        return verdict[st.prefix]

    broken: dict[tuple[str, str, str], list[Stray]] = {}
    for st in sorted((s for group in by_to.values() for s in group),
                     key=lambda s: s.to_createtxg):
        key = (st.host, st.dataset, st.store)
        snaps = (list(st.manifest.snapshots) if st.manifest is not None else
                 [CarriedSnapshot(names.get(st.to_guid, ""), st.to_guid, st.to_createtxg)])
        if complete(st):
            put(key, "merge", snaps)
        else:
            put(key, "lost", snaps)
            put(key, "stray", snaps)
            broken.setdefault(key, []).append(st)

    found = []
    for key in sorted(groups):
        bucket = groups[key]
        ok = bucket["ok"]
        merge = {g: c for g, c in bucket["merge"].items() if g not in ok}
        lost = {g: c for g, c in bucket["lost"].items() if g not in ok and g not in merge}
        stray_only = {g: c for g, c in bucket["stray"].items() if g in lost}
        first = broken[key][0] if key in broken else None
        found.append(Coverage(
            *key, restorable=_by_txg(ok), unrestorable=_by_txg(lost),
            not_catalogued=_by_txg(merge),
            broken_at=_name(CarriedSnapshot(names.get(first.to_guid, ""), first.to_guid,
                                            first.to_createtxg)) if first else None,
            broken_why=_why(first, names) if first else None,
            dead=tuple(s.prefix for s in broken.get(key, ())),
            stray_only=_by_txg(stray_only), others=Snapshots(known.get(key[:2], ()))))
    return found


def _why(st: Stray, names: Mapping[int, str]) -> str:
    if st.manifest is None:
        return (f"the stream directory {st.prefix} holds volumes but its {MANIFEST} and"
                f" {MANIFEST_COPY} are gone, so no catalog can describe it")
    base = _name(CarriedSnapshot(names.get(st.from_guid or 0, ""), st.from_guid or 0, 0))
    return f"no restorable stream ends at {base}, the base of {st.prefix}"


def coverage_findings(found: Sequence[Coverage], job: str) -> list[Finding]:
    """One finding per dataset and store whose stray directories hold unrestorable
    snapshots (severity: module doc). Catalogued breaks are the graph level's findings."""
    findings = []
    for cov in found:
        if not cov.stray_only:
            continue
        lost = ranges(cov.stray_only, cov.order())
        newest_ok = max((c.createtxg for c in cov.restorable), default=-1)
        current = any(c.createtxg > newest_ok for c in cov.stray_only)
        where = f"{cov.host}:{cov.dataset} in store {cov.store}"
        problem = (f"the chain of {where} is broken at {cov.broken_at}: {cov.broken_why};"
                   f" {len(cov.stray_only)} stored snapshot(s) cannot be restored from this"
                   f" store: {lost} ({cov.line()})")
        if current:
            action = ("run `zbak archive --full`: it starts a new chain from the newest snapshot"
                      " and deletes the stream directories no chain can use; "
                      f"{lost} cannot be brought back from this store (`zbak catalog rebuild"
                      " --merge` cannot help: a manifest the chain needs is gone), only from"
                      " the source or a replica that still holds them")
        else:
            action = ("nothing brings these back from this store; a newer chain restores the"
                      " dataset. Deleting these directories reclaims their space: "
                      + ", ".join(cov.dead[:5]) + (" ..." if len(cov.dead) > 5 else ""))
        findings.append(Finding(Severity.ERROR if current else Severity.INFO, "objects",
                                problem, action, job=job, host=cov.host, dataset=cov.dataset,
                                store=cov.store, key=cov.dead[0] if cov.dead else None))
    return findings
