"""A pool's health as ``zpool status POOL`` and ``zfs get`` tell it: the report zbak judges
before a run (``zrepl_py.checks.health``).

Sources of the ``zpool status`` layout (zpool(8) "status"; OpenZFS ``cmd/zpool/zpool_main.c``
``print_status_config``/``print_spares``): the config table is ``NAME STATE READ WRITE
CKSUM`` with two spaces of indent per level under one tab, followed by optional ``logs``,
``cache``, ``spares``, ``special`` and ``dedup`` sections whose header rows have no state;
spares show ``AVAIL`` or ``INUSE`` and no counts; a row may end with a note (``was
/dev/sdc1``, ``(resilvering)``, ``too many errors``); counts may be humanized (``1.2K``).
The ``errors:`` line reads ``No known data errors`` on a clean pool. zfs-fuse 0.7 prints the
same table (seen: a mirror with one file vdev offline shows ``DEGRADED`` for the pool and
the mirror and ``OFFLINE`` for the file).
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from zrepl_py.zfs.model import PoolHealth

if TYPE_CHECKING:
    from zrepl_py.zfs.client import Zfs

STATES = ("ONLINE", "DEGRADED", "FAULTED", "OFFLINE", "UNAVAIL", "REMOVED", "AVAIL", "INUSE",
          "SUSPENDED", "SPLIT")
"""Vdev states zpool(8) prints (``zpool_state_to_name`` plus the spare states)."""
HEALTHY_STATES = frozenset({"ONLINE", "AVAIL", "INUSE"})
"""A spare in use (INUSE) is no problem itself: the device it replaces shows its own state."""
_HEADER = re.compile(r"^\s*NAME\s+STATE\s+READ\s+WRITE\s+CKSUM\s*$")
_ROW = re.compile(
    r"^(?P<name>.+?)\s+(?P<state>" + "|".join(STATES) + r")"
    r"(?:\s+(?P<read>\S+)\s+(?P<write>\S+)\s+(?P<cksum>\S+))?(?:\s+(?P<note>.*?))?\s*$"
)
_ERRORS = re.compile(r"^errors:\s*(?P<text>.*)$", re.MULTILINE)
_CLEAN = "No known data errors"


@dataclasses.dataclass(frozen=True)
class Vdev:
    """One row of the ``zpool status`` config table.

    Attributes:
        name: as printed (a device path, ``mirror-0``, the pool name); may hold spaces.
        state: one of ``STATES``.
        depth: 0 for the pool row, 1 for top-level vdevs, 2 for their children, ...
        section: ``""`` for the pool's data vdevs, else ``logs``/``cache``/``spares``/...
        errors: ``(read, write, cksum)`` counts as printed, or None (spares print none).
        note: text after the counts (``was /dev/sdc1``, ``(resilvering)``), or ``""``.
    """

    name: str
    state: str
    depth: int
    section: str = ""
    errors: tuple[str, str, str] | None = None
    note: str = ""


@dataclasses.dataclass(frozen=True)
class PoolReport:
    """A pool's health as zbak judges it before a run.

    Attributes:
        host: the host label (``local`` or a ``[hosts]`` key).
        pool: the pool name.
        state: the ``state:`` line (``UNKNOWN`` when missing).
        free_bytes: bytes the root dataset can still write.
        size_bytes: ``used + available`` of the root dataset, or None when not read.
        vdevs: the config table's rows, in order.
        data_errors: the ``errors:`` line's text, or None when there is none.
    """

    host: str
    pool: str
    state: str
    free_bytes: int
    size_bytes: int | None
    vdevs: tuple[Vdev, ...]
    data_errors: str | None

    @property
    def problems(self) -> list[str]:
        """Everything wrong with the pool, one phrase each; empty for a healthy pool."""
        return pool_problems(self.state, self.vdevs, self.data_errors)

    @property
    def degraded(self) -> bool:
        """True when ``problems`` is not empty."""
        return bool(self.problems)

    def describe(self) -> str:
        """``pool tank on local is DEGRADED: /dev/sdb OFFLINE; ...`` or ``... is ONLINE``."""
        head = f"pool {self.pool} on {self.host} is {self.state}"
        problems = [p for p in self.problems if p != f"pool state {self.state}"]
        return head + (": " + "; ".join(problems) if problems else "")


def parse_status(text: str) -> tuple[tuple[Vdev, ...], str | None]:
    """Parse ``zpool status POOL`` output (one pool) into its config rows and errors line.

    Pure. Rows outside the ``NAME STATE READ WRITE CKSUM`` table are ignored; section header
    rows (``logs``, ``cache``, ``spares``, ...) set ``Vdev.section`` of the rows under them.

    Returns:
        ``(vdevs, data_errors)``: the rows in order, and the ``errors:`` text or None.
    """
    vdevs: list[Vdev] = []
    in_table = False
    section = ""
    for line in text.splitlines():
        if not in_table:
            in_table = bool(_HEADER.match(line))
            continue
        if not line.strip() or line.lstrip().startswith("errors:"):
            break
        body = line[1:] if line.startswith("\t") else line
        indent = len(body) - len(body.lstrip(" "))
        match = _ROW.match(body.strip())
        if match is None:
            section = body.strip()  # a section header row: no state
            continue
        counts = None
        if match["read"] is not None:
            counts = (match["read"], match["write"], match["cksum"])
        vdevs.append(Vdev(match["name"], match["state"], indent // 2, section, counts,
                          match["note"] or ""))  # fmt: skip
    found = _ERRORS.search(text)
    return tuple(vdevs), (found["text"].strip() if found else None)


def pool_problems(state: str, vdevs: tuple[Vdev, ...] | list[Vdev], data_errors: str | None) -> list[str]:
    """What is wrong with a pool, from its state line, config rows and errors line (pure).

    A problem is: a pool state other than ONLINE; a row whose state is not healthy
    (``HEALTHY_STATES``); a row with non-zero read, write or checksum counts; an ``errors:``
    line other than "No known data errors".
    """
    problems = [] if state == "ONLINE" else [f"pool state {state}"]
    for vdev in vdevs:
        if vdev.state not in HEALTHY_STATES and vdev.depth > 0:
            problems.append(f"{vdev.name} {vdev.state}" + (f" ({vdev.note})" if vdev.note else ""))
        if vdev.errors and any(count != "0" for count in vdev.errors):
            read, write, cksum = vdev.errors
            problems.append(f"{vdev.name}: {read} read, {write} write, {cksum} checksum errors")
    if data_errors is not None and data_errors != _CLEAN:
        problems.append(f"data errors: {data_errors}")
    return problems


def pool_report(zfs: Zfs, pool: str, *, with_size: bool = False) -> PoolReport:
    """Read one pool's health on ``zfs``'s host.

    Two commands (``Zfs.pool_health``: ``zpool status POOL`` and ``zfs get -Hp available``),
    a third (``zfs get -Hp used``) with ``with_size``.

    Raises:
        DatasetNotFound: no such pool.
        CommandFailed: the host has no zpool (returncode 127) or the command failed.
    """
    health: PoolHealth = zfs.pool_health(pool)
    size = None
    if with_size:
        used = zfs.get_properties(pool, ["used"])["used"]
        size = health.free_bytes + int(used) if used.isdigit() else None
    vdevs, data_errors = parse_status(health.status_text)
    return PoolReport(zfs.host, health.pool, health.state, health.free_bytes, size, vdevs,
                      data_errors)
