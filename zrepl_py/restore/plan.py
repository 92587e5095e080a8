"""Plan ``zbak restore`` (PURE, docs/style.md#planners-are-pure-and-drivers-are-thin): facts in
(``facts.RestoreFacts``), a plan out.

Sources (docs/design.md#restore,
docs/decisions.md#the-cheapest-restore-source-is-chosen-and-the-plan-says-why), in this order:

1. the snapshot on the dataset itself (a local ``zfs send | zfs receive`` copy into ``--into``);
2. a replica target that has it (sent back, over ssh for a remote host);
3. an archived chain (full, then each incremental in order): among stores, the one with no
   thaw first (only GLACIER / DEEP_ARCHIVE objects need one), then the cheapest and shortest
   thaw, then the fewest bytes to read, then the fewest streams; within a store the same
   order picks among its chains (the nearest full usually wins on bytes).

Snapshots on the dataset or a replica come first because they need no store read, no
decompression and no thaw. ``--from local|HOST|STORE`` forces one source. The plan says why
it chose (``RestorePlan.reason``) and why every other option was not used. A refusal names
the newest snapshot that can be restored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from zrepl_py.catalog.paths import ChainPath, archive_paths, why_no_path
from zrepl_py.catalog.rows import LOCAL_HOST, VolumeRow
from zrepl_py.errors import RestoreError, UsageError
from zrepl_py.objects.manifest import CarriedSnapshot
from zrepl_py.restore.facts import Listing, RestoreFacts, StoreFacts
from zrepl_py.restore.mark import RESTORING, mark_value
from zrepl_py.restore.thaw import ThawEstimate, estimate

_SOURCE_RANK = {"local": 0, "replica": 1, "archive": 2}

_Rank = tuple[int, bool, float, float, int, int, str]


@dataclasses.dataclass(frozen=True)
class Option:
    """One way to restore, or why it cannot be used.

    Attributes:
        source: ``"local"``, ``"replica"`` or ``"archive"``.
        label: ``local``, the replica host (``HOST:DATASET`` when it is the dataset's own
            host, so it differs from ``local``), or the store name: what ``--from`` takes.
        snapshots: for local/replica, the snapshots to send there, oldest first, ending at
            the target (a full of the first, then ``-I`` to the target).
        host / dataset: where those snapshots are (local/replica).
        path: for archive, the chain path.
        thaw: for archive, what thawing its cold volumes takes (None: nothing is cold).
        problem: why this option cannot be used, or None.
    """

    source: str
    label: str
    snapshots: tuple[CarriedSnapshot, ...] = ()
    host: str | None = None
    dataset: str | None = None
    path: ChainPath | None = None
    thaw: ThawEstimate | None = None
    problem: str | None = None

    @property
    def cost(self) -> str:
        """What using this option reads, for the plan's reasons (``"no thaw, 25.2 MB in 2
        stream(s)"``); ``""`` for local/replica."""
        if self.path is None:
            return ""
        thaw = ("no thaw" if self.thaw is None else
                f"thaw {self.thaw.objects} object(s), about {self.thaw.hours:g} h and"
                f" ${self.thaw.cost_usd:.2f}")
        return f"{thaw}, {_mb(self.path.stored_bytes)} in {len(self.path.streams)} stream(s)"


@dataclasses.dataclass(frozen=True)
class RestorePlan:
    """What ``zbak restore`` will do.

    Attributes:
        host / dataset: the dataset being restored (as catalogued).
        target: the snapshot wanted.
        into / into_host: the dataset to create and its host (the dataset's own host unless
            ``--into HOST:POOL/NAME`` named another); it does not exist, or holds the first
            ``resumed`` streams of the chain from an interrupted restore (``mark.RESTORING``).
        chosen: the option used.
        options: every option considered (for the plan shown), cheapest first.
        reason: why ``chosen`` was picked over the others (one sentence).
        volumes: for archive, the volumes of each stream of the path, by stream id.
        thaw: for archive, what thawing cold volumes takes (None when nothing is cold).
        resumed: streams of the chain (local/replica: snapshots) ``into`` holds already;
            ``chosen`` is what is left to send (local/replica: from the newest it holds).
    """

    host: str
    dataset: str
    target: CarriedSnapshot
    into: str
    into_host: str
    chosen: Option
    options: tuple[Option, ...]
    reason: str
    volumes: Mapping[int, Sequence[VolumeRow]]
    thaw: ThawEstimate | None
    resumed: int = 0


@dataclasses.dataclass(frozen=True)
class SourceChoice:
    """Where a snapshot is read from, before anything about a destination is decided.

    Attributes:
        target: the snapshot wanted.
        options: every option considered, usable ones first, cheapest first.
        chosen: the option used.
        reason: why ``chosen`` (one sentence).
    """

    target: CarriedSnapshot
    options: tuple[Option, ...]
    chosen: Option
    reason: str


def choose_source(facts: RestoreFacts, to: str, from_: str | None) -> SourceChoice:
    """The cheapest source of snapshot ``to`` of ``facts.dataset`` (see the module
    docstring), or the one ``from_`` forces; ``facts.into`` is not looked at (a file
    restore reads the snapshot where it is, ``files.plan``).

    Raises:
        UsageError: ``--from`` names no source of the dataset.
        RestoreError: unknown or ambiguous snapshot; no source can restore it (the message
            names the newest snapshot that can be).
    """
    target = _resolve_snapshot(facts, to)
    options = _options(facts, target)
    chosen, reason = _choose(facts, options, from_, target)
    return SourceChoice(target, tuple(options), chosen, reason)


def plan_restore(facts: RestoreFacts, to: str, from_: str | None) -> RestorePlan:
    """Plan restoring ``facts.dataset`` to snapshot ``to`` (``@NAME`` or ``NAME``) into
    ``facts.into`` (see the module docstring); ``from_`` forces a source by label or kind.

    Raises:
        UsageError: ``--from`` names no source of the dataset.
        RestoreError: unknown or ambiguous snapshot; no source can restore it (the message
            names the newest snapshot that can be); the destination exists or cannot be
            created.
    """
    target = _resolve_snapshot(facts, to)
    options = _options(facts, target)
    if (facts.into.host, facts.into.dataset) == (facts.host, facts.dataset):
        options = [dataclasses.replace(o, problem=(
            f"@{target.name} is on {facts.dataset} already: pass --into POOL/NAME to copy it,"
            " or roll back with zfs rollback yourself")) if o.source == "local" and not o.problem
            else o for o in options]
        options.sort(key=_order)
    chosen, reason = _choose(facts, options, from_, target)
    return plan_into(facts, SourceChoice(target, tuple(options), chosen, reason),
                     forced=from_ is not None)


def plan_into(facts: RestoreFacts, choice: SourceChoice, *, forced: bool) -> RestorePlan:
    """The restore of ``choice`` into ``facts.into`` (a new dataset, or one an interrupted
    restore of the same dataset left: only what is missing is sent); ``forced``: the source
    was named with ``--from``.

    Raises:
        RestoreError: the destination exists (and is not such a leftover) or cannot be
            created.
    """
    target, chosen, reason = choice.target, choice.chosen, choice.reason
    options = list(choice.options)
    into = facts.into
    resumed = 0
    if into.exists:
        resumed = _received_before(facts, chosen)
        if chosen.path is not None:
            path = dataclasses.replace(chosen.path, streams=chosen.path.streams[resumed:])
            rest = dataclasses.replace(chosen, path=path)
            more = (f"holds the first {resumed} stream(s) from an interrupted restore:"
                    f" continuing with the other {len(path.streams)}")
        else:  # local/replica: the full arrived, the -I goes from the newest it holds
            rest = dataclasses.replace(chosen, snapshots=chosen.snapshots[resumed - 1:])
            more = (f"holds @{rest.snapshots[0].name} from an interrupted restore: continuing"
                    f" with -I @{rest.snapshots[0].name} @{target.name}")
        options = [rest if o is chosen else o for o in options]
        chosen = rest
        reason = _why(chosen, options, target, forced=forced)  # the rest's cost
        reason += f"; {into.host}:{into.dataset} {more}"
    if into.problem:
        raise RestoreError(f"cannot restore {facts.dataset}@{target.name} into"
                           f" {into.host}:{into.dataset}: {into.problem}")
    volumes: dict[int, Sequence[VolumeRow]] = {}
    if chosen.path is not None:
        store = next(s for s in facts.stores if s.name == chosen.path.store)
        volumes = {s.id: store.volumes[s.id] for s in chosen.path.streams}
    return RestorePlan(facts.host, facts.dataset, target, into.dataset, into.host, chosen,
                       tuple(options), reason, volumes, chosen.thaw, resumed)


def _received_before(facts: RestoreFacts, chosen: Option) -> int:
    """How many streams of ``chosen``'s chain path (for a local or replica source: how many
    of its snapshots) the existing ``--into`` dataset holds from an interrupted restore of
    this dataset: it carries the ``RESTORING`` mark, every snapshot of it is one the path's
    first streams carry and its newest is the last of those streams' snapshot (local or
    replica: its snapshots are the first of the ones sent); a restore continues only such a
    dataset.

    Raises:
        RestoreError: any other existing dataset (zbak restore never overwrites one), or
            one that holds the whole path (the interruption came after the last receive).
    """
    into = facts.into
    where = f"{into.host}:{into.dataset}"
    refuse = (f"{where} exists; zbak restore never overwrites a dataset. Restore --into a new"
              " name (then rename), or remove it yourself")
    if into.restoring is None:
        raise RestoreError(refuse)
    if into.restoring != mark_value(facts.host, str(facts.dataset)):
        raise RestoreError(f"{refuse} (it is what is left of an interrupted restore of"
                           f" {into.restoring})")
    left = f"{refuse} (it is what is left of an interrupted restore of {facts.dataset}"
    path = chosen.path
    if path is None:
        held = [s.guid for s in into.snapshots]
        if held and held == [s.guid for s in chosen.snapshots[:len(held)]]:
            if len(held) == len(chosen.snapshots):
                raise RestoreError(f"{left}, after its last snapshot was received: zfs"
                                   f" inherit {RESTORING} {into.dataset}, or remove it)")
            return len(held)
        raise RestoreError(f"{left}, but its snapshots are not the first of the ones"
                           f" {chosen.label} sends now)")
    store = next(s for s in facts.stores if s.name == path.store)
    have = {s.guid for s in into.snapshots}
    carried: set[int] = set()
    for done, stream in enumerate(path.streams, start=1):
        carried.update(s.guid for s in store.carried.get(stream.id, ()))
        carried.add(stream.to_guid)
        if into.snapshots and into.snapshots[-1].guid == stream.to_guid and have <= carried:
            if done == len(path.streams):
                raise RestoreError(f"{left}, after its last stream was received: destroy its"
                                   f" snapshots after @{path.target.name} and zfs rollback"
                                   " to it, or remove it)")
            return done
    raise RestoreError(f"{left}, but its snapshots are not the first streams of the chain"
                       f" chosen now (store {path.store}))")


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _known(facts: RestoreFacts) -> dict[int, CarriedSnapshot]:
    """Every snapshot of the dataset anyone knows, by guid. The createtxg of a snapshot the
    catalog, the dataset or a stream knows wins over a replica's (a replica's txgs are its
    own pool's, not comparable with the source's)."""
    known = {s.guid: s for r in facts.replicas for s in r.snapshots}
    known.update({c.guid: c for store in facts.stores for cs in store.carried.values() for c in cs})
    known.update({s.guid: s for s in facts.local.snapshots})
    known.update({s.guid: s for s in facts.catalogued})
    return known


def _resolve_snapshot(facts: RestoreFacts, name: str) -> CarriedSnapshot:
    short = name[1:] if name.startswith("@") else name
    known = _known(facts)
    found = {g: c for g, c in known.items() if c.name == short}
    if not found:
        names = [c.name for c in sorted(known.values(), key=lambda c: c.createtxg)]
        hint = ", ".join(names[-10:]) or "none"
        where = facts.dataset if facts.host == LOCAL_HOST else f"{facts.host}:{facts.dataset}"
        raise RestoreError(f"no snapshot @{short} of {where} is known locally, on a"
                           f" replica or in the archive (known: {hint}){_newest_hint(facts)}")
    if len(found) > 1:
        listed = ", ".join(f"guid {g} (createtxg {c.createtxg})" for g, c in found.items())
        raise RestoreError(f"@{short} of {facts.dataset} names {len(found)} different snapshots"
                           f" over time ({listed}); the name is ambiguous")
    return next(iter(found.values()))


def _snapshots_to(listing: Listing, guid: int) -> tuple[CarriedSnapshot, ...]:
    index = next(i for i, s in enumerate(listing.snapshots) if s.guid == guid)
    return listing.snapshots[: index + 1]


def _listing_option(source: str, label: str, listing: Listing, target: CarriedSnapshot) -> Option:
    where = f"{listing.host}:{listing.dataset}"
    if listing.problem:
        return Option(source, label, host=listing.host, dataset=listing.dataset,
                      problem=f"not available: {listing.problem}")
    if not any(s.guid == target.guid for s in listing.snapshots):
        return Option(source, label, host=listing.host, dataset=listing.dataset,
                      problem=f"{where} has no @{target.name}")
    return Option(source, label, _snapshots_to(listing, target.guid), listing.host,
                  listing.dataset)


def _store_option(facts: RestoreFacts, store: StoreFacts, target: CarriedSnapshot) -> Option:
    if store.problem:
        return Option("archive", store.name, problem=store.problem)
    paths = archive_paths(store.streams, store.carried, target.guid, store.damaged)
    if not paths:
        return Option("archive", store.name, problem=why_no_path(
            store.name, store.streams, store.carried, target, store.damaged))
    options = []
    for path in paths:
        thaw = estimate(path.streams, {s.id: list(store.volumes[s.id]) for s in path.streams},
                        facts.restore)
        options.append(Option("archive", store.name, path=path, thaw=thaw if thaw.objects else None))
    return min(options, key=_rank)


def _options(facts: RestoreFacts, target: CarriedSnapshot) -> list[Option]:
    """Every source's option for ``target``, cheapest usable first, then the unusable ones
    (source side only: the destination is checked by the caller)."""
    # Labelled by its host: on the backup host of a pull job the dataset is the master's, and
    # "local" there names this machine (a replica's host).
    options = [_listing_option("local", facts.host, facts.local, target)]
    for replica in facts.replicas:
        label = replica.host if replica.host != facts.host else f"{replica.host}:{replica.dataset}"
        options.append(_listing_option("replica", label, replica, target))
    options += [_store_option(facts, s, target) for s in facts.stores]
    if not facts.stores:
        options.append(Option("archive", "archive", problem=f"no store holds a stream of {facts.dataset}"))
    return sorted(options, key=_order)


def _order(option: Option) -> tuple[bool, _Rank]:
    """Sort key of the plan's options: usable ones first, each group by ``_rank``."""
    return (option.problem is not None, _rank(option))


def _rank(option: Option) -> _Rank:
    """Sort key: local, replicas, then stores by (needs a thaw, thaw cost, thaw hours, bytes
    to read, streams); the label last so the order never depends on the config's order."""
    thaw, path = option.thaw, option.path
    return (_SOURCE_RANK[option.source],
            thaw is not None, thaw.cost_usd if thaw else 0.0, thaw.hours if thaw else 0.0,
            path.stored_bytes if path else 0, len(path.streams) if path else 0, option.label)


def _why(chosen: Option, options: Sequence[Option], target: CarriedSnapshot, forced: bool) -> str:
    """One sentence: why ``chosen`` (the other options' problems are shown with them)."""
    if forced:
        return f"forced with --from {chosen.label}" + (f" ({chosen.cost})" if chosen.cost else "")
    if chosen.source == "local":
        return f"@{target.name} is on {chosen.dataset} itself: no replica or store is read"
    if chosen.source == "replica":
        return (f"the replica {chosen.host}:{chosen.dataset} has @{target.name}: no store is"
                " read, nothing to thaw; the local dataset cannot be used")
    others = [o for o in options if o.source == "archive" and not o.problem and o is not chosen]
    why = f"cheapest store: {chosen.label} ({chosen.cost})"
    if others:
        why += "; over " + ", ".join(f"{o.label} ({o.cost})" for o in others)
    return why + "; no local or replica snapshot can be used"


def _choose(facts: RestoreFacts, options: list[Option], from_: str | None,
            target: CarriedSnapshot) -> tuple[Option, str]:
    usable = [o for o in options if o.problem is None]
    if from_ is not None:
        named = [o for o in options if from_ in (o.label, o.source, f"{o.host}:{o.dataset}")]
        if not named:
            labels = ", ".join(sorted({o.label for o in options}))
            raise UsageError(f"--from {from_}: not a source of {facts.dataset} (sources: {labels})")
        usable = [o for o in named if o.problem is None]
        if not usable:
            raise RestoreError(f"--from {from_}: {named[0].problem}; nothing was received"
                               f"{_newest_hint(facts)}")
        return usable[0], _why(usable[0], options, target, forced=True)
    if not usable:
        reasons = "; ".join(f"{o.label}: {o.problem}" for o in options)
        raise RestoreError(f"nothing can restore {facts.dataset}@{target.name}: {reasons}"
                           f"{_newest_hint(facts)}")
    return usable[0], _why(usable[0], options, target, forced=False)


def _newest_hint(facts: RestoreFacts) -> str:
    """``"; the newest snapshot that can be restored is @N (from S)"``, or that none can."""
    for snap in sorted(_known(facts).values(), key=lambda s: s.createtxg, reverse=True):
        usable = [o for o in _options(facts, snap) if o.problem is None]
        if usable:
            return f"; the newest snapshot that can be restored is @{snap.name} (from {usable[0].label})"
    return "; no snapshot of it can be restored from any source"
