"""The scratch dataset a drill restores into, and the leftovers of drills that were killed.

A drill of one source creates ``PARENT/zbak-drill-<8 hex>`` (``canmount=off``,
``mountpoint=none``: nothing of it is mounted) with the user property ``zbak:drill`` set to
``NODE:PID:START``, the host name, process id and process start time of the zbak that
created it (``runtime.owner.process_start``), restores below it, and destroys it with
everything below it, one name at a time (``zfs.teardown.destroy_tree``), whatever happened.

A drill killed before it could destroy its scratch (SIGKILL, a power cut) leaves it behind.
The next drill on the same parent finds it (``sweep``): a child named ``zbak-drill-<hex>``
whose ``zbak:drill`` names this host and a process that is gone (``process_gone``: a reused
PID does not count) is destroyed the same way, after the view clones killed runs of this
machine left on the pool (``remove_dead_views``: a drill killed while it compared files leaves
one of its scratch's snapshot); one another host made is left alone and
named in a warning (that host's next drill sweeps it), and so is one without the property,
which zbak did not make (docs/decisions.md#drill-scratch-is-marked-and-swept).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket

from zrepl_py.drill.names import MARK, PREFIX, is_scratch
from zrepl_py.errors import ZbakError
from zrepl_py.observe.transfers import process_gone
from zrepl_py.replication.snapshot_view import remove_dead_views
from zrepl_py.runtime.owner import process_start
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName
from zrepl_py.zfs.teardown import destroy_tree

log = logging.getLogger(__name__)

def new_name(parent: str) -> str:
    """A fresh scratch name below ``parent``."""
    return str(DatasetName(parent).child(f"{PREFIX}{secrets.token_hex(4)}"))


def mark_value() -> str:
    """``NODE:PID:START`` of this process."""
    pid = os.getpid()
    start = process_start(pid)
    return f"{socket.gethostname()}:{pid}:{start if start is not None else '-'}"


def owner_gone(value: str) -> str | None:
    """Why the process a ``zbak:drill`` value names is gone, when it ran on this host; None
    when it still runs, ran on another host, or the value is not one zbak writes."""
    node, _, rest = value.rpartition(":")
    node, _, pid = node.rpartition(":")
    if node != socket.gethostname() or not pid.isdigit():
        return None
    return process_gone(int(pid), int(rest) if rest.isdigit() else None)


def create(zfs: Zfs, scratch: str) -> None:
    """Create ``scratch`` unmounted and marked as this process's (see the module doc).

    Raises:
        DatasetNotFound: its parent does not exist.
        DatasetExists, PermissionDenied, ZfsError, HostUnreachable.
    """
    zfs.create_filesystem(scratch, properties={"canmount": "off", "mountpoint": "none",
                                               MARK: mark_value()})


def destroy(zfs: Zfs, scratch: str) -> None:
    """Destroy ``scratch`` and everything below it (``destroy_tree``); a scratch that is
    not there (never created) is fine.

    Raises:
        ZfsError, DatasetBusy, HostUnreachable: it could not all be destroyed.
    """
    if zfs.exists(scratch):
        destroy_tree(zfs, scratch)


@dataclasses.dataclass(frozen=True)
class Swept:
    """What ``sweep`` did below one parent: scratch datasets destroyed, and those left
    (another host's, or unmarked) or that could not be destroyed, each with why."""

    destroyed: tuple[str, ...] = ()
    left: tuple[str, ...] = ()


def sweep(zfs: Zfs, parent: str) -> Swept:
    """Destroy the scratch datasets directly below ``parent`` that drills of this host left
    when they were killed (see the module doc). Never raises for a scratch; a parent that
    cannot be listed is logged and nothing is swept.

    Returns:
        What was destroyed and what was left (each ``NAME (why)``).
    """
    try:
        # a drill killed while it compared files left a view clone of its scratch's
        # snapshot, which would keep the scratch from being destroyed
        remove_dead_views(zfs, parent)
    except ZbakError as exc:
        log.warning("cannot remove the views killed runs left in %s:%s: %s", zfs.host,
                    DatasetName(parent).pool, exc)
    try:
        found = zfs.dataset_properties(parent, [MARK], recursive=False, children=True)
    except ZbakError as exc:
        log.warning("cannot look for drill leftovers below %s:%s: %s", zfs.host, parent, exc)
        return Swept()
    destroyed, left = [], []
    for name, props in sorted(found.items()):
        if name == parent or not is_scratch(name):
            continue
        mark = props.get(MARK)
        value = mark.value if mark is not None and mark.source == "local" else None
        if value is None:
            left.append(f"{name} (no {MARK} mark: not made by zbak)")
            continue
        gone = owner_gone(value)
        if gone is None:
            left.append(f"{name} (made by {value}, still running or on another host)")
            continue
        try:
            destroy_tree(zfs, name)
        except ZbakError as exc:
            left.append(f"{name} (left by a drill that was killed, {gone}; cannot destroy"
                        f" it: {exc})")
            continue
        log.warning("destroyed %s:%s, the scratch of a drill that was killed (%s)", zfs.host,
                    name, gone)
        destroyed.append(name)
    for what in left:
        log.warning("left drill scratch %s:%s", zfs.host, what)
    return Swept(tuple(destroyed), tuple(left))
