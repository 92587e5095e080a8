"""Promote, demote and release one replica dataset, on its own host or over ssh.

The three operations each run a few zfs commands on the dataset, every one idempotent and
in an order that is safe to stop anywhere (docs/design.md#failover-and-failback-orders):

- ``promote``: the ``zbak:failover`` mark first (replication refuses the dataset from then
  on), the hold on the mark's base snapshot (the way back), ``readonly=off``, the
  mountpoint, ``canmount=on``, ``zfs mount``;
- ``demote``: ``readonly=on`` first (nothing more can be written), ``zfs unmount``,
  ``canmount=noauto``, the mountpoint inherited again; the mark stays;
- ``release``: the hold released, then the mark cleared: a replica again.

``promote_replica``, ``demote_replica`` and ``release_replica`` do them with a ``Zfs``
client. ``ReplicaHost`` does them on a target host: on this machine directly; on another
host it asks for the verb ``zbak replica promote|demote|release`` (docs/decisions.md#failover-goes-through-verbs-zbak-serve-checks),
which a least-privilege host's ``zbak serve --allow-failover`` checks and runs and a host
with zbak installed runs as a command; where the host has no zbak (exit 127) the same
zfs commands go over ssh one by one. ``zbak serve`` refuses those raw commands
(``readonly=off``, ``mount``): a host behind it answers the verb.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from zrepl_py.errors import (
    CommandFailed,
    DatasetNotFound,
    HoldExists,
    HoldNotFound,
    ZbakError,
    ZfsError,
)
from zrepl_py.proc.executor import COMMAND_NOT_FOUND
from zrepl_py.values.failover import FAILOVER_PROPERTY, FailoverMark, hold_tag
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName, SnapshotName

log = logging.getLogger(__name__)

SERVE_REFUSED = 126
"""The exit status of a request ``zbak serve`` refuses (``serve.execute.REFUSED``; a unit
test keeps the two equal: importing it would load serve's executor here)."""

VERBS = ("promote", "demote", "release")
_READ = ("type", FAILOVER_PROPERTY, "readonly", "mountpoint", "canmount", "mounted")


class FailoverRefused(ZbakError):
    """The target host's ``zbak serve`` refused a failover verb (not started with
    ``--allow-failover``, a mountpoint outside ``--failover-mounts``, ...): the message
    carries its reason; nothing of that step was done."""


def _state(zfs: Zfs, dataset: DatasetName) -> dict[str, str]:
    """The properties ``_READ`` of ``dataset``; its mark's value only when set on it (a
    child inherits its parent's user property, zfsprops(7) "User Properties")."""
    found = zfs.property_sources([dataset], list(_READ)).get(dataset, {})
    values = {prop: value for prop, (value, _) in found.items()}
    if found.get(FAILOVER_PROPERTY, ("-", "-"))[1] != "local":
        values[FAILOVER_PROPERTY] = "-"
    if found.get("readonly", ("-", "-"))[1] == "temporary":  # zfs-fuse, mounted: see facts
        values["readonly"] = zfs.set_here(dataset, "readonly", recursive=False).get(
            str(dataset), "off")
    return values


def mark_of(zfs: Zfs, dataset: DatasetName) -> str | None:
    """``dataset``'s own ``zbak:failover`` value (not one inherited from its parent), None
    when it has none."""
    value = _state(zfs, dataset).get(FAILOVER_PROPERTY, "-")
    return None if value == "-" else value


def promote_replica(zfs: Zfs, dataset: DatasetName, mark: FailoverMark,
                    mountpoint: str | None) -> None:
    """Make ``dataset`` live (see the module doc); what is done already is skipped.

    Args:
        zfs: client for the dataset's host.
        mark: its ``zbak:failover`` mark (an existing one is kept as it is).
        mountpoint: the mountpoint to give it; None leaves it as it is.

    Raises:
        DatasetNotFound: no such dataset, or the mark's base snapshot is gone.
        ZfsError: a command failed (e.g. the mountpoint is in use).
    """
    props = _state(zfs, dataset)
    if props.get(FAILOVER_PROPERTY, "-") == "-":
        zfs.set_property(dataset, FAILOVER_PROPERTY, mark.value())
    if mark.base is not None:
        # Also where the mark is set already: a run killed between the two left it unheld.
        try:
            zfs.hold(SnapshotName.of(dataset, mark.base), hold_tag(mark.job))
        except HoldExists:
            pass
    if props.get("readonly") != "off":
        zfs.set_property(dataset, "readonly", "off")
    if props.get("type") != "filesystem":
        return
    moved = mountpoint is not None and props.get("mountpoint") != mountpoint
    if moved and mountpoint is not None:
        zfs.set_property(dataset, "mountpoint", mountpoint)
    if props.get("canmount") != "on":
        zfs.set_property(dataset, "canmount", "on")
    where = mountpoint or props.get("mountpoint", "-")
    if where.startswith("/") and (moved or props.get("mounted") != "yes") \
            and zfs.get_properties(dataset, ["mounted"]).get("mounted") != "yes":
        zfs.mount(dataset)


def demote_replica(zfs: Zfs, dataset: DatasetName) -> None:
    """Make ``dataset`` a read-only, unmounted replica again; its mark stays (see the module
    doc).

    Raises:
        DatasetNotFound: no such dataset.
        DatasetBusy: it is in use and cannot be unmounted (it is read-only already).
        ZfsError: a command failed.
    """
    props = _state(zfs, dataset)
    if props.get("readonly") != "on":
        zfs.set_property(dataset, "readonly", "on")
    if props.get("type") != "filesystem":
        return
    if props.get("mounted") == "yes":
        zfs.unmount(dataset)
    if props.get("canmount") != "noauto":
        zfs.set_property(dataset, "canmount", "noauto")
    sources = zfs.property_sources([dataset], ["mountpoint"]).get(dataset, {})
    if sources.get("mountpoint", ("-", "-"))[1] == "local":
        zfs.inherit_property(dataset, "mountpoint")


def release_replica(zfs: Zfs, dataset: DatasetName) -> FailoverMark | None:
    """Release the way-back hold of ``dataset``'s mark and clear the mark: a replica again.

    Returns:
        the mark it had (None: it had none; nothing was done).

    Raises:
        InvalidMark: its ``zbak:failover`` is not a value zbak writes (left as it is).
        DatasetNotFound: no such dataset.
        ZfsError: a command failed.
    """
    value = _state(zfs, dataset).get(FAILOVER_PROPERTY, "-")
    if value == "-":
        return None
    mark = FailoverMark.parse(value)
    if mark.base is not None:
        try:
            zfs.release(SnapshotName.of(dataset, mark.base), hold_tag(mark.job))
        except (HoldNotFound, DatasetNotFound):
            pass  # released already, or its snapshot destroyed: nothing left to protect
    zfs.inherit_property(dataset, FAILOVER_PROPERTY)
    return mark


def verb_argv(verb: str, dataset: DatasetName, *, mark: FailoverMark | None = None,
              mountpoint: str | None = None) -> list[str]:
    """The request of a remote verb: ``zbak replica VERB [--mark M] [--mountpoint P] DS``
    (``serve.failover`` parses exactly this).

    Raises:
        ValueError: an unknown verb, or ``promote`` without a mark.
    """
    if verb not in VERBS:
        raise ValueError(f"unknown replica verb {verb!r}")
    argv = ["zbak", "replica", verb]
    if verb == "promote":
        if mark is None:
            raise ValueError("promote needs the mark")
        argv += ["--mark", mark.value()]
        if mountpoint is not None:
            argv += ["--mountpoint", mountpoint]
    return [*argv, str(DatasetName(dataset))]


@dataclasses.dataclass
class ReplicaHost:
    """The replica operations on one target host (see the module doc).

    Attributes:
        zfs: client for the host (its executor carries the verbs).
        local: the host is this machine: the operations run directly.
        raw: the host has no zbak (it answered 127 once): the zfs commands go one by one.
    """

    zfs: Zfs
    local: bool
    raw: bool = False

    def promote(self, dataset: DatasetName, mark: FailoverMark, mountpoint: str | None) -> None:
        """``promote_replica`` on the host.

        Raises:
            FailoverRefused: its zbak serve refused it.
            ZfsError, CommandFailed: a command failed there.
        """
        self._do(verb_argv("promote", dataset, mark=mark, mountpoint=mountpoint),
                 lambda: promote_replica(self.zfs, dataset, mark, mountpoint))

    def demote(self, dataset: DatasetName) -> None:
        """``demote_replica`` on the host (raises as ``promote``)."""
        self._do(verb_argv("demote", dataset), lambda: demote_replica(self.zfs, dataset))

    def release(self, dataset: DatasetName) -> None:
        """``release_replica`` on the host (raises as ``promote``)."""
        self._do(verb_argv("release", dataset), lambda: release_replica(self.zfs, dataset))

    def _do(self, argv: list[str], directly: Callable[[], object]) -> None:
        if self.local or self.raw:
            directly()
            return
        done = self.zfs.executor.run(argv, check=False, timeout=self.zfs.timeout)
        if done.returncode == 0:
            return
        if done.returncode == COMMAND_NOT_FOUND:
            log.info("%s has no zbak: the replica's zfs commands go one by one over ssh",
                     self.zfs.host)
            self.raw = True
            directly()
            return
        reason = done.error_text.removeprefix("zbak serve: refused: ").strip()
        if done.returncode == SERVE_REFUSED:
            raise FailoverRefused(
                f"{self.zfs.host}: zbak serve refused `{' '.join(argv[:3])}` on {argv[-1]}: "
                f"{reason} (a backup host behind zbak serve needs --allow-failover, and "
                "--failover-mounts for a replica mounted outside its parent's mountpoint)")
        error = CommandFailed(argv, done.returncode, done.error_text, self.zfs.host)
        raise ZfsError(error.argv, error.returncode, error.stderr, error.host)
