"""Audit level 1, the catalog graph (pure: catalog rows in, findings out).

Rules checked (docs/design.md#audit), per dataset and store:

* **Every chain starts at a full.** Following ``parent_id`` from any stream must end at a
  ``full`` stream without parent. A parent missing from the catalog, an incremental without
  parent, or a cycle breaks the chain there.
* **Guid continuity.** An incremental starts at its parent's ``to_guid``, in the same
  dataset and store, and ends at a later createtxg; a full has no parent and no from-guid;
  the snapshots a stream carries include its to-snapshot and lie after its parent's
  (createtxg in ``(parent's to_createtxg, to_createtxg]``); a full carries exactly one; a
  carried guid the ``snapshots`` input knows has the same createtxg there.
* **No orphans.** A living stream (``uploaded``/``verified``) whose parent is ``condemned``,
  ``bad`` or ``uploading`` cannot be restored.
* **Volumes.** A living stream has volume rows numbered 0, 1, ... whose sizes add up to the
  stream's.
* **Restorable snapshots.** A snapshot is *archived* in a store when a stream there that is
  neither condemned nor still uploading carries it, and *restorable* when a living stream
  carries it whose every ancestor is living, consistent and reaches a full. Every archived
  snapshot must be restorable. Each break point (the stream nearest the full that makes its
  descendants unrestorable) gives one finding naming the streams cut off and the archived
  snapshots no other chain restores.
* **The archive keeps up.** For each dataset a job archives (:class:`ArchiveExpectation`),
  the newest live snapshot created before the last successful archive run must be
  restorable from the job's store.
* **Replica cursors.** The snapshot a cursor names is in the catalog and not destroyed on
  the source; where the driver listed the target (:class:`TargetListing`), it is there too.

One broken stream gives one finding, not one per descendant. The work is linear in the
number of streams: each stream's chain is resolved once (memoised) over the lean rows of
``Catalog.stream_links``. The volume and carried-snapshot rules run either here over loaded
rows (``GraphInput.volumes``/``carried``: the pure form the unit tests use) or in the
database (``GraphInput.screened``, what ``audit.load`` gives), which hands back only the
failing streams; the detail of volumes and carried snapshots is then read for the streams a
finding describes only. Pure apart from those reads. Timings: benchmarks/catalog.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from zrepl_py.audit.findings import Finding, Severity
from zrepl_py.catalog.rows import (
    LIVING_STATES,
    CursorRow,
    SnapshotRow,
    StreamLink,
    StreamRow,
    VolumeRow,
)
from zrepl_py.objects.manifest import CarriedSnapshot
from zrepl_py.runtime.gcpause import gc_paused

MAX_LISTED = 10  # snapshots named in one finding before "and N more"

VolumeTotals = tuple[int, int, int, int, int]
"""``(count, first index, last index, raw bytes, stored bytes)`` of a stream's volume rows
(``Catalog.volume_totals``; :func:`volume_totals` computes it from rows)."""


ChainStream = StreamRow | StreamLink
"""What the graph reads of a stream: a full ``StreamRow`` or the lean ``StreamLink``."""


def volume_totals(volumes: Mapping[int, Sequence[VolumeRow]]) -> dict[int, VolumeTotals]:
    """:data:`VolumeTotals` per stream from volume rows (``Catalog.bulk_volumes``)."""
    return {sid: (len(rows), min(v.index for v in rows), max(v.index for v in rows),
                  sum(v.raw_bytes for v in rows), sum(v.stored_bytes for v in rows))
            for sid, rows in volumes.items() if rows}


@dataclasses.dataclass(frozen=True)
class CarriedTable:
    """The snapshots many streams carry, as parallel columns sorted by stream id (cheap to
    build from 100,000s of rows): entry ``i`` is snapshot ``guids[i]`` (``createtxgs[i]``,
    ``names[i]``, which may be None when read without names) carried by stream ``ids[i]``;
    ``spans[stream_id]`` is the ``(start, end)`` (end exclusive) of that stream's entries."""

    spans: Mapping[int, tuple[int, int]]
    ids: Sequence[int]
    guids: Sequence[int]
    createtxgs: Sequence[int]
    names: Sequence[str | None]

    @classmethod
    def from_columns(cls, ids: Sequence[int], guids: Sequence[int], createtxgs: Sequence[int],
                     names: Sequence[str | None]) -> CarriedTable:
        """From parallel columns sorted by stream id (``Catalog.carried_columns``)."""
        spans: dict[int, tuple[int, int]] = {}
        if ids:
            start, prev = 0, ids[0]
            for index, sid in enumerate(ids):
                if sid != prev:
                    spans[prev] = (start, index)
                    start, prev = index, sid
            spans[prev] = (start, len(ids))
        return cls(spans, ids, guids, createtxgs, names)

    @classmethod
    def from_mapping(cls, carried: Mapping[int, Sequence[CarriedSnapshot]]) -> CarriedTable:
        """From ``Catalog.carried``/``bulk_carried``'s ``{stream id: [CarriedSnapshot]}``."""
        rows = [(sid, c.guid, c.createtxg, c.name) for sid in sorted(carried) for c in carried[sid]]
        return cls.from_columns([r[0] for r in rows], [r[1] for r in rows],
                                [r[2] for r in rows], [r[3] for r in rows])

    def of(self, stream_id: int) -> list[CarriedSnapshot]:
        """The snapshots one stream carries (empty when none are recorded)."""
        start, end = self.spans.get(stream_id, (0, 0))
        return [CarriedSnapshot(self.names[i] or "", self.guids[i], self.createtxgs[i])
                for i in range(start, end)]


@dataclasses.dataclass(frozen=True)
class ArchiveExpectation:
    """A dataset a job archives into ``store``; ``last_run`` is when the last successful
    archive run of it started (aware UTC; None: never)."""

    host: str
    dataset: str
    store: str
    last_run: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class TargetListing:
    """What the driver found on a replica target dataset: the guids of its snapshots, or
    ``problem`` (why it could not be listed) with ``guids`` None."""

    target: str
    location: str
    guids: frozenset[int] | None
    problem: str | None = None


@dataclasses.dataclass(frozen=True)
class Screened:
    """The volume and carried-snapshot rules, already checked by the catalog database
    (``Catalog.screen_streams``: the same rules in SQL, returning only the failures), and
    readers for the detail of the few streams the findings describe.

    Attributes:
        failed: ids of the streams that break one of those rules (any state); every other
            stream passes them.
        volumes_of: stream ids -> :data:`VolumeTotals` by id (``Catalog.volume_totals_of``;
            streams without volume rows absent).
        carried_of: stream ids -> every snapshot each carries, ``{id: [CarriedSnapshot]}``
            (``Catalog.carried``; streams recorded without them map to [] or are absent).
        carrying: guids -> ``[(stream id, CarriedSnapshot)]``, every carried row with one
            of those guids (``Catalog.carrying``).
    """

    failed: Collection[int]
    volumes_of: Callable[[Collection[int]], Mapping[int, VolumeTotals]]
    carried_of: Callable[[Collection[int]], Mapping[int, Sequence[CarriedSnapshot]]]
    carrying: Callable[[Collection[int]], Sequence[tuple[int, CarriedSnapshot]]]


@dataclasses.dataclass(frozen=True)
class GraphInput:
    """The catalog rows one graph audit reads (any scope: one job or the whole catalog).

    Attributes:
        streams: every stream in scope, any state (``StreamRow`` or ``StreamLink``).
        volumes: :data:`VolumeTotals` by stream id (not read when ``screened`` is given).
        carried: the carried snapshots of the streams (:class:`CarriedTable`; not read
            when ``screened`` is given).
        snapshots: snapshots-table rows (destroyed ones included) the checks compare with:
            at least every snapshot a cursor names and the newest live snapshot of each
            expected dataset created before its last archive run. Carried snapshots are
            cross-checked against the rows given; passing the whole table checks them all,
            more slowly.
        cursors: the replica cursors to check.
        archives: the datasets whose archive must keep up (:class:`ArchiveExpectation`).
        targets: target listings by ``(cursor.target, cursor.target_location)``; a cursor
            without one has its target side unchecked.
        screened: None: the volume and carried-snapshot rules are checked here over
            ``volumes`` and ``carried``; else the database's verdicts (:class:`Screened`),
            with the detail read only for the streams findings describe (what
            ``audit.load.load_graph_input`` gives: on a catalog of 100,000 streams it
            reads one failing id instead of 300,000 child rows).
    """

    streams: Sequence[ChainStream]
    volumes: Mapping[int, VolumeTotals] = dataclasses.field(default_factory=dict)
    carried: CarriedTable = dataclasses.field(
        default_factory=lambda: CarriedTable.from_columns([], [], [], []))
    snapshots: Sequence[SnapshotRow] = ()
    cursors: Sequence[CursorRow] = ()
    archives: Sequence[ArchiveExpectation] = ()
    targets: Mapping[tuple[str, str], TargetListing] = dataclasses.field(default_factory=dict)
    screened: Screened | None = None


def _link(s: ChainStream) -> StreamLink:
    return StreamLink(*(getattr(s, field) for field in StreamLink._fields))


def _label(s: ChainStream) -> str:
    if s.kind == "full":
        what = f"full @{s.to_name}"
    else:
        what = f"incremental @{s.from_name or s.from_guid} -> @{s.to_name}"
    return f"stream {s.id} ({what} of {s.host}:{s.dataset} in store {s.store})"


def _snap_text(name: str | None, guid: int, createtxg: int) -> str:
    return f"@{name}" if name else f"guid {guid} (createtxg {createtxg})"


def _listed(items: Sequence[str]) -> str:
    more = len(items) - MAX_LISTED
    return ", ".join(items[:MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


class _Audit:
    """One run of :func:`audit_graph`: the indexes built over the input and the findings."""

    def __init__(self, data: GraphInput):
        self.data = data
        # Lean tuples throughout (StreamRow inputs are converted once): the hot loops unpack.
        self.streams = [s if type(s) is StreamLink else _link(s) for s in data.streams]
        self.by_id = {s.id: s for s in self.streams}
        self.findings: list[Finding] = []
        self.local: dict[int, list[str]] = {}  # why a stream cannot be restored by itself
        self.full_of: dict[int, int | None] = {}
        self.brk_of: dict[int, int | None] = {}
        self.known: dict[tuple[str, str], dict[int, SnapshotRow]] = {}
        for snap in data.snapshots:
            self.known.setdefault((snap.host, snap.dataset), {})[snap.guid] = snap
        # guids restorable per (host, dataset, store), filled for the guids findings ask about
        self.restorable: dict[tuple[str, str, str], set[int]] = {}
        self.unbroken: set[tuple[str, str, str]] = set()
        self.heads: dict[ArchiveExpectation, SnapshotRow | None] = {}
        self._carried: dict[int, list[CarriedSnapshot]] = {}
        self.screened = data.screened if data.screened is not None else self._screen_here()

    def add(self, s: ChainStream, severity: Severity, problem: str, action: str) -> None:
        self.findings.append(Finding(severity, "graph", problem, action, host=s.host,
                                     dataset=s.dataset, store=s.store,
                                     chain=self.full_of.get(s.id), stream=s.id))

    def name_of(self, s: ChainStream, snap: CarriedSnapshot) -> str:
        name: str | None = snap.name
        if not name:
            row = self.known.get((s.host, s.dataset), {}).get(snap.guid)
            name = row.name if row is not None else None
        return _snap_text(name, snap.guid, snap.createtxg)

    def carried_of(self, stream_ids: Sequence[int]) -> dict[int, list[CarriedSnapshot]]:
        """The snapshots each of ``stream_ids`` carries (read once per stream)."""
        cache = self._carried
        missing = [sid for sid in stream_ids if sid not in cache]
        if missing:
            found = self.screened.carried_of(missing)
            for sid in missing:
                cache[sid] = list(found.get(sid, ()))
        return {sid: cache[sid] for sid in stream_ids}

    # -- per-stream checks ---------------------------------------------------------------

    def _screen_here(self) -> Screened:
        """:class:`Screened` computed from ``volumes`` and ``carried`` (the rules of
        ``Catalog.screen_streams``, in Python; the columns make it one pass)."""
        data, by_id = self.data, self.by_id
        vols, table = data.volumes, data.carried
        spans, txgs = table.spans, table.createtxgs
        pairs = set(zip(table.ids, table.guids, strict=True))
        failed = set()
        for s in self.streams:
            sid, kind, parent_id, to_guid, to_txg, raw, stored, state = \
                s[0], s[4], s[5], s[7], s[10], s[11], s[12], s[13]
            totals = vols.get(sid)
            if totals is None:
                if state in LIVING_STATES:
                    failed.add(sid)
            elif (totals[1] != 0 or totals[2] != totals[0] - 1 or totals[3] != raw
                    or totals[4] != stored):
                failed.add(sid)
            span = spans.get(sid)
            if span is not None:
                created = txgs[span[0]:span[1]]
                parent = (by_id.get(parent_id) if kind != "full" and parent_id is not None
                          else None)
                low = parent.to_createtxg if parent is not None else -1
                if ((sid, to_guid) not in pairs or (kind == "full" and len(created) != 1)
                        or min(created) <= low or max(created) > to_txg):
                    failed.add(sid)

        def carrying(wanted: Collection[int]) -> list[tuple[int, CarriedSnapshot]]:
            return [(table.ids[i], CarriedSnapshot(table.names[i] or "", guid, txgs[i]))
                    for i, guid in enumerate(table.guids) if guid in wanted]

        return Screened(failed=failed,
                        volumes_of=lambda ids: {i: vols[i] for i in ids if i in vols},
                        carried_of=lambda ids: {i: table.of(i) for i in ids},
                        carrying=carrying)

    def _conflicts(self) -> dict[int, list[tuple[CarriedSnapshot, SnapshotRow]]]:
        """``{stream id: [(carried snapshot, snapshots-table row)]}`` where a carried guid
        the ``snapshots`` input knows has another createtxg there."""
        if not self.known:
            return {}
        guids = {guid for rows in self.known.values() for guid in rows}
        conflicts: dict[int, list[tuple[CarriedSnapshot, SnapshotRow]]] = {}
        for sid, snap in self.screened.carrying(guids):
            s = self.by_id.get(sid)
            row = self.known.get((s.host, s.dataset), {}).get(snap.guid) if s else None
            if row is not None and row.createtxg != snap.createtxg:
                conflicts.setdefault(sid, []).append((snap, row))
        return conflicts

    def check_streams(self) -> None:
        """Screen every stream with plain comparisons (tuple unpacking: this loop runs once
        per stream of the catalog) and the volume and carried-snapshot verdicts, then read
        the detail of the few that fail and describe their problems."""
        by_id, failed = self.by_id, self.screened.failed
        conflicts = self._conflicts()
        suspects = []
        for s in self.streams:
            sid, host, dataset, store, kind, parent_id, from_guid, _, _, _, to_txg, _, _, \
                state = s
            if state != "verified" and state != "uploaded":
                if state != "condemned":
                    suspects.append(s)
                continue
            if sid in failed or sid in conflicts:
                suspects.append(s)
            elif kind == "full":
                if parent_id is not None or from_guid is not None:
                    suspects.append(s)
            else:
                p = by_id.get(parent_id) if parent_id is not None else None
                if (p is None or p.to_guid != from_guid or p.to_createtxg >= to_txg
                        or p.dataset != dataset or p.store != store or p.host != host):
                    suspects.append(s)
        if not suspects:
            return
        ids = [s.id for s in suspects]
        totals, carried = self.screened.volumes_of(ids), self.carried_of(ids)
        for s in suspects:
            problems = self._problems(s, totals.get(s.id), carried[s.id],
                                      conflicts.get(s.id, ()))
            if problems:
                self.local[s.id] = problems

    def _problems(self, s: ChainStream, totals: VolumeTotals | None,
                  carried: Sequence[CarriedSnapshot],
                  conflicts: Sequence[tuple[CarriedSnapshot, SnapshotRow]]) -> list[str]:
        """Why stream ``s`` (not condemned) cannot be restored by itself, in words."""
        living = s.state in LIVING_STATES
        problems = [] if living else [f"it is {s.state}"]
        parent = None
        if s.kind == "full":
            if s.parent_id is not None or s.from_guid is not None:
                problems.append(f"it is a full but names parent {s.parent_id} and from-guid"
                                f" {s.from_guid}")
        elif s.parent_id is None:
            problems.append("it is an incremental without a parent stream (its chain has"
                            " no full)")
        else:
            parent = self.by_id.get(s.parent_id)
            if parent is None:
                problems.append(f"its parent stream {s.parent_id} is not in the catalog")
            else:
                self._continuity(s, parent, problems)
        if totals is None:
            if living:
                problems.append("the catalog lists no volumes for it")
        else:
            count, first, last, raw, stored = totals
            if first != 0 or last != count - 1:
                problems.append(f"its {count} volume rows are numbered {first}..{last},"
                                " not from 0 without gaps")
            if raw != s.raw_bytes or stored != s.stored_bytes:
                problems.append(f"its volumes add up to {raw} raw / {stored} stored bytes,"
                                f" the stream row says {s.raw_bytes} / {s.stored_bytes}")
        if carried:
            if not any(snap.guid == s.to_guid for snap in carried):
                problems.append(f"the snapshots it carries do not include its to-snapshot"
                                f" @{s.to_name}")
            if s.kind == "full" and len(carried) != 1:
                problems.append(f"it is a full but carries {len(carried)} snapshots")
            low = parent.to_createtxg if parent is not None else -1
            outside = [self.name_of(s, snap) for snap in carried
                       if not low < snap.createtxg <= s.to_createtxg]
            if outside:
                problems.append(f"it carries {_listed(outside)} outside its createtxg range"
                                f" ({low}, {s.to_createtxg}]")
        for snap, row in conflicts:
            problems.append(f"it carries {self.name_of(s, snap)} guid {snap.guid} at"
                            f" createtxg {snap.createtxg}, the source had it at {row.createtxg}")
        return problems

    @staticmethod
    def _continuity(s: ChainStream, parent: ChainStream, problems: list[str]) -> None:
        if parent.dataset != s.dataset or parent.store != s.store or parent.host != s.host:
            problems.append(f"its parent stream {parent.id} is of {parent.host}:{parent.dataset}"
                            f" in store {parent.store}")
        if parent.to_guid != s.from_guid:
            problems.append(f"it starts at guid {s.from_guid} but its parent stream {parent.id}"
                            f" ends at @{parent.to_name} guid {parent.to_guid} (guid continuity)")
        if s.to_createtxg <= parent.to_createtxg:
            problems.append(f"it ends at createtxg {s.to_createtxg}, not after its parent's"
                            f" {parent.to_createtxg}")

    # -- chains --------------------------------------------------------------------------

    def resolve(self) -> None:
        """Each stream's chain full and break point, following parents once (memoised)."""
        by_id, local, full_of, brk_of = self.by_id, self.local, self.full_of, self.brk_of
        for start in self.streams:
            sid, kind, parent_id, state = start[0], start[4], start[5], start[13]
            if sid in full_of:
                continue
            # Fast paths: a full, or a stream whose parent is resolved (streams mostly come
            # parents first, in the order they were written).
            own = sid in local or state == "condemned"
            if kind == "full" and parent_id is None:
                full_of[sid], brk_of[sid] = sid, (sid if own else None)
                continue
            if parent_id in full_of:
                brk = brk_of[parent_id]
                full_of[sid] = full_of[parent_id]
                brk_of[sid] = sid if brk is None and own else brk
                continue
            path: list[StreamLink] = []
            on_path: dict[int, int] = {}
            cur: StreamLink | None = start
            above: int | None = None  # resolved stream just above the path, if any
            cycle_at = None
            while cur is not None:
                if cur.id in full_of:
                    above = cur.id
                    break
                if cur.id in on_path:
                    cycle_at = on_path[cur.id]
                    break
                on_path[cur.id] = len(path)
                path.append(cur)
                if cur.kind == "full" or cur.parent_id is None:
                    break
                cur = by_id.get(cur.parent_id)
            if cycle_at is not None:
                ring = path[cycle_at:]
                head = min(ring, key=lambda s: s.id)
                local.setdefault(head.id, []).append(
                    f"its parents form a cycle through streams {sorted(s.id for s in ring)}")
                for s in ring:
                    full_of[s.id], brk_of[s.id] = None, head.id
                path = path[:cycle_at]
                above = head.id
            for s in reversed(path):
                if above is None:  # the top of the chain
                    full = s.id if s.kind == "full" and s.parent_id is None else None
                    if full is None and s.id not in local:
                        local[s.id] = [f"its parent stream {s.parent_id} is not in the catalog"
                                       if s.parent_id is not None else
                                       "it is an incremental without a parent stream"]
                    brk = s.id if s.id in local else None
                else:
                    full = full_of[above]
                    brk = brk_of[above]
                    if brk is None and s.id in local:
                        brk = s.id
                if brk is None and s.state == "condemned":
                    brk = s.id
                full_of[s.id], brk_of[s.id] = full, brk
                above = s.id

    def report_chains(self) -> None:
        """One finding per break point, leftover condemned streams and branches."""
        brk_of = self.brk_of
        cut_off: dict[int, list[ChainStream]] = {}
        condemned = []
        parents = []  # parent ids of living streams
        for s in self.streams:
            sid, parent_id, state = s[0], s[5], s[13]
            if parent_id is not None and (state == "verified" or state == "uploaded"):
                parents.append(parent_id)
            if state == "condemned":
                condemned.append(s)
            elif (brk := brk_of[sid]) is not None:
                cut_off.setdefault(brk, []).append(s)
        with_children = set(parents)
        self.heads = self._archive_heads()
        self._restorable(cut_off)
        for s in condemned:
            if s.id not in cut_off and s.id not in with_children:
                self.add(s, Severity.WARNING, f"{_label(s)} is condemned: a prune marked it for"
                         " deletion and did not finish (its objects may be gone)",
                         "run `zbak prune` again to finish deleting it")
        if len(with_children) < len(parents):  # some stream has two living children
            children: dict[int, list[int]] = {}
            for s in self.streams:
                if s.parent_id is not None and s.state in LIVING_STATES:
                    children.setdefault(s.parent_id, []).append(s.id)
            for parent_id, ids in children.items():
                parent = self.by_id.get(parent_id)
                if len(ids) > 1 and parent is not None and parent.state in LIVING_STATES:
                    self.add(parent, Severity.INFO, f"{_label(parent)} has {len(ids)} living"
                             f" incrementals applying on it (streams {sorted(ids)}): the chain"
                             " branches", "nothing to do; each branch restores on its own")
        for brk in sorted(cut_off):
            self._report_break(self.by_id[brk], cut_off[brk])

    def _archive_heads(self) -> dict[ArchiveExpectation, SnapshotRow | None]:
        """Per expectation: the newest live snapshot created before its last run."""
        heads = {}
        for expect in self.data.archives:
            newest = None
            if expect.last_run is not None:
                for snap in self.known.get((expect.host, expect.dataset), {}).values():
                    if snap.destroyed_at is None and snap.creation < expect.last_run and (
                            newest is None or snap.createtxg > newest.createtxg):
                        newest = snap
            heads[expect] = newest
        return heads

    def _restorable(self, cut_off: Mapping[int, list[ChainStream]]) -> None:
        """Fill ``restorable`` for the guids the findings ask about (the archive heads and
        what broken streams carry), and ``unbroken`` (groups with a restorable stream):
        one lookup of the streams carrying those guids instead of a set of every guid per
        group."""
        by_id, brk_of, restorable = self.by_id, self.brk_of, self.restorable
        interest = {snap.guid for snap in self.heads.values() if snap is not None}
        members = [s for group in cut_off.values() for s in group]
        carried = self.carried_of([s.id for s in members])
        for s in members:
            interest.update([snap.guid for snap in carried[s.id]] or (s.to_guid,))
        if interest:
            for sid, snap in self.screened.carrying(interest):
                row = by_id.get(sid)
                if row is not None and brk_of[sid] is None:
                    restorable.setdefault((row.host, row.dataset, row.store), set()).add(snap.guid)
            # A stream recorded without carried snapshots restores its to-snapshot.
            bare = [s for s in self.streams if s.to_guid in interest and brk_of[s.id] is None
                    and s.to_guid not in restorable.get((s.host, s.dataset, s.store), ())]
            carried = self.carried_of([s.id for s in bare])
            for s in bare:
                if not carried[s.id]:
                    restorable.setdefault((s.host, s.dataset, s.store), set()).add(s.to_guid)
        self.unbroken = set()
        if any(e.last_run is None for e in self.data.archives):
            self.unbroken = {(s.host, s.dataset, s.store) for s in self.streams
                             if brk_of[s.id] is None}

    def _report_break(self, brk: ChainStream, members: list[ChainStream]) -> None:
        restorable = self.restorable.get((brk.host, brk.dataset, brk.store), set())
        carried = self.carried_of([s.id for s in members])
        lost: dict[int, tuple[int, str]] = {}
        for s in members:
            if s.state == "uploading":
                continue  # nothing of an unfinished upload was archived
            if not carried[s.id]:
                if s.to_guid not in restorable:
                    lost.setdefault(s.to_guid, (s.to_createtxg, f"@{s.to_name}"))
                continue
            for snap in carried[s.id]:
                if snap.guid not in restorable and snap.guid not in lost:
                    lost[snap.guid] = (snap.createtxg, self.name_of(s, snap))
        dependents = [s for s in members if s.id != brk.id and s.state in LIVING_STATES]
        why = "; ".join(self.local.get(brk.id, [])) or f"it is {brk.state}"
        problem = f"{_label(brk)} cannot be restored: {why}"
        if dependents:
            problem += (f"; {len(dependents)} living stream(s) applying after it cannot be"
                        " restored either")
        snaps = [text for _, text in sorted(lost.values())]
        if snaps:
            problem += (f"; {len(snaps)} archived snapshot(s) have no restorable copy in store"
                        f" {brk.store}: {_listed(snaps)}")
        if brk.state == "condemned":
            action = ("a prune condemned a stream that others still need: keep its objects,"
                      " run `zbak audit --deep`, then `zbak archive --full`")
        elif brk.state == "uploading":
            action = "run `zbak archive` again to finish or redo the upload"
        else:
            action = ("run `zbak archive --full` to start a new chain from the newest snapshot;"
                      " the snapshots listed can only come back from the source or a replica")
        quiet = brk.state == "uploading" and not dependents and not snaps
        self.add(brk, Severity.INFO if quiet else Severity.ERROR, problem, action)

    # -- archive lag and cursors ---------------------------------------------------------

    def check_archives(self) -> None:
        for expect, newest in self.heads.items():
            group = (expect.host, expect.dataset, expect.store)
            where: dict[str, Any] = dict(host=expect.host, dataset=expect.dataset,
                                         store=expect.store)
            if expect.last_run is None:
                if group not in self.unbroken:
                    self.findings.append(Finding(
                        Severity.INFO, "graph", f"{expect.host}:{expect.dataset} has never been"
                        f" archived to store {expect.store}", "run `zbak archive`", **where))
            elif newest is not None and newest.guid not in self.restorable.get(group, ()):
                self.findings.append(Finding(
                    Severity.WARNING, "graph",
                    f"{expect.host}:{expect.dataset}@{newest.name} (created"
                    f" {newest.creation:%Y-%m-%d %H:%M:%S}Z) is older than the last archive run"
                    f" ({expect.last_run:%Y-%m-%d %H:%M:%S}Z) but no restorable chain in store"
                    f" {expect.store} carries it",
                    "run `zbak archive` (it continues the chain or starts a new full)", **where))

    def check_cursors(self) -> None:
        for cur in self.data.cursors:
            where = (f"replica cursor of job {cur.job} for {cur.source_host}:{cur.source_dataset}"
                     f" on {cur.target}")
            common: dict[str, Any] = dict(job=cur.job, host=cur.source_host,
                                          dataset=cur.source_dataset, target=cur.target)
            snap = self.known.get((cur.source_host, cur.source_dataset), {}).get(cur.guid)
            if snap is None:
                self.findings.append(Finding(
                    Severity.ERROR, "graph", f"the {where} names @{cur.snapshot_name} guid"
                    f" {cur.guid}, a snapshot the catalog never saw on the source",
                    "run `zbak replicate` (it finds the common snapshot by guid and moves the"
                    " cursor)", **common))
            elif snap.destroyed_at is not None:
                self.findings.append(Finding(
                    Severity.WARNING, "graph", f"the {where} names @{cur.snapshot_name}, destroyed"
                    f" on the source at {snap.destroyed_at:%Y-%m-%d %H:%M:%S}Z: the next"
                    " replication needs a bookmark of it or a new full",
                    "run `zbak replicate`; find out who destroyed a replication base", **common))
            if cur.method != "zfs":
                continue
            listing = self.data.targets.get((cur.target, cur.target_location))
            if listing is None:
                continue
            if listing.guids is None:
                self.findings.append(Finding(
                    Severity.WARNING, "graph", f"could not list {cur.target_location} on"
                    f" {cur.target} to check the {where}: {listing.problem}",
                    "check that the target host answers (`zbak init`)", **common))
            elif cur.guid not in listing.guids:
                self.findings.append(Finding(
                    Severity.ERROR, "graph", f"the {where} names @{cur.snapshot_name} guid"
                    f" {cur.guid}, but {cur.target_location} on the target has no such snapshot",
                    "run `zbak replicate` (it finds the newest common snapshot again; a target"
                    " without one needs a new full)", **common))


_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then warnings, then info; each by dataset, stream and key."""
    return sorted(findings, key=lambda f: (_ORDER[f.severity], f.dataset or "", f.stream or 0,
                                           f.key or ""))


@gc_paused
def audit_graph(data: GraphInput) -> list[Finding]:
    """Check the catalog rows in ``data`` (see the module docstring); return the findings
    (:func:`sort_findings` order)."""
    audit = _Audit(data)
    audit.check_streams()
    audit.resolve()
    audit.report_chains()
    audit.check_archives()
    audit.check_cursors()
    return sort_findings(audit.findings)
