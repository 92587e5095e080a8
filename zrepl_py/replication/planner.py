"""The replication planner: source and target snapshots (+ a resume token) -> send steps.

PURE (docs/style.md#planners-are-pure-and-drivers-are-thin): frozen dataclasses in, a ``Plan`` out;
the driver lists both sides, describes the target's resume token on the source
(``zfs.resume.describe_token``), calls ``plan_replication`` and runs the steps in order. Rules
(docs/design.md#replication, docs/reliability.md#r3-stale-token,
docs/reliability.md#r4-token-for-another-operation-is-rejected,
docs/reliability.md#r21-replication-safety-in-pruning):

- What is common is decided by guid, never by name: the common snapshot is the newest target
  snapshot (by the target's createtxg) whose guid is a source snapshot or source bookmark
  (a bookmark keeps its snapshot's guid, zfs-bookmark(8)).
- A resume token is used only if its ``toname`` is in the source dataset, its ``toguid`` is a
  current source snapshot, its ``rawok`` flag matches the source's encryption (zbak sends
  encrypted datasets raw and others not), its base is the common snapshot (a full-stream
  token only when the target has no snapshot at all), and the target has nothing newer than
  that base. Then: ``Resume``, followed by an ``Incremental`` to the newest source snapshot
  if there are newer ones. Otherwise the plan starts with ``AbortResume(reason)``
  (``zfs receive -A``) and continues as if there had been no token, so a stale token is
  dropped once and never retried in a loop (docs/reliability.md#r3-stale-token).
- Aborting an interrupted *full* receive destroys the partially received dataset (zfs_main.c
  ``zfs_do_receive -A``: without a ``%recv`` child it destroys the inconsistent dataset
  itself), so the plan then continues as for a missing target.
- Target missing: ``Full`` of the oldest source snapshot, then ``Incremental`` (``-I``) to the
  newest.
- Target exists without a common snapshot: diverged. A full stream is never planned over an
  existing dataset (no ``zfs receive -F``, ever).
- Target snapshots newer than the common one: diverged, naming them. With
  ``on_divergence="rollback"`` the plan is ``Rollback(common, destroy=those)``, then the
  sends, unless one of them is ``foreign`` (zbak never destroys target snapshots it did not
  create): then it stays diverged and says why.
- A snapshot to be sent whose name the target already has under another guid (the source
  snapshot was destroyed and re-created under the same name): diverged, naming both guids,
  since ``zfs receive`` would refuse it ("destination already exists") on every run. A
  target snapshot newer than the common one that the rollback destroys does not count.
- A diverged plan has no steps: nothing on the target is touched, not even a stale token.
- Common only as a bookmark on the source (its snapshot was pruned): ``zfs send -i`` from the
  bookmark to the next source snapshot (``-I`` does not take a bookmark), then ``-I`` on.
- The common snapshot is the newest source snapshot: up to date, no steps.
- The source has no snapshots: nothing to do and nothing wrong; ``note`` says so.
- A snapshot filter (``sendable``: the guids of the source snapshots the target's
  ``snapshot_filter`` lets through) chooses what is SENT, never the base: the common
  snapshot (which carries the hold and the cursor), a resume token's snapshot and the
  bookmark base are used whatever the filter says. ``-I`` would bring every snapshot
  between its ends, so it spans only runs of admitted snapshots; across an excluded one the
  plan sends ``-i`` from the last admitted snapshot to the next (syncoid's
  ``--exclude-snaps``). The first full is the oldest admitted snapshot. A filter cannot
  remove what the target has already, nor add a snapshot older than the common one (zfs
  receives only newer ones).

Target writes made after the common snapshot without a new snapshot are invisible to
listings; ``zfs receive`` (without ``-F``) refuses such a target and the driver reports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Literal, Protocol, TypeVar

from zrepl_py.zfs.resume import ResumeToken
from zrepl_py.zfs.steps import (
    AbortResume,
    BookmarkRef,
    Full,
    Incremental,
    Resume,
    Rollback,
    SnapRef,
    Step,
)

__all__ = [
    "Plan",
    "ResumeToken",
    "SourceState",
    "TargetState",
    "plan_replication",
]

NO_COMMON = "target has no snapshot in common with the source: refusing to overwrite it"
NO_SOURCE_SNAPSHOTS = "the source has no snapshots yet: nothing to replicate"
NOTHING_ADMITTED = "the target's snapshot_filter admits none of the source's snapshots"


@dataclasses.dataclass(frozen=True)
class SourceState:
    """The source dataset as listed now.

    Attributes:
        dataset: its full name.
        snapshots: its snapshots (sorted by createtxg here, whatever order is given).
        bookmarks: its bookmarks (empty where the host has none).
        encrypted: the dataset is encrypted (it is then sent raw; see ``sendrecv.send_argv``).
    """

    dataset: str
    snapshots: tuple[SnapRef, ...]
    bookmarks: tuple[BookmarkRef, ...] = ()
    encrypted: bool = False


@dataclasses.dataclass(frozen=True)
class TargetState:
    """The target dataset as listed now.

    Attributes:
        dataset: its full name on the target host.
        exists: it is listed (a partially received new dataset is listed too).
        snapshots: its snapshots (sorted by createtxg here).
        resume_token: its described ``receive_resume_token``, None when there is none.
        foreign: short names of target snapshots zbak did not create; never destroyed.

    Raises:
        ValueError: a resume token on a target that does not exist.
    """

    dataset: str
    exists: bool
    snapshots: tuple[SnapRef, ...] = ()
    resume_token: ResumeToken | None = None
    foreign: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.resume_token is not None and not self.exists:
            raise ValueError(f"{self.dataset}: a resume token on a target that does not exist")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to do for one (source dataset, target dataset) pair.

    Attributes:
        steps: to run in order; empty when up to date, diverged or nothing to send.
        up_to_date: the target has the newest source snapshot and nothing to fix.
        diverged: why the target cannot be updated without destroying something (stop
            there); None otherwise.
        common: the newest common snapshot as the TARGET lists it (its createtxg is the
            target's), None when there is none.
        note: extra information for the log (e.g. the source has no snapshots).
    """

    steps: tuple[Step, ...]
    up_to_date: bool
    diverged: str | None
    common: SnapRef | None
    note: str | None = None


class _Ordered(Protocol):
    @property
    def createtxg(self) -> int: ...
    @property
    def guid(self) -> int: ...


_R = TypeVar("_R", bound=_Ordered)


def _by_txg(refs: Iterable[_R]) -> tuple[_R, ...]:
    return tuple(sorted(refs, key=lambda ref: (ref.createtxg, ref.guid)))


def _names(refs: Iterable[SnapRef]) -> str:
    return ", ".join(f"@{ref.name}" for ref in refs)


def _token_problem(
    token: ResumeToken,
    source: SourceState,
    source_snaps: dict[int, SnapRef],
    target: TargetState,
    common: SnapRef | None,
    newer: tuple[SnapRef, ...],
) -> str | None:
    """Why ``token`` must not be resumed, or None when it may (see the module doc)."""
    if token.dataset != source.dataset:
        return (f"the resume token is for {token.toname}, not for a snapshot of "
                f"{source.dataset}")  # fmt: skip
    if token.toguid not in source_snaps:
        return (f"the resume token's snapshot {token.toname} (guid {token.toguid}) "
                f"no longer exists on the source")  # fmt: skip
    if token.raw != source.encrypted:
        if source.encrypted:
            return "the resume token is for a non-raw stream but the source is encrypted (sent raw)"
        return "the resume token is for a raw stream but the source is not encrypted"
    if token.fromguid is None:
        if target.snapshots:
            return (f"the resume token is for a full stream but the target already has "
                    f"snapshots ({_names(_by_txg(target.snapshots)[-3:])})")  # fmt: skip
        return None
    if common is None or token.fromguid != common.guid:
        have = "no common snapshot" if common is None else (
            f"the common snapshot is @{common.name} (guid {common.guid})")
        return (f"the resume token's base (guid {token.fromguid}) is not the common snapshot: "
                f"{have}")  # fmt: skip
    if newer:
        return f"the target has snapshots newer than the resume token's base: {_names(newer)}"
    return None


def _sends_from(base: SnapRef | BookmarkRef, snaps: tuple[SnapRef, ...],
                sendable: frozenset[int] | None = None) -> list[Step]:
    """The incrementals from ``base`` (on the source) to the newest source snapshot that
    ``sendable`` admits (None: every one): ``-I`` over each run of admitted snapshots, ``-i``
    to the first of a run after an excluded one or from a bookmark."""
    later = [s for s in snaps if s.createtxg > base.createtxg]
    runs: list[list[SnapRef]] = [[]]
    for snap in later:
        if sendable is None or snap.guid in sendable:
            runs[-1].append(snap)
        elif runs[-1]:
            runs.append([])
    steps: list[Step] = []
    prev = base
    for run in (r for r in runs if r):
        if isinstance(prev, SnapRef) and run[0] is later[0]:
            steps.append(Incremental(prev, run[-1], intermediates=True))
        else:
            steps.append(Incremental(prev, run[0], intermediates=False))
            if run[-1] != run[0]:
                steps.append(Incremental(run[0], run[-1], intermediates=True))
        prev = run[-1]
    return steps


def plan_replication(
    source: SourceState,
    target: TargetState,
    *,
    on_divergence: Literal["stop", "rollback"] = "stop",
    sendable: frozenset[int] | None = None,
) -> Plan:
    """Plan how to bring ``target`` up to date with ``source`` (rules in the module doc).

    Args:
        source: the source dataset's snapshots and bookmarks.
        target: the target dataset's state, with its described resume token if any.
        on_divergence: ``"stop"`` (default) reports a diverged target; ``"rollback"`` plans
            destroying the target's newer snapshots (never foreign ones) and a rollback.
        sendable: guids of the source snapshots the target's snapshot filter admits; None
            admits every one.

    Returns:
        the Plan; ``diverged`` set means stop this target.

    Raises:
        ValueError: an unknown ``on_divergence``.
    """
    if on_divergence not in ("stop", "rollback"):
        raise ValueError(f"on_divergence must be 'stop' or 'rollback', not {on_divergence!r}")
    snaps = _by_txg(source.snapshots)
    target_snaps = _by_txg(target.snapshots) if target.exists else ()
    source_snaps = {s.guid: s for s in snaps}
    source_by_name = {s.name: s for s in snaps}
    source_marks = {b.guid: b for b in source.bookmarks}

    common = next(
        (t for t in reversed(target_snaps) if t.guid in source_snaps or t.guid in source_marks),
        None,
    )
    if not snaps:
        return Plan((), up_to_date=False, diverged=None, common=common, note=NO_SOURCE_SNAPSHOTS)
    newer = tuple(t for t in target_snaps if common is not None and t.createtxg > common.createtxg)

    token = target.resume_token
    problem = None
    exists = target.exists
    if token is not None:
        problem = _token_problem(token, source, source_snaps, target, common, newer)
        if problem is not None and token.fromguid is None and not target_snaps:
            exists = False  # zfs receive -A destroys a partially received new dataset
    resuming = token is not None and problem is None

    steps: list[Step] = []
    if token is not None and problem is not None:
        steps.append(AbortResume(problem))

    if exists and common is None and not resuming:
        why = (f"{NO_COMMON} ({target.dataset} has {len(target_snaps)} snapshot(s), none of "
               f"them is a snapshot or bookmark of {source.dataset} by guid: the snapshots "
               f"they had in common were destroyed, or it never was a replica of it). No "
               f"incremental can be sent; to start over with a full send, rename the target "
               f"(zfs rename {target.dataset} {target.dataset}.old) or destroy it, or point "
               f"the job at a new target dataset")  # fmt: skip
        return Plan((), up_to_date=False, diverged=why, common=None)
    if newer and common is not None:  # (newer snapshots are newer than a common one)
        why = (f"{target.dataset} has snapshots newer than the last common snapshot "
               f"@{common.name}: {_names(newer)}{_recreated(newer, source_by_name)}")  # fmt: skip
        foreign = [t for t in newer if t.name in target.foreign]
        if on_divergence == "stop":
            return Plan((), up_to_date=False, common=common, diverged=(
                f"{why}; set on_divergence = \"rollback\" to destroy them and roll back, "
                "or remove them by hand"))
        if foreign:
            return Plan((), up_to_date=False, common=common, diverged=(
                f"{why}; not rolling back: {_names(foreign)} not created by zbak (zbak never "
                "destroys target snapshots it did not create); remove or rename by hand"))
        steps.append(Rollback(common, destroy=tuple(t.name for t in reversed(newer))))

    admitted = [s for s in snaps if sendable is None or s.guid in sendable]
    if resuming and token is not None:
        to = source_snaps[token.toguid]
        steps.append(Resume(token, to))
        steps.extend(_sends_from(to, snaps, sendable))
    elif not exists and not admitted:
        return Plan(tuple(steps), up_to_date=False, diverged=None, common=common,
                    note=NOTHING_ADMITTED)
    elif not exists:
        steps.append(Full(admitted[0]))
        steps.extend(_sends_from(admitted[0], snaps, sendable))
    else:
        assert common is not None  # an existing target without one returned above
        base = source_snaps.get(common.guid) or source_marks[common.guid]
        steps.extend(_sends_from(base, snaps, sendable))
    kept = {t.name: t for t in target_snaps if t not in newer}  # newer: rolled back
    clashes = [(s, kept[s.name]) for s in _arriving(steps, snaps)
               if s.name in kept and kept[s.name].guid != s.guid]
    if clashes:
        return Plan((), up_to_date=False, common=common, diverged=_clash_text(target, clashes))
    return Plan(tuple(steps), up_to_date=not steps, diverged=None, common=common)


def _arriving(steps: list[Step], snaps: tuple[SnapRef, ...]) -> list[SnapRef]:
    """The source snapshots ``steps`` create on the target (``-I`` brings every one between
    its base and ``to``)."""
    arriving: list[SnapRef] = []
    for step in steps:
        if isinstance(step, (Full, Resume)) or (isinstance(step, Incremental)
                                                 and not step.intermediates):
            arriving.append(step.to)
        elif isinstance(step, Incremental):
            arriving += [s for s in snaps
                         if step.base.createtxg < s.createtxg <= step.to.createtxg]
    return arriving


def _recreated(newer: tuple[SnapRef, ...], source_by_name: dict[str, SnapRef]) -> str:
    """A note on target snapshots whose name the source reuses for another snapshot."""
    again = [t for t in newer if t.name in source_by_name and source_by_name[t.name].guid != t.guid]
    if not again:
        return ""
    return (f" ({_names(again)} on the source is another snapshot of the same name: it was "
            f"destroyed and re-created there, so the target's copy is stale)")


def _clash_text(target: TargetState, clashes: list[tuple[SnapRef, SnapRef]]) -> str:
    names = ", ".join(f"@{s.name} (source guid {s.guid}, target guid {t.guid})"
                      for s, t in clashes)
    first = clashes[0][0].name
    return (f"{target.dataset} already has {names}: a different snapshot of the same name, so "
            f"the source's was destroyed and re-created under that name and zfs receive "
            f"would refuse it (\"destination already exists\") on every run. Rename the stale "
            f"one on the target (zfs rename {target.dataset}@{first} "
            f"{target.dataset}@{first}-stale) or destroy it (zfs destroy "
            f"{target.dataset}@{first}), or rename the new one on the source")
