"""The floor of ``zbak serve`` (``--keep-newer-than``, ``--keep-last``): which snapshots the
backup host keeps whatever the master asks (pure; ``serve.guard`` runs it).

A compromised master holds zbak's key, so it can ask serve for anything the allow-list lets
through. With a floor, serve refuses to destroy a snapshot, or to roll back past one, that is

* younger than ``keep_newer_than`` by this host's clock, or
* among the newest ``keep_last`` snapshots of its dataset, in receive order.

What it trusts (``docs/decisions.md#the-serve-floor-trusts-the-replicas-own-witnesses``):
never a snapshot's ``creation``, which a received snapshot takes from the stream the master
wrote (zfs-receive(8)). Receive order is ``createtxg`` on this pool: the transaction group in
which this pool created the snapshot, assigned by the receiving pool and not by the stream.
Age is this host's own record: a journal of *witnesses* ``(time, pool, txg)`` that serve
appends after each receive, snapshot and floor check, each saying "at this time (this host's
clock), this pool had committed txg X", so every snapshot of the pool with createtxg <= X
existed then. A snapshot's age is ``now`` minus the earliest witness that covers it; one no
witness covers yet is young. A lost witness only makes snapshots look younger, never older.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Sequence
from pathlib import Path

from zrepl_py.drill.names import within
from zrepl_py.errors import CommandRefused
from zrepl_py.serve.options import parse

OWN_HOLD_PREFIX = "zbak:"
"""Start of every hold tag zbak places (``zfs.protect.hold_tag``)."""

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclasses.dataclass(frozen=True)
class Floor:
    """What ``zbak serve`` keeps whatever the master asks.

    Attributes:
        keep_newer_than: snapshots younger than this (by this host's witnesses) are kept;
            positive.
        keep_last: the newest N snapshots of each dataset (by createtxg) are kept; 0: none
            by count.
        journal: the witness journal file (``--floor-journal``), read and written by
            ``serve.journal``.
        label: ``keep_newer_than`` as the admin wrote it (``7d``), for messages.
    """

    keep_newer_than: dt.timedelta
    keep_last: int
    journal: Path
    label: str

    def __post_init__(self) -> None:
        if self.keep_newer_than <= dt.timedelta(0):
            raise ValueError("--keep-newer-than must be longer than 0")
        if self.keep_last < 0:
            raise ValueError("--keep-last cannot be negative")


@dataclasses.dataclass(frozen=True)
class Witness:
    """One journal line: at ``at`` (aware UTC, this host's clock) the pool whose root dataset
    has guid ``pool_guid`` had committed txg ``txg``. ``pool`` is its name then (shown only:
    a pool created again under the same name starts its txgs afresh, so witnesses are keyed
    by guid)."""

    at: dt.datetime
    pool_guid: int
    txg: int
    pool: str

    def line(self) -> str:
        """The journal line (tab-separated, newline-terminated)."""
        return f"{self.at.strftime(_TIME_FORMAT)}\t{self.pool_guid}\t{self.txg}\t{self.pool}\n"


@dataclasses.dataclass(frozen=True)
class Snap:
    """A snapshot as ``zfs list -H -o name,createtxg -t snapshot -s createtxg`` shows it."""

    name: str
    createtxg: int


@dataclasses.dataclass(frozen=True)
class FloorAction:
    """What the floor does around one approved request.

    Attributes:
        kind: ``"destroy"`` or ``"rollback"`` (checked before it runs, one at a time) or
            ``"creates"`` (a receive or snapshot: witnessed after it ran).
        target: the snapshot a destroy or rollback names; None for ``creates``.
        datasets: the datasets whose snapshots the request touches or creates.
    """

    kind: str
    target: str | None
    datasets: tuple[str, ...]


def parse_journal(text: str) -> list[Witness]:
    """The witnesses of a journal's text; a line that does not parse is skipped (a witness
    fewer only makes snapshots look younger)."""
    found = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 4:
            continue
        try:
            at = dt.datetime.strptime(fields[0], _TIME_FORMAT).replace(tzinfo=dt.UTC)
            found.append(Witness(at, int(fields[1]), int(fields[2]), fields[3]))
        except ValueError:
            continue
    return found


def worth_recording(witness: Witness, known: Iterable[Witness]) -> bool:
    """True when ``witness`` tells something ``known`` does not: a txg beyond every witness
    of its pool, at a time not before the last one (a clock set back would otherwise date
    snapshots too early: such a witness is dropped, which errs towards young)."""
    same = [w for w in known if w.pool_guid == witness.pool_guid]
    return not same or (witness.txg > max(w.txg for w in same)
                        and witness.at >= max(w.at for w in same))


def compacted(witnesses: Sequence[Witness], now: dt.datetime) -> list[Witness]:
    """Fewer witnesses that date no snapshot earlier: per pool, the last witness of each hour
    for the past 31 days and of each day before (a snapshot is then dated at most an hour,
    or a day, later than the full journal would date it; dropping witnesses never dates one
    earlier)."""
    recent = now - dt.timedelta(days=31)
    kept: dict[tuple[int, dt.datetime], Witness] = {}
    for w in sorted(witnesses, key=lambda w: (w.pool_guid, w.at, w.txg)):
        bucket = w.at.replace(minute=0, second=0, microsecond=0)
        if w.at < recent:
            bucket = bucket.replace(hour=0)
        kept[(w.pool_guid, bucket)] = w
    return sorted(kept.values(), key=lambda w: (w.at, w.pool_guid))


def first_seen(createtxg: int, pool_guid: int, witnesses: Iterable[Witness]) -> dt.datetime | None:
    """The earliest time a witness shows the pool past ``createtxg`` (the snapshot existed
    then), or None when no witness covers it yet."""
    times = [w.at for w in witnesses if w.pool_guid == pool_guid and w.txg >= createtxg]
    return min(times) if times else None


def why_kept(snap: Snap, snaps: Sequence[Snap], floor: Floor, pool_guid: int,
             witnesses: Sequence[Witness], now: dt.datetime) -> list[str]:
    """The floor's reasons to keep ``snap`` (empty: it may go).

    Args:
        snap: the snapshot asked about.
        snaps: every snapshot of its dataset (any order).
        floor: the rules.
        pool_guid: its pool's key in the journal.
        witnesses: the journal.
        now: this host's clock, aware UTC.
    """
    reasons = []
    seen = first_seen(snap.createtxg, pool_guid, witnesses)
    if seen is None:
        reasons.append("not yet witnessed by this host's floor journal (younger than "
                       f"{floor.label} as far as this host knows)")
    elif now - seen < floor.keep_newer_than:
        reasons.append(f"on this host since {seen.strftime(_TIME_FORMAT)} at the latest, "
                       f"less than {floor.label} ago")
    if floor.keep_last:
        newest = sorted(snaps, key=lambda s: s.createtxg)[-floor.keep_last:]
        if snap.createtxg >= newest[0].createtxg:
            reasons.append(f"one of the newest {floor.keep_last} snapshots of its dataset "
                           "(receive order)")
    return reasons


def refusal(what: str, name: str, reasons: Sequence[str]) -> str:
    """The refusal's text; ``zfs.errors`` maps its words ``kept by the floor of zbak serve``
    to ``KeptByFloor`` on the master, which prune reports as kept."""
    return f"{what}: {name} is kept by the floor of zbak serve: {'; '.join(reasons)}"


def check_destroy(name: str, snaps: Sequence[Snap], floor: Floor, pool_guid: int,
                  witnesses: Sequence[Witness], now: dt.datetime) -> None:
    """Refuse ``zfs destroy NAME`` unless the floor lets ``name`` go.

    Raises:
        CommandRefused: the snapshot is kept (``refusal``), or it is not among ``snaps``
            ("does not exist": the master reads it as gone; refusing also closes the race
            of a snapshot created between this check and the destroy).
    """
    snap = next((s for s in snaps if s.name == name), None)
    if snap is None:
        raise CommandRefused(f"zfs destroy: {name} does not exist")
    reasons = why_kept(snap, snaps, floor, pool_guid, witnesses, now)
    if reasons:
        raise CommandRefused(refusal("zfs destroy", name, reasons))


def check_rollback(name: str, snaps: Sequence[Snap], floor: Floor, pool_guid: int,
                   witnesses: Sequence[Witness], now: dt.datetime) -> None:
    """Refuse ``zfs rollback NAME`` when a snapshot newer than ``name`` is kept (plain zfs
    rollback refuses while newer snapshots exist anyway; this holds even if it did not).

    Raises:
        CommandRefused: a newer snapshot is kept, or ``name`` does not exist.
    """
    snap = next((s for s in snaps if s.name == name), None)
    if snap is None:
        raise CommandRefused(f"zfs rollback: {name} does not exist")
    for newer in sorted(snaps, key=lambda s: s.createtxg):
        if newer.createtxg <= snap.createtxg:
            continue
        reasons = why_kept(newer, snaps, floor, pool_guid, witnesses, now)
        if reasons:
            raise CommandRefused(refusal(f"zfs rollback to {name} would roll back past a "
                                         "snapshot it keeps", newer.name, reasons))


def floor_action(argv: Sequence[str]) -> FloorAction | None:
    """What the floor must do for the approved zfs command ``argv`` (plain program name or
    path first; the last command of a receive pipeline).

    Raises:
        CommandRefused: ``zfs release`` of a hold zbak does not place: with a floor, holds
            someone else put on the backup host stay (releasing one could open a destroy).
    """
    sub, args = (argv[1] if len(argv) > 1 else ""), list(argv[2:])
    if sub == "destroy" and args and within(args[0]) is not None:
        return None  # a drill's scratch copy (``--allow-drill``): no replica is at stake
    if sub == "destroy" and args and "@" in args[0]:
        return FloorAction("destroy", args[0], (args[0].split("@", 1)[0],))
    if sub == "rollback" and args:
        return FloorAction("rollback", args[0], (args[0].split("@", 1)[0],))
    if sub in ("receive", "recv"):
        parsed = parse(args, flags="usAF", valued="ox", what="zfs receive")
        if parsed.operands and not parsed.has("A"):
            return FloorAction("creates", None, tuple(parsed.operands))
    if sub == "snapshot":
        names = parse(args, flags="r", what="zfs snapshot").operands
        if names and not any("%" in n for n in names):  # the probe creates nothing
            return FloorAction("creates", None,
                               tuple(dict.fromkeys(n.split("@", 1)[0] for n in names)))
    if sub == "release" and args and not args[0].startswith(OWN_HOLD_PREFIX):
        raise CommandRefused(f"zfs release: tag {args[0]!r} is not a hold zbak places "
                             f"({OWN_HOLD_PREFIX}...); with a floor (--keep-newer-than) "
                             "zbak serve releases only zbak's own holds")
    return None
