"""The failover and failback planners (PURE: docs/style.md#planners-are-pure-and-drivers-are-thin).

Both take plain facts (``facts`` lists them: snapshots with guids and createtxg, a few
properties, the marks of ``values.failover``) and return a plan the command prints before
anything changes; the drivers (``failover.failover``, ``failover.failback``) carry it out
and, after a crash, list again and plan again: every plan starts from what the datasets
say, so a rerun picks up where a killed run stopped (docs/design.md#failover-and-failback-orders).

Failover (``plan_failover``), per replica dataset, parents first: the mark first (from then
on replication refuses the dataset), the hold on its newest snapshot (the way back), then
``readonly=off``, the mountpoint, ``canmount=on`` and the mount. The mountpoint is the
job's ``failover_mountpoint`` for the root, else the source's mountpoint replication
recorded (``mark.MOUNTPOINT_PROPERTY``); a child keeps inheriting from its parent unless
its source had a mountpoint of its own. A dataset already in its failed-over state needs
nothing (a rerun only finishes what is missing).

Failback (``plan_failback``): the replica is the one to keep. For each replica dataset the
newest snapshot whose guid the source dataset has (``common``) is the base of a ``zfs send
-I`` from the replica. What the source wrote after it is kept, never destroyed
(docs/decisions.md#failback-keeps-the-source-aside-by-rename-and-clone): when any source
dataset of the tree has snapshots after its common one, was written since it (``written``,
or unknown on a ZFS without that property while mounted), or has no common snapshot at
all, the source's root is renamed to ``mark.kept_name`` (its whole tree goes with it) and
each replica dataset's source is made again as a clone of the kept dataset's common
snapshot, promoted, so it owns every snapshot up to the common one and receives the
replica's later ones; a source dataset the replica does not have goes back to its place.
Without that, the source receives directly (a source whose ``written`` is unknown and that
is not mounted is tried directly: if ``zfs receive`` finds it modified, the driver plans
again with it known as modified). No common snapshot anywhere, or an empty source pool:
the plan offers the full resend (``--full``). A dataset that exists on the replica only
(made there after the failover) is sent whole without asking.

Version check: a replica dataset whose ZPL version is above what the source's pool writes,
that is encrypted where the source's pool has no encryption, or that uses large dnodes
where the source's pool cannot take them, is named as a blocker before anything changes:
zfs-fuse (pool version 23, ZPL 4) cannot receive what OpenZFS upgraded or created.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence

from zrepl_py.errors import InvalidName
from zrepl_py.values.failover import FailoverMark, SourceMark, kept_name
from zrepl_py.zfs.names import DatasetName, SnapshotName
from zrepl_py.zfs.steps import SnapRef

# -- facts -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReplicaState:
    """One replica dataset as the target host lists it.

    Attributes:
        name: the dataset.
        kind: ``"filesystem"`` or ``"volume"``.
        snapshots: its snapshots, oldest first by createtxg.
        mark: its ``zbak:failover`` mark, None when it has none.
        readonly: ``readonly`` is on.
        mountpoint: the ``mountpoint`` value (``-`` for a volume).
        mountpoint_local: the mountpoint is set on it (not inherited).
        canmount: the ``canmount`` value (``-`` for a volume).
        mounted: it is mounted.
        source_mountpoint: ``zbak:source-mountpoint`` set on it (not inherited), None when
            replication recorded none here.
        written: bytes written since its newest snapshot; None where the ZFS has no
            ``written`` property (zfs-fuse).
        zpl_version: its ZPL ``version`` (None: unknown, or a volume).
        encrypted: ``encryption`` is not ``off``.
        large_dnodes: ``dnodesize`` is not ``legacy``.
    """

    name: DatasetName
    kind: str
    snapshots: tuple[SnapRef, ...] = ()
    mark: FailoverMark | None = None
    readonly: bool = True
    mountpoint: str = "-"
    mountpoint_local: bool = False
    canmount: str = "noauto"
    mounted: bool = False
    source_mountpoint: str | None = None
    written: int | None = None
    zpl_version: int | None = None
    encrypted: bool = False
    large_dnodes: bool = False

    @property
    def filesystem(self) -> bool:
        """A filesystem (it has a mountpoint), not a volume."""
        return self.kind == "filesystem"


@dataclasses.dataclass(frozen=True)
class SourceState:
    """One dataset on the source side, where it is now: at its own name, or (after a
    failback renamed the tree) in the kept tree.

    Attributes:
        name: the dataset.
        kind: ``"filesystem"`` or ``"volume"``.
        snapshots: its snapshots, oldest first by createtxg.
        origin: the snapshot it was cloned from, None when it is no clone.
        mark: its ``zbak:failover-source`` mark, None when it has none.
        readonly: ``readonly`` is on; None when its ZFS cannot tell (zfs-fuse, mounted:
            ``facts.readonly_values``).
        readonly_local: ``readonly`` set on it (``"on"``/``"off"``), None when inherited.
        mounted: it is mounted.
        written: bytes written since its newest snapshot, None when unknown.
    """

    name: DatasetName
    kind: str = "filesystem"
    snapshots: tuple[SnapRef, ...] = ()
    origin: SnapshotName | None = None
    mark: SourceMark | None = None
    readonly: bool | None = False
    readonly_local: str | None = None
    mounted: bool = False
    written: int | None = None


@dataclasses.dataclass(frozen=True)
class ReceiverLimits:
    """What the source's pool can receive (for the version check).

    Attributes:
        zpl_version: the newest ZPL version its ZFS writes (its root dataset's ``version``);
            None when unknown (nothing is checked).
        encryption: ``feature@encryption`` is enabled.
        large_dnode: ``feature@large_dnode`` is enabled.
    """

    zpl_version: int | None = None
    encryption: bool = False
    large_dnode: bool = False


@dataclasses.dataclass(frozen=True)
class FailoverFacts:
    """What ``plan_failover`` reads.

    Attributes:
        job: the job's name; target: the target as the config writes it.
        replica_root: the job's target dataset.
        replicas: every dataset below it, parents first (empty: it does not exist).
        now: aware UTC (the mark's time when the root has none yet).
        planned: ``--planned``.
        failover_mountpoint: ``[jobs.NAME.replicate] failover_mountpoint``, None unset.
    """

    job: str
    target: str
    replica_root: DatasetName
    replicas: tuple[ReplicaState, ...]
    now: dt.datetime
    planned: bool = False
    failover_mountpoint: str | None = None


@dataclasses.dataclass(frozen=True)
class FailbackFacts:
    """What ``plan_failback`` reads.

    Attributes:
        job, target: as ``FailoverFacts``.
        replica_root / source_root: the job's target dataset and source dataset.
        replicas: every replica dataset, parents first.
        sources: the datasets at or below ``source_root`` now, by their path below it
            (``""`` for the root); empty when it does not exist.
        kept: the datasets at or below the kept root (``mark.kept_name`` of the source
            root) now, by their path below it; empty when there is none.
        source_pool: the source's pool exists.
        receiver: what the source's pool can receive.
        full: ``--full``: a dataset without a common snapshot may be sent whole.
        modified: paths of source datasets ``zfs receive`` found written since their
            newest snapshot in this run (the driver plans again with them).
    """

    job: str
    target: str
    replica_root: DatasetName
    source_root: DatasetName
    replicas: tuple[ReplicaState, ...]
    sources: Mapping[str, SourceState]
    kept: Mapping[str, SourceState] = dataclasses.field(default_factory=dict)
    source_pool: bool = True
    receiver: ReceiverLimits = ReceiverLimits()
    full: bool = False
    modified: frozenset[str] = frozenset()


# -- failover ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Promotion:
    """What promoting one replica dataset still needs (every field False/None: nothing).

    Attributes:
        dataset: the replica dataset.
        mark: its mark (the one it has, or the one to set).
        set_mark: the mark is to be set.
        hold: ``mark.base`` is to be held (zfs answers "tag already exists" when it is:
            that counts as done).
        readonly_off: ``readonly=off`` is to be set.
        mountpoint: the mountpoint to set, None to leave it.
        canmount_on: ``canmount=on`` is to be set.
        mount: it is to be mounted.
        where: where it will be mounted and why, for the plan.
    """

    dataset: DatasetName
    mark: FailoverMark
    set_mark: bool
    hold: bool
    readonly_off: bool
    mountpoint: str | None
    canmount_on: bool
    mount: bool
    where: str

    @property
    def done(self) -> bool:
        """Nothing is left to do for this dataset."""
        return not (self.set_mark or self.readonly_off or self.mountpoint is not None
                    or self.canmount_on or self.mount)


@dataclasses.dataclass(frozen=True)
class FailoverPlan:
    """A failover of one job's target.

    Attributes:
        job, target, replica_root: as ``FailoverFacts``.
        mark: the root's mark (its ``at`` is the failover's time).
        promotions: one per replica dataset, parents first.
        problems: why it cannot go on (nothing is changed then).
        notes: what the admin should know (no recorded mountpoint, ...).
    """

    job: str
    target: str
    replica_root: DatasetName
    mark: FailoverMark
    promotions: tuple[Promotion, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        """Every dataset is failed over already."""
        return all(p.done for p in self.promotions)


def _parent_rel(rel: str) -> str | None:
    return None if not rel else (rel.rsplit("/", 1)[0] if "/" in rel else "")


def _mountpoints(facts: FailoverFacts) -> dict[DatasetName, tuple[str | None, str]]:
    """Per replica dataset: the mountpoint to give it (None: inherit) and why."""
    found: dict[DatasetName, tuple[str | None, str]] = {}
    for replica in facts.replicas:
        rel = replica.name.relative_to(facts.replica_root)
        if not rel:
            if facts.failover_mountpoint is not None:
                found[replica.name] = (facts.failover_mountpoint, "failover_mountpoint")
            elif replica.source_mountpoint is not None:
                found[replica.name] = (replica.source_mountpoint,
                                       "the source's, recorded at the last replication")
            else:
                found[replica.name] = (None, "inherited: no source mountpoint was recorded "
                                             "(set failover_mountpoint)")
        elif replica.source_mountpoint is not None:
            found[replica.name] = (replica.source_mountpoint, "the source's own")
        else:
            found[replica.name] = (None, "inherited from its parent, as on the source")
    return found


def plan_failover(facts: FailoverFacts) -> FailoverPlan:
    """Plan making the replica live (see the module doc).

    Returns:
        the plan; ``problems`` non-empty means nothing may be changed.
    """
    root = next((r for r in facts.replicas if r.name == facts.replica_root), None)
    mark = root.mark if root is not None and root.mark is not None else FailoverMark(
        facts.now, facts.job, facts.planned,
        root.snapshots[-1].name if root is not None and root.snapshots else None)
    problems = []
    if root is None:
        problems.append(f"{facts.target}: {facts.replica_root} does not exist: there is no "
                        "replica to fail over to")
    for replica in facts.replicas:
        if replica.mark is not None and replica.mark.job != facts.job:
            problems.append(f"{replica.name} was failed over by job {replica.mark.job} at "
                            f"{replica.mark.at:%Y-%m-%d %H:%M:%SZ}, not by {facts.job}")
    wanted = _mountpoints(facts)
    finals: dict[str, str] = {}
    promotions = []
    notes = []
    for replica in facts.replicas:
        own = replica.mark or dataclasses.replace(
            mark, base=replica.snapshots[-1].name if replica.snapshots else None)
        mountpoint, why = wanted[replica.name]
        change = None
        if replica.filesystem and mountpoint is not None and (
                replica.mountpoint != mountpoint or not replica.mountpoint_local):
            change = mountpoint
        final = mountpoint or replica.mountpoint
        parent, _, leaf = str(replica.name).rpartition("/")
        if mountpoint is None and not replica.mountpoint_local \
                and finals.get(parent, "").startswith("/"):
            final = f"{finals[parent]}/{leaf}"  # where it lands once its parent moved
        finals[str(replica.name)] = final
        mounts = replica.filesystem and final.startswith("/")
        where = f"mounted at {final} ({why})" if mounts else (
            f"mountpoint {final} ({why}): not mounted" if replica.filesystem else "a volume")
        promotions.append(Promotion(
            dataset=replica.name, mark=own, set_mark=replica.mark is None,
            hold=replica.mark is None and own.base is not None,
            readonly_off=replica.readonly, mountpoint=change,
            canmount_on=replica.filesystem and replica.canmount != "on",
            mount=mounts and (not replica.mounted or change is not None), where=where))
        if replica.name == facts.replica_root and mountpoint is None:
            notes.append(f"{replica.name}: {why}")
    return FailoverPlan(facts.job, facts.target, facts.replica_root, mark, tuple(promotions),
                        tuple(problems), tuple(notes))


def caught_up(source: Sequence[tuple[DatasetName, tuple[SnapRef, ...]]],
              replicas: Sequence[ReplicaState], source_root: DatasetName,
              replica_root: DatasetName) -> list[str]:
    """What a planned failover would lose: each source dataset whose newest snapshot (by
    guid) is not on its replica, or that has no replica ([] when nothing).

    Args:
        source: the job's source datasets and their snapshots, after the last incremental.
        replicas: the replica datasets.
    """
    by_name = {r.name: r for r in replicas}
    missing = []
    for dataset, snaps in source:
        replica = by_name.get(replica_root.child(dataset.relative_to(source_root)))
        if not snaps:
            continue
        if replica is None:
            missing.append(f"{dataset} has no replica on the target")
        elif snaps[-1].guid not in {s.guid for s in replica.snapshots}:
            missing.append(f"{dataset}@{snaps[-1].name} is not on {replica.name}")
    return missing


# -- failback ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DatasetBack:
    """What failing back one replica dataset does.

    Attributes:
        replica: the replica dataset (the one whose contents win).
        source: the source dataset it goes back to.
        rel: its path below the roots (``""`` for the root).
        common: the newest replica snapshot the source side has by guid (as the replica
            lists it), None when there is none.
        action: ``"receive"`` (the source dataset receives the replica's later snapshots),
            ``"clone"`` (the source dataset is made again as a clone of ``kept_as@common``,
            promoted, then receives), ``"promote"`` (that clone exists: promote it, then
            receive), ``"full"`` (the source dataset is created by a full stream) or
            ``"done"`` (nothing to send: only the last steps remain).
        kept_as: where the source dataset as it was is kept (None: nothing kept).
        why: the reason, for the plan.
        freeze: the source dataset is to be marked and made read-only before it receives.
        mark: the ``SourceMark`` it carries (or is to get) while not live; None for a
            dataset a full stream creates (marked once it exists).
        clone_from: for ``"clone"``, the kept snapshot (with ``common``'s guid) to clone.
    """

    replica: DatasetName
    source: DatasetName
    rel: str
    common: SnapRef | None
    action: str
    kept_as: DatasetName | None
    why: str
    freeze: bool = False
    mark: SourceMark | None = None
    clone_from: SnapshotName | None = None


@dataclasses.dataclass(frozen=True)
class FailbackPlan:
    """A failback of one job's target.

    Attributes:
        job, target, replica_root, source_root: as ``FailbackFacts``.
        mark: the replica root's failover mark (None: the replica was released already;
            only the source's last steps remain).
        datasets: one per replica dataset still to fail back, parents first.
        kept_root: where the source's tree is kept (renamed), None when nothing is.
        kept_because: why it is kept (the writes the replica lacks, per dataset).
        rename: the source root is still to be renamed to ``kept_root``.
        back: paths of source datasets the replica does not have, to be renamed from the
            kept tree back to their place (they are the source's own, in no conflict).
        blockers: why it cannot go on (nothing is changed then).
        needs_full: a dataset has no common snapshot; only ``--full`` sends it whole.
        finishing: the replica is released already: only the source is made live.
        versions: the version check as the plan says it (what the replica's datasets are,
            what the source's pool takes); "" where nothing was known to check.
    """

    job: str
    target: str
    replica_root: DatasetName
    source_root: DatasetName
    mark: FailoverMark | None
    datasets: tuple[DatasetBack, ...]
    kept_root: DatasetName | None = None
    kept_because: tuple[str, ...] = ()
    rename: bool = False
    back: tuple[str, ...] = ()
    blockers: tuple[str, ...] = ()
    needs_full: bool = False
    finishing: bool = False
    versions: str = ""


def _common(replica: ReplicaState, side: SourceState | None) -> SnapRef | None:
    if side is None:
        return None
    guids = {s.guid for s in side.snapshots}
    return next((s for s in reversed(replica.snapshots) if s.guid in guids), None)


def _dirty(side: SourceState, common: SnapRef | None, rel: str,
           modified: frozenset[str]) -> str | None:
    """Why ``side`` holds writes after ``common`` that the replica lacks (None: none known).

    A dataset zbak froze itself (a planned failover's source, a failback's earlier run: it
    carries the mark and is read-only, or its ZFS cannot tell) is trusted read-only since;
    an unknown ``written`` of another one that is mounted counts as written (the safe side),
    of one that is not mounted is left to ``zfs receive``."""
    if common is None:
        return f"{side.name} has no snapshot in common with the replica"
    guids = [s.guid for s in side.snapshots]
    if common.guid in guids and guids.index(common.guid) < len(guids) - 1:
        later = side.snapshots[guids.index(common.guid) + 1:]
        shown = ", ".join(f"@{s.name}" for s in later[:3]) + (" ..." if len(later) > 3 else "")
        return f"{side.name} has {len(later)} snapshot(s) after @{common.name}: {shown}"
    if rel in modified:
        return f"zfs receive found {side.name} written since @{common.name}"
    if side.written:
        return f"{side.name} was written since @{common.name} ({side.written} bytes)"
    frozen = side.mark is not None and side.readonly is not False
    if side.written is None and side.mounted and not frozen:
        return (f"{side.name} is mounted and may have been written since @{common.name} "
                "(this zfs has no 'written' property to tell)")
    return None


def _limits(replica: ReplicaState, receiver: ReceiverLimits, host_text: str) -> list[str]:
    found = []
    if receiver.zpl_version is not None and replica.zpl_version is not None \
            and replica.zpl_version > receiver.zpl_version:
        found.append(f"{replica.name} has ZPL version {replica.zpl_version} (created or "
                     f"upgraded on the replica's newer ZFS); the source's pool {host_text} "
                     f"writes at most version {receiver.zpl_version} and cannot receive it")
    if replica.encrypted and not receiver.encryption:
        found.append(f"{replica.name} is encrypted; the source's pool {host_text} has no "
                     "encryption feature to receive it")
    if replica.large_dnodes and not receiver.large_dnode:
        found.append(f"{replica.name} uses large dnodes (dnodesize is not legacy); the "
                     f"source's pool {host_text} has no large_dnode feature to receive them")
    return found


def _versions(replicas: Sequence[ReplicaState], receiver: ReceiverLimits, pool: str) -> str:
    """The version check in words: the replica's ZPL versions against the newest the
    source's pool writes (zfs-fuse's pool v23 writes ZPL 4, OpenZFS 2.x ZPL 5)."""
    found = sorted({r.zpl_version for r in replicas if r.zpl_version is not None})
    if not found or receiver.zpl_version is None:
        return ""
    fits = found[-1] <= receiver.zpl_version
    return (f"version check: the replica's datasets are ZPL version "
            f"{', '.join(map(str, found))}; the source's pool {pool} writes up to version "
            f"{receiver.zpl_version}: " + ("it can receive them" if fits else
                                           "it cannot receive the newer ones (blockers)"))


def _clone_mark(kept: SourceState, now_mark: FailoverMark) -> SourceMark:
    """The mark of a clone made from ``kept``: its own readonly to put back (the one it had
    before zbak froze it, when it carries a mark)."""
    own = kept.mark.readonly if kept.mark is not None else kept.readonly_local
    return SourceMark(now_mark.at, now_mark.job, own)


def plan_failback(facts: FailbackFacts, *, now: dt.datetime) -> FailbackPlan:
    """Plan bringing the source back from the replica (see the module doc).

    Args:
        facts: the listings.
        now: aware UTC; the time of marks set when the replica carries none (finishing).

    Returns:
        the plan; ``blockers`` non-empty means nothing may be changed.
    """
    root = next((r for r in facts.replicas if r.name == facts.replica_root), None)
    mark = root.mark if root is not None else None
    base_mark = mark or FailoverMark(now, facts.job)
    blockers: list[str] = []
    for replica in facts.replicas:
        if replica.mark is not None and replica.mark.job != facts.job:
            blockers.append(f"{replica.name} was failed over by job {replica.mark.job}, "
                            f"not by {facts.job}")
    source_root_state = facts.sources.get("")
    finishing = mark is None
    if finishing:
        # The replica was released: a failback got that far; what is left is the source.
        marked = [(rel, s) for rel, s in sorted(facts.sources.items()) if s.mark is not None]
        finish = tuple(DatasetBack(
            facts.replica_root.child(rel), s.name, rel, None, "done", None,
            "the replica is a replica again; the source goes live", mark=s.mark)
            for rel, s in marked)
        return FailbackPlan(facts.job, facts.target, facts.replica_root, facts.source_root,
                            None, finish, blockers=tuple(blockers), finishing=True)
    if not facts.source_pool:
        blockers.append(f"the source's pool {facts.source_root.pool} does not exist: import "
                        "it, or create it and run with --full to send everything again")
    in_scope = [r for r in facts.replicas if _in_scope(facts, r)]
    kept_root = None
    try:
        kept_root = kept_name(facts.source_root, base_mark)
    except InvalidName as exc:  # a pool's root dataset
        kept_error = str(exc)
    else:
        kept_error = ""
    # The keep decision is the tree's: renamed once, every dataset cloned back.
    reasons = []
    for replica in in_scope:
        rel = replica.name.relative_to(facts.replica_root)
        side = facts.sources.get(rel)
        if side is None or facts.kept:
            continue
        why = _dirty(side, _common(replica, side), rel, facts.modified)
        if why is not None:
            reasons.append(why)
    keep = bool(facts.kept) or bool(reasons)
    if keep and kept_root is None:
        blockers.append(kept_error)
    rename = keep and not facts.kept and source_root_state is not None
    # After the rename every source dataset lives in the kept tree.
    sources = {} if rename else dict(facts.sources)
    kept = dict(facts.sources) if rename else dict(facts.kept)
    datasets: list[DatasetBack] = []
    needs_full = False
    full_tree = source_root_state is None and not facts.kept
    for replica in in_scope:
        rel = replica.name.relative_to(facts.replica_root)
        target = facts.source_root.child(rel)
        blockers += _limits(replica, facts.receiver, f"({facts.source_root.pool})")
        side, aside = sources.get(rel), kept.get(rel)
        kept_as = kept_root.child(rel) if kept_root is not None and aside is not None else None
        if side is not None:
            common = _common(replica, side)
            if side.origin is not None and kept_as is not None \
                    and side.origin.dataset == kept_as:
                datasets.append(DatasetBack(replica.name, target, rel, _common(replica, aside),
                                            "promote", kept_as, "its clone is made: promote "
                                            "it, then receive", mark=side.mark))
                continue
            if common is None:
                # Only under a kept tree can a dataset at its own name lack a common
                # snapshot here: a full stream made it, then the run stopped.
                blockers.append(f"{target} has no snapshot in common with {replica.name}: "
                                "rename or destroy it by hand, then run zbak failback again")
                continue
            up_to_date = common.guid == (replica.snapshots[-1].guid if replica.snapshots
                                         else None) and replica.readonly
            freeze = side.mark is None or side.readonly is not True
            mark_to = side.mark or SourceMark(base_mark.at, facts.job, side.readonly_local)
            datasets.append(DatasetBack(
                replica.name, target, rel, common, "receive", kept_as,
                f"{target} has @{common.name}" + (", the replica's newest" if up_to_date
                                                  else ": receives what came after"),
                freeze=freeze, mark=mark_to))
            continue
        common = _common(replica, aside)
        if aside is not None and common is not None:
            origin = next(s for s in aside.snapshots if s.guid == common.guid)
            datasets.append(DatasetBack(replica.name, target, rel, common, "clone", kept_as,
                                        f"kept as {kept_as}; {target} is made again from its "
                                        f"@{origin.name}", mark=_clone_mark(aside, base_mark),
                                        clone_from=SnapshotName.of(kept_as or aside.name,
                                                                   origin.name)))
            continue
        counterpart = aside is not None or full_tree
        if counterpart:
            needs_full = True
            if not facts.full:
                what = (f"{facts.source_root} does not exist" if full_tree and aside is None
                        else f"{aside.name if aside else target} has no snapshot in common "
                             f"with {replica.name}")
                blockers.append(f"{what}: no incremental can bring it back. zbak failback "
                                f"{facts.job} --full sends {replica.name} whole again")
        datasets.append(DatasetBack(
            replica.name, target, rel, None, "full", kept_as,
            "made on the replica after the failover: sent whole" if not counterpart
            else "no common snapshot: sent whole (--full)"))
    back = tuple(sorted(
        rel for rel in kept
        if (kept_root is not None) and not _on_replica(facts, rel)
        and _parent_rel(rel) is not None and _on_replica(facts, _parent_rel(rel) or "")))
    return FailbackPlan(
        facts.job, facts.target, facts.replica_root, facts.source_root, mark, tuple(datasets),
        kept_root=kept_root if keep else None, kept_because=tuple(reasons), rename=rename,
        back=back if keep else (),
        blockers=tuple(dict.fromkeys(blockers)), needs_full=needs_full,
        versions=_versions(in_scope, facts.receiver, facts.source_root.pool))


def _in_scope(facts: FailbackFacts, replica: ReplicaState) -> bool:
    """Whether ``replica`` fails back: it carries the mark, its source dataset does (a run
    released it already), or it has no mark and was made on the live replica after the
    failover (the failover marked every dataset there was): it has no source dataset
    anywhere, or every snapshot of it is newer than the failover, so a source dataset of
    that name holds what a killed run's full stream of it made (or the source's own, which
    has no snapshot in common with it and is kept aside: ``_dirty``;
    docs/decisions.md#a-dataset-made-on-the-live-replica-is-known-by-its-snapshots)."""
    rel = replica.name.relative_to(facts.replica_root)
    side = facts.sources.get(rel)
    if replica.mark is not None or (side is not None and side.mark is not None):
        return True
    return bool(rel) and ((side is None and rel not in facts.kept)
                          or _made_after_failover(facts, replica))


def _made_after_failover(facts: FailbackFacts, replica: ReplicaState) -> bool:
    """``replica``'s oldest snapshot is newer (createtxg, one pool's counter) than the
    replica root's snapshot that was newest at the failover (its mark's ``base``)."""
    root = next((r for r in facts.replicas if r.name == facts.replica_root), None)
    if root is None or root.mark is None or root.mark.base is None or not replica.snapshots:
        return False
    base = next((s for s in root.snapshots if s.name == root.mark.base), None)
    return base is not None and replica.snapshots[0].createtxg > base.createtxg


def _on_replica(facts: FailbackFacts, rel: str) -> bool:
    return any(r.name.relative_to(facts.replica_root) == rel for r in facts.replicas)
