"""The snapshot prune planner: one dataset's snapshots + retention -> destroy list with reasons.

PURE (docs/style.md#planners-are-pure-and-drivers-are-thin): plain data in, a ``PrunePlan`` out; the
driver lists snapshots, gathers holds, clones and protections, calls ``plan_prune`` and destroys
``to_destroy`` one by one.

Safety rules (docs/design.md#snapshots, docs/reliability.md#r21-replication-safety-in-pruning) are
checked for every snapshot and every reason is recorded, not just the first, so ``--dry-run`` can
show all of them:

- a snapshot zbak did not make (not ``own``) is never pruned;
- a held snapshot (``userrefs > 0``) or one with dependent clones is kept: ``zfs destroy``
  would fail on it, and ``-R``/``-r`` is never issued;
- each outside ``protection`` keeps it (replication base or cursor, snapshot not yet
  replicated or uploaded, base of an open archive chain); callers supply these;
- the dataset's newest snapshot (highest ``createtxg``) is kept, so the next incremental
  always has a base;
- zbak's own snapshots are then kept by ``select_retained`` (computed over own snapshots only);
- anything else is destroyed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from zrepl_py.config.retention import Retention
from zrepl_py.pruning.rules import Dated, select_retained

NOT_OURS = "not a zbak snapshot (never pruned)"
NEWEST = "newest snapshot"
NOT_RETAINED = "not selected by retention"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One existing snapshot of the dataset being pruned.

    Attributes:
        name: full snapshot name ``DATASET@SHORT``.
        createtxg: ZFS ``createtxg``; decides order (higher = newer).
        guid: ZFS ``guid`` (carried through for the driver's destroy-time check).
        created: aware ZFS ``creation`` time; used only for retention buckets. Kept as given.
        own: True when zbak made it with this job's prefix (``naming.is_own``).
        userrefs: number of ``zfs hold`` tags on it.
        clones: names of clones whose origin it is.
        protections: reasons from outside that forbid destroying it, e.g.
            ``"replication base of nightly -> backup:pool/x"``, ``"base of open archive chain"``.

    Raises:
        ValueError: ``name`` does not have exactly one ``@`` with text on both sides,
            ``created`` is naive, or ``userrefs`` is negative.
    """

    name: str
    createtxg: int
    guid: int
    created: dt.datetime
    own: bool
    userrefs: int = 0
    clones: tuple[str, ...] = ()
    protections: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        dataset, sep, short = self.name.partition("@")
        if not sep or not dataset or not short or "@" in short:
            raise ValueError(f"{self.name!r} is not a snapshot name DATASET@SHORT")
        if self.created.tzinfo is None or self.created.utcoffset() is None:
            raise ValueError(f"{self.name}: created time is naive")
        if self.userrefs < 0:
            raise ValueError(f"{self.name}: userrefs {self.userrefs} is negative")

    @property
    def dataset(self) -> str:
        """The part of ``name`` before ``@``."""
        return self.name.partition("@")[0]


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the plan does with one candidate, and every reason why.

    Attributes:
        candidate: the snapshot.
        destroy: True to destroy it.
        reasons: all keep reasons when kept; ``("not selected by retention",)`` when destroyed.
    """

    candidate: Candidate
    destroy: bool
    reasons: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PrunePlan:
    """Decisions for every snapshot of one dataset, oldest first (ascending createtxg)."""

    decisions: tuple[Decision, ...]

    @property
    def to_destroy(self) -> tuple[Decision, ...]:
        """Decisions with ``destroy=True``, oldest first."""
        return tuple(d for d in self.decisions if d.destroy)

    @property
    def kept(self) -> tuple[Decision, ...]:
        """Decisions with ``destroy=False``, oldest first."""
        return tuple(d for d in self.decisions if not d.destroy)


def plan_prune(candidates: Sequence[Candidate], policy: Retention, now: dt.datetime) -> PrunePlan:
    """Decide, for every snapshot of one dataset, whether pruning destroys it (module doc rules).

    Args:
        candidates: all snapshots of ONE dataset, any order, own and foreign alike (foreign ones
            are needed to know which snapshot is the newest).
        policy: the retention for zbak's own snapshots.
        now: aware current time (for ``keep_within``).

    Returns:
        A plan with one decision per candidate, ordered by ascending createtxg.

    Raises:
        ValueError: candidates from more than one dataset, duplicate names or createtxgs,
            or a naive ``now``.
    """
    datasets = sorted({c.dataset for c in candidates})
    if len(datasets) > 1:
        raise ValueError(f"prune plans cover one dataset; got {', '.join(datasets)}")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError("a snapshot name is listed twice")
    txgs = [c.createtxg for c in candidates]
    if len(set(txgs)) != len(txgs):
        raise ValueError("two snapshots share a createtxg")

    ordered = sorted(candidates, key=lambda c: c.createtxg)
    retained = select_retained(
        [Dated(c.name, c.createtxg, c.created) for c in ordered if c.own], policy, now
    )
    newest = ordered[-1].name if ordered else None

    decisions = []
    for c in ordered:
        reasons: list[str] = []
        if not c.own:
            reasons.append(NOT_OURS)
        if c.userrefs > 0:
            reasons.append(f"held ({c.userrefs} user ref{'s' if c.userrefs != 1 else ''})")
        if c.clones:
            reasons.append(f"has dependent clones: {', '.join(c.clones)}")
        reasons.extend(c.protections)
        if c.name == newest:
            reasons.append(NEWEST)
        reasons.extend(retained.get(c.name, ()))
        if reasons:
            decisions.append(Decision(c, False, tuple(reasons)))
        else:
            decisions.append(Decision(c, True, (NOT_RETAINED,)))
    return PrunePlan(tuple(decisions))
