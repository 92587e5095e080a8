"""Who owns a temporary dataset: a stamp naming this process, and whether its owner is gone.

zbak makes short-lived datasets (a snapshot's view clone, ``replication.snapshot_view``) and
removes them when done; a process killed with SIGKILL cannot, so the dataset carries the
stamp of the process that made it and a later run removes it once that process is gone
(docs/decisions.md#temporary-datasets-carry-their-owner). The stamp is
``MACHINE:BOOT:PID:START``:

- ``MACHINE``: ``/etc/machine-id`` (machine-id(5)), else the host name: which machine;
- ``BOOT``: ``/proc/sys/kernel/random/boot_id`` (random(4)), new at every boot;
- ``PID`` and ``START``: the process id and its start time in clock ticks since boot
  (proc(5), ``/proc/PID/stat`` field 22), so a pid reused by a later process is not taken
  for the owner.

Only the owner's machine can tell whether it is alive: a stamp of another machine is
``None`` (unknown), never dead, so a run never removes what a live process elsewhere uses.
"""

from __future__ import annotations

import dataclasses
import os
import socket


@dataclasses.dataclass(frozen=True)
class Owner:
    """A process's identity (the fields of the stamp in the module doc)."""

    machine: str
    boot: str
    pid: int
    start: int

    def stamp(self) -> str:
        """``MACHINE:BOOT:PID:START``."""
        return f"{self.machine}:{self.boot}:{self.pid}:{self.start}"

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        """The owner a stamp names, None when ``text`` is not one (e.g. ``-``: unset)."""
        parts = text.split(":")
        if len(parts) != 4 or not all(parts) or not (parts[2].isdigit() and parts[3].isdigit()):
            return None
        return cls(parts[0], parts[1], int(parts[2]), int(parts[3]))


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks after boot (field 22 of
    /proc/PID/stat, proc(5)); None when there is no such process or no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # comm (field 2) is in parentheses and may hold spaces or ")": split after the last ")".
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])  # field 22 counted from field 3 (state)
    except (IndexError, ValueError):
        return None


def this_machine() -> tuple[str, str]:
    """``(machine, boot)`` of this machine (see the module doc)."""
    machine = _read("/etc/machine-id") or socket.gethostname()
    boot = (_read("/proc/sys/kernel/random/boot_id") or "unknown-boot").replace("-", "")
    return machine, boot


def this_process() -> Owner:
    """The stamp's fields for the running process."""
    machine, boot = this_machine()
    pid = os.getpid()
    return Owner(machine, boot, pid, process_start(pid) or 0)


def owner_gone(stamp: str) -> bool | None:
    """Whether the process a stamp names is gone: True (its machine rebooted since, or no
    process with its pid and start time runs), False (it runs), None (not a stamp, or
    another machine's process, which only that machine can tell)."""
    owner = Owner.parse(stamp)
    if owner is None:
        return None
    machine, boot = this_machine()
    if owner.machine != machine or process_start(os.getpid()) is None:
        return None  # another machine's, or no /proc here to tell
    if owner.boot != boot:
        return True
    return process_start(owner.pid) != owner.start
