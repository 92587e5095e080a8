"""What follows a dataset's transfers to a ZFS target, for a batch of datasets at once.

A replication run's workers (``replication.zfs_target``) move the streams; the run's own
thread then settles every dataset that finished since it last looked, while the next
transfers go on (``runtime.fanout``). For each batch, in this order:

1. a replica a full stream created on a receiver without ``zfs receive -o`` (zfs-fuse) gets
   the job's properties: one ``zfs set PROP=VALUE DS...`` per property (it arrived with
   ``-u``, mounted nowhere in between); once the transfers are over (``idle``), up to
   ``SETS_AT_ONCE`` commands at once, each with a share of the datasets;
2. the receiver's word is not enough: ONE ``zfs get`` on the target reads each received
   snapshot's guid, with the replica's properties, and a snapshot with another guid fails
   its dataset (``Settled.errors``);
3. the source's new bases are held before the old ones are released: one ``zfs hold``, one
   ``zfs release`` (``protect.move_protection_many``; an old hold zfs will not release is
   reported at the end of the run and moves the cursor all the same: one hold too many);
4. the cursors of every dataset whose base moved, in ONE catalog transaction;
5. properties zfs did not apply (``ReceiveProperties.fixes``) are repaired, with a warning;
6. the source's mountpoint is recorded on the replica (``values.failover.MOUNTPOINT_PROPERTY``,
   the default mountpoint of a failover): one ``zfs get`` of the received datasets'
   mountpoints on the source, then a ``zfs set`` (or ``inherit``) only where the recorded
   value is not already right: on the root, and on a child whose source has a mountpoint of
   its own (a child inheriting it on the source inherits the record too). A failure is a
   warning: the data and the cursor are safe.

Per dataset this is what the driver did one dataset at a time before (a ``zfs get``, a
``zfs hold``, a ``zfs release`` and a transaction each); a failure in one batched command
is retried one dataset at a time, so each dataset gets its own error. A crash between a
receive and its batch loses nothing: the old base stays held and the cursor where it was,
and the next run finds the target up to date and moves both (``Arrival.listed``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
from typing import TYPE_CHECKING

from zrepl_py.catalog.rows import CursorRow
from zrepl_py.clock import Clock
from zrepl_py.config.hosts import Endpoint
from zrepl_py.errors import HoldNotReleased, ReplicaPropertiesFailed, ZbakError, ZfsError
from zrepl_py.values.failover import MOUNTPOINT_PROPERTY
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName, SnapshotName
from zrepl_py.zfs.properties import Fix, ReceiveProperties
from zrepl_py.zfs.protect import BaseMove, move_protection_many
from zrepl_py.zfs.steps import SnapRef

if TYPE_CHECKING:  # SQLAlchemy loads with the catalog, while the run's SSH prefetch goes on
    from zrepl_py.catalog.repository import Catalog

log = logging.getLogger(__name__)

SETS_AT_ONCE = 8
"""``zfs set`` commands a batch runs at once once the transfers are over (step 1 of the
module doc). zfs sets a property one dataset at a time, each in a transaction group of its
own, and commands running together share them: 2 properties on 40 datasets of an idle
zfs-fuse pool took 0.14-0.18 s as 2 commands and 0.07-0.10 s as 8 (4 per property). While
the transfers run, the 2 CPUs are the limit and 8 commands (8 ssh sessions, shells and zfs
processes) made a tree's first replication slower (2.82 s against 2.61 s), so until then a
batch runs one command per property, one after the other."""


@dataclasses.dataclass(frozen=True)
class Arrival:
    """What one dataset's worker leaves to settle.

    Attributes:
        source: the source dataset; target_ds: its replica.
        reached: the newest source snapshot now on the target (None: nothing to record).
        created: a full stream created the replica in this run.
        old_base: short name of the base the cursor names now (None on a first run).
        props: the job's properties for this replica (``set`` and ``exclude``).
        checked: the properties read back and repaired after the receive.
        listed: ``reached`` was read from the target's listing, not received in this run
            (a dataset up to date whose cursor lagged): no guid check or repair is needed.
    """

    source: DatasetName
    target_ds: DatasetName
    reached: SnapRef | None
    created: bool = False
    old_base: str | None = None
    props: ReceiveProperties = ReceiveProperties()
    checked: ReceiveProperties = ReceiveProperties()
    listed: bool = False

    @property
    def snap(self) -> SnapRef:
        """``reached``, for an arrival known to have reached a snapshot."""
        assert self.reached is not None, f"{self.source} reached no snapshot"
        return self.reached


@dataclasses.dataclass
class Settled:
    """Errors of the datasets settled so far, by source dataset (a dataset with an error has
    no new cursor from its batch); property repairs and old holds that failed are kept
    apart: they come after the data and the cursor are safe."""

    errors: dict[DatasetName, BaseException] = dataclasses.field(default_factory=dict)
    property_errors: list[ReplicaPropertiesFailed] = dataclasses.field(default_factory=list)
    unreleased: list[HoldNotReleased] = dataclasses.field(default_factory=list)
    refused: set[DatasetName] = dataclasses.field(default_factory=set)
    """Replicas whose properties zfs refused to set (not asked again in the same run)."""


@dataclasses.dataclass(frozen=True)
class Settler:
    """Settles batches of arrivals for one (job, target); see the module doc."""

    job: str
    target: Endpoint
    source_host: str
    src: Zfs
    dst: Zfs
    catalog: Catalog
    clock: Clock
    takes_properties: bool
    """The receiver takes ``zfs receive -o``/``-x`` (else step 1 sets them afterwards)."""
    settled: Settled = dataclasses.field(default_factory=Settled)
    idle: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set once the run's transfers are over (``runtime.fanout``)."""

    def settle(self, arrivals: list[Arrival]) -> bool:
        """Settle ``arrivals`` (steps 1-5 of the module doc); errors go to ``settled``.

        Returns:
            True when a dataset failed (a wrong guid, a hold zfs refused): the run should
            start no other.

        Raises:
            CatalogError: the cursors could not be recorded (the holds are placed then).
        """
        before = len(self.settled.errors)
        created = [a for a in arrivals if a.created and not self.takes_properties]
        if created:
            self._set_after_full(created)
        received = [a for a in arrivals if a.reached is not None and not a.listed]
        observed = self._confirm(received)
        ready = [a for a in arrivals if a.reached is not None and a.source not in self.settled.errors]
        moves = [BaseMove(a.source, a.snap.name, a.snap.guid, a.old_base) for a in ready]
        protected = move_protection_many(self.src, moves, job=self.job,
                                         target=str(self.target))
        self.settled.errors.update(protected.failed)
        if protected.unreleased:
            self.settled.unreleased.append(protected.unreleased)
        moved = [a for a in ready if a.source not in protected.failed]
        now = self.clock.now()
        self.catalog.set_cursors([
            CursorRow(self.job, str(self.target), self.source_host, str(a.source),
                      str(a.target_ds), "zfs", a.snap.name, a.snap.guid,
                      a.snap.createtxg, now)
            for a in moved])
        for arrival in received:
            if arrival.source in observed and arrival.target_ds not in self.settled.refused:
                self._repair(arrival.target_ds, arrival.checked.fixes(observed[arrival.source]))
        self._record_mountpoints([a for a in received if a.source in observed], observed)
        return len(self.settled.errors) > before

    def _record_mountpoints(self, received: list[Arrival],
                            observed: dict[DatasetName, dict[str, tuple[str, str]]]) -> None:
        """Step 6 of the module doc."""
        if not received:
            return
        try:
            found = self.src.property_sources([a.source for a in received], ["mountpoint"])
        except ZfsError as exc:
            log.warning("%s: the source's mountpoints could not be read to record them on the "
                        "replicas (a failover then keeps the replica's own): %s", self.target,
                        exc)
            return
        for arrival in received:
            value, source = found.get(arrival.source, {}).get("mountpoint", ("-", "-"))
            if value == "-":
                continue  # a volume
            wanted = value if arrival.target_ds == self.target.dataset or source == "local" \
                else None
            have, have_source = observed[arrival.source].get(MOUNTPOINT_PROPERTY, ("-", "-"))
            try:
                if wanted is not None and (have_source != "local" or have != wanted):
                    self.dst.set_property(arrival.target_ds, MOUNTPOINT_PROPERTY, wanted)
                elif wanted is None and have_source == "local":
                    self.dst.inherit_property(arrival.target_ds, MOUNTPOINT_PROPERTY)
            except ZfsError as exc:
                log.warning("%s: could not record the source's mountpoint %s on %s (a failover "
                            "then mounts it where it inherits): %s", self.target, value,
                            arrival.target_ds, exc)

    def _set_after_full(self, created: list[Arrival]) -> None:
        """Set the job's properties on replicas a full stream has just created, on a
        receiver without ``zfs receive -o``: one ``zfs set`` per property and value."""
        by_setting: dict[tuple[str, str], list[Arrival]] = {}
        for arrival in created:
            for name, value in arrival.props.assigned:
                log.info("%s: %s of %s is not set yet (this zfs receive has no -o); running "
                         "zfs set %s=%s (replica properties)", self.target, name,
                         arrival.target_ds, name, value)
                by_setting.setdefault((name, value), []).append(arrival)
        if not by_setting:
            return
        if not self.idle.is_set():
            for (name, value), group in by_setting.items():
                self._set_many(name, value, group)
            return
        shares = max(1, SETS_AT_ONCE // len(by_setting))
        commands = [(name, value, group[start::shares])
                    for (name, value), group in by_setting.items()
                    for start in range(min(shares, len(group)))]
        with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:
            for done in [pool.submit(self._set_many, *command) for command in commands]:
                done.result()

    def _set_many(self, name: str, value: str, group: list[Arrival]) -> None:
        """One ``zfs set NAME=VALUE`` of ``group``'s replicas; when zfs refuses it, each
        replica alone (``_repair``), so each gets its own error."""
        try:
            self.dst.set_property_many([a.target_ds for a in group], name, value)
        except ZfsError as exc:
            if len(group) == 1:
                self._refused(group[0].target_ds, [f"zfs set {name}={value}: {exc}"])
                return
            for arrival in group:
                self._repair(arrival.target_ds, [Fix(name, value, "is not set yet")],
                             quiet=True)

    def _confirm(self, received: list[Arrival]) -> dict[DatasetName, dict[str, tuple[str, str]]]:
        """Read each received snapshot's guid and its replica's checked properties in one
        ``zfs get`` (alone after a failure); a wrong or missing guid fails that dataset.

        Returns:
            ``{source dataset: {property: (value, source)}}`` of each confirmed replica.
        """
        if not received:
            return {}
        props = sorted({name for a in received for name in a.checked.names}
                       | {MOUNTPOINT_PROPERTY})
        try:
            got = self._read(received, props)
        except ZfsError:
            got = {}
            for arrival in received:
                try:
                    got.update(self._read([arrival], props))
                except ZfsError as exc:
                    self.settled.errors[arrival.source] = exc
        observed = {}
        for arrival in received:
            if arrival.source in self.settled.errors:
                continue
            snapshot = SnapshotName.of(arrival.target_ds, arrival.snap.name)
            guid = got.get(snapshot, {}).get("guid", ("-", "-"))[0]
            if guid != str(arrival.snap.guid):
                self.settled.errors[arrival.source] = ZbakError(
                    f"{snapshot} has guid {guid} after receive, expected "
                    f"{arrival.snap.guid}: the target is not a replica of this source")
                continue
            observed[arrival.source] = got.get(arrival.target_ds, {})
        return observed

    def _read(self, arrivals: list[Arrival], props: list[str]
              ) -> dict[str, dict[str, tuple[str, str]]]:
        names = []
        for arrival in arrivals:
            names += [SnapshotName.of(arrival.target_ds, arrival.snap.name), arrival.target_ds]
        return self.dst.property_sources(names, ["guid", *props])

    def _repair(self, target_ds: DatasetName, fixes: list[Fix], *, quiet: bool = False) -> None:
        """Apply ``fixes`` to ``target_ds``, logging each (a warning unless ``quiet``); what
        zfs (or ``zbak serve``) refuses becomes a ``ReplicaPropertiesFailed`` in
        ``settled``, the others are still tried."""
        failed = []
        for fix in fixes:
            how = f"zfs set {fix.prop}={fix.value}" if fix.value is not None else (
                f"zfs inherit {fix.prop}")
            if not quiet:
                log.warning("%s: %s of %s %s; running %s (replica properties)", self.target,
                            fix.prop, target_ds, fix.why, how)
            try:
                if fix.value is None:
                    self.dst.inherit_property(target_ds, fix.prop)
                else:
                    self.dst.set_property(target_ds, fix.prop, fix.value)
            except ZfsError as exc:
                failed.append(f"{how}: {exc}")
        if failed:
            self._refused(target_ds, failed)

    def _refused(self, target_ds: DatasetName, failed: list[str]) -> None:
        """Keep a ``ReplicaPropertiesFailed`` naming the commands zfs refused on
        ``target_ds``."""
        self.settled.refused.add(target_ds)
        self.settled.property_errors.append(ReplicaPropertiesFailed(
                f"{self.target}: {target_ds} was received, but its properties could not be "
                f"made the job's ({'; '.join(failed)}). Grant the target's ssh user those "
                f"properties (zfs allow, see examples/zfs-allow.sh; zbak serve "
                f"--receive-set), or run the commands there as root; every run that "
                f"receives into it checks again"))
