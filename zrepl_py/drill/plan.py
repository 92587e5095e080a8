"""Plan ``zbak drill`` (PURE, docs/style.md#planners-are-pure-and-drivers-are-thin): facts in
(``DrillFacts``, from ``drill.gather``), per source what to restore out.

A drill's sources are the stores holding streams of the job's datasets and the ZFS replica
targets the job replicated to (one replica per target). For each source and each of its
datasets the drill restores the newest snapshot that source can restore, planned by the
restore planner itself (``restore.plan.plan_restore``, the source forced) into a scratch
dataset: the drill proves exactly what ``zbak restore --from SOURCE`` would do
(docs/decisions.md#a-drill-is-a-restore-into-scratch).

A source is not drilled, by design, when (``SourcePlan.skip``):

* its newest restorable snapshot lies in GLACIER or DEEP_ARCHIVE objects and the job's
  ``[jobs.NAME.drill] thaw`` is false: the plan says what thawing would take and cost;
* it is a sealed store and this host holds no identity that opens it.

A source that cannot restore anything (its host or store cannot be listed, no snapshot has
a restore path) is a problem (``SourcePlan.problem``): that drill fails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from zrepl_py.catalog.rows import LIVING_STATES
from zrepl_py.errors import RestoreError, UsageError
from zrepl_py.objects.manifest import CarriedSnapshot
from zrepl_py.restore.facts import Listing, RestoreFacts
from zrepl_py.restore.plan import RestorePlan, plan_restore
from zrepl_py.restore.thaw import ThawEstimate

STORE, REPLICA = "store", "replica"


@dataclasses.dataclass(frozen=True)
class SourceFacts:
    """One source of a job's drill, as gathered.

    Attributes:
        label: the store's name, or the replica target as the config writes it
            (``HOST:POOL/PATH``): what ``--from`` takes and the drill is recorded under.
        kind: ``store`` or ``replica``.
        host: the host the source's copies are restored on (the scratch's host): the
            ``[restore] scratch`` host for a store, the target's host for a replica.
        scratch: the scratch dataset the drill creates there (``PARENT/zbak-drill-<hex>``),
            below which each dataset is restored; None only with a ``problem``.
        datasets: per source dataset, the restore facts with only this source in them and
            ``into`` a dataset below ``scratch``.
        problem: why the source cannot be drilled at all, else None.
        needs_identity: a sealed store: reading it needs an identity.
        identity: an identity that opens it is at hand.
    """

    label: str
    kind: str
    host: str
    scratch: str | None
    datasets: tuple[RestoreFacts, ...]
    problem: str | None = None
    needs_identity: bool = False
    identity: bool = False


@dataclasses.dataclass(frozen=True)
class DrillFacts:
    """Everything ``plan_drill`` decides from.

    Attributes:
        job: the ``[jobs.NAME]`` key.
        sources: one per source, stores first, each in name order.
        originals: per source dataset, its snapshots on the source host now (what the
            restored files are compared with); a dataset missing from it is gone.
        unreadable: why the source's datasets cannot be listed now (host down, dataset or
            pool gone), else None.
        thaw: ``[jobs.NAME.drill] thaw``.
    """

    job: str
    sources: tuple[SourceFacts, ...]
    originals: Mapping[str, Listing]
    unreadable: str | None
    thaw: bool


@dataclasses.dataclass(frozen=True)
class DrillItem:
    """One dataset of a source to restore and check.

    Attributes:
        dataset: the source dataset.
        plan: the restore into scratch.
        original: the same snapshot (by guid) on the source now, to compare files with;
            None when it is gone (only the guid is checked then).
        gone: why ``original`` is None.
    """

    dataset: str
    plan: RestorePlan
    original: CarriedSnapshot | None
    gone: str | None = None


@dataclasses.dataclass(frozen=True)
class SourcePlan:
    """What the drill does with one source.

    Attributes:
        label / kind / host / scratch: as in ``SourceFacts``.
        items: the datasets to restore, the job's dataset first (for a source skipped as
            cold: what it would restore).
        skip: why the source is not drilled by design (recorded ``skipped``), else None.
        problem: why it cannot be drilled (recorded ``failed``), else None.
        thaw: what thawing its cold objects takes (None when nothing is cold).
        datasets: how many datasets the source holds of the job.
    """

    label: str
    kind: str
    host: str
    scratch: str | None
    items: tuple[DrillItem, ...] = ()
    skip: str | None = None
    problem: str | None = None
    thaw: ThawEstimate | None = None
    datasets: int = 0


@dataclasses.dataclass(frozen=True)
class DrillPlan:
    """The drill of one job: one ``SourcePlan`` per source drilled."""

    job: str
    sources: tuple[SourcePlan, ...]


def thaw_text(thaw: ThawEstimate) -> str:
    """``thaw 3 object(s), 12.0 MB, tier Standard: about 5 h and $0.01``."""
    return (f"thaw {thaw.objects} object(s), {thaw.bytes / 1e6:.1f} MB, tier {thaw.tier}:"
            f" about {thaw.hours:g} h and ${thaw.cost_usd:.2f}")


def _sum(estimates: Sequence[ThawEstimate]) -> ThawEstimate | None:
    if not estimates:
        return None
    return ThawEstimate(sum(e.objects for e in estimates), sum(e.bytes for e in estimates),
                        max(e.hours for e in estimates),
                        round(sum(e.cost_usd for e in estimates), 4), estimates[0].tier)


def candidates(facts: RestoreFacts, kind: str) -> list[CarriedSnapshot]:
    """The snapshots the source may restore, newest (createtxg) first: those its living
    streams carry (a store), or the replica's."""
    if kind == REPLICA:
        return list(reversed([s for r in facts.replicas for s in r.snapshots]))
    found: dict[int, CarriedSnapshot] = {}
    for store in facts.stores:
        for stream in store.streams:
            if stream.state in LIVING_STATES:
                for snap in store.carried.get(stream.id, ()) or (
                        CarriedSnapshot(stream.to_name, stream.to_guid, stream.to_createtxg),):
                    found[snap.guid] = snap
    return sorted(found.values(), key=lambda s: s.createtxg, reverse=True)


def newest_plan(facts: RestoreFacts, kind: str) -> RestorePlan:
    """The restore plan of the newest snapshot ``facts``' one source can restore.

    Raises:
        RestoreError: none can (the message is the restore planner's for the newest).
    """
    forced = "archive" if kind == STORE else "replica"
    first: RestoreError | None = None
    for snap in candidates(facts, kind):
        try:
            return plan_restore(facts, f"@{snap.name}", forced)
        except RestoreError as exc:
            first = first or exc
    if first is not None:
        raise first
    raise RestoreError(f"it holds no snapshot of {facts.host}:{facts.dataset}")


def _original(facts: DrillFacts, dataset: str, target: CarriedSnapshot
              ) -> tuple[CarriedSnapshot | None, str | None]:
    if facts.unreadable is not None:
        return None, f"the source cannot be read ({facts.unreadable}): files not compared"
    listing = facts.originals.get(dataset)
    if listing is None:
        return None, f"{dataset} is gone from the source: its guid was checked, files not compared"
    for snap in listing.snapshots:
        if snap.guid == target.guid:
            return snap, None
    return None, (f"@{target.name} is gone from {listing.host}:{listing.dataset}: its guid was"
                  " checked, its files not compared")


def _source_plan(facts: DrillFacts, source: SourceFacts) -> SourcePlan:
    base = SourcePlan(source.label, source.kind, source.host, source.scratch,
                      datasets=len(source.datasets))
    if source.problem:
        return dataclasses.replace(base, problem=source.problem)
    if source.needs_identity and not source.identity:
        return dataclasses.replace(base, skip="no identity: this host holds no key that opens"
                                   f" store {source.label} (--identity FILE, or identity_file)")
    items, problems = [], []
    for restore in source.datasets:
        try:
            plan = newest_plan(restore, source.kind)
        except RestoreError as exc:
            problems.append(f"{restore.dataset}: {exc}")
            continue
        original, gone = _original(facts, restore.dataset, plan.target)
        items.append(DrillItem(restore.dataset, plan, original, gone))
    if problems:
        return dataclasses.replace(base, problem="; ".join(problems))
    thaw = _sum([i.plan.thaw for i in items if i.plan.thaw is not None])
    planned = dataclasses.replace(base, items=tuple(items), thaw=thaw)
    if thaw is not None and not facts.thaw:
        return dataclasses.replace(planned, skip=(
            f"cold: would {thaw_text(thaw)}; set [jobs.{facts.job}.drill] thaw = true to drill"
            " it"))
    return planned


def select_sources(job: str, sources: Sequence[SourceFacts], from_: str | None
                   ) -> tuple[SourceFacts, ...]:
    """The sources of job ``job`` that ``zbak drill --from FROM`` names: the one with that
    label, or the replicas on that host; all of them when ``from_`` is None. Checked before
    the source dataset is listed, so a wrong ``--from`` starts no process.

    Raises:
        UsageError: ``from_`` names no source of the job.
    """
    if from_ is None:
        return tuple(sources)
    chosen = tuple(s for s in sources
                   if from_ in (s.label, s.host if s.kind == REPLICA else None))
    if not chosen:
        known = ", ".join(s.label for s in sources) or "none"
        raise UsageError(f"--from {from_}: not a source of job {job} (sources: {known})")
    return chosen


def plan_drill(facts: DrillFacts) -> DrillPlan:
    """Plan the drill of ``facts.job`` (see the module docstring): every source in
    ``facts.sources`` (``select_sources`` chose them)."""
    return DrillPlan(facts.job, tuple(_source_plan(facts, s) for s in facts.sources))
