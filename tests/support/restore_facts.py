"""Restore facts built by hand for the pure planners' tests (``restore.plan``, ``drill.plan``):
a dataset ``tank/data`` whose snapshot @N has guid 1000+N and createtxg 10+N, its listings,
and stores holding chains of ``S`` streams."""

from __future__ import annotations

import dataclasses
import datetime as dt

from zrepl_py.catalog.rows import StreamRow, VolumeRow
from zrepl_py.clock import UTC
from zrepl_py.objects.manifest import CarriedSnapshot
from zrepl_py.restore.facts import Listing, StoreFacts

DATA = "tank/data"
MB = 1_000_000
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)


def snap(n: int) -> CarriedSnapshot:
    return CarriedSnapshot(str(n), 1000 + n, 10 + n)


def listing(*ns: int, host: str = "local", dataset: str = DATA) -> Listing:
    return Listing(host, dataset, tuple(snap(n) for n in ns))


@dataclasses.dataclass(frozen=True)
class S:
    """A stream to put in a store: ``to`` snapshot, ``base`` for an incremental (it carries
    base+1 .. to), stored megabytes, class and state."""

    id: int
    to: int
    base: int | None = None
    parent: int | None = None
    mb: float = 1
    cls: str = "STANDARD"
    state: str = "verified"
    why: str | None = None  # the reason a bad one was marked with


def store(name: str, *streams: S, damaged: dict[int, str] | None = None) -> StoreFacts:
    rows, carried, volumes = [], {}, {}
    for s in streams:
        kind = "full" if s.base is None else "incremental"
        rows.append(StreamRow(
            id=s.id, host="local", dataset=DATA, store=name, kind=kind, parent_id=s.parent,
            from_guid=None if s.base is None else snap(s.base).guid, to_guid=snap(s.to).guid,
            from_name=None if s.base is None else str(s.base), to_name=str(s.to),
            to_createtxg=snap(s.to).createtxg, raw_bytes=int(s.mb * 2 * MB),
            stored_bytes=int(s.mb * MB), object_prefix=f"{name}/{s.id}/", storage_class=s.cls,
            compression="zstd", state=s.state, created_at=T0, uploaded_at=T0, verified_at=T0,
            bad_reason=s.why))
        first = s.to if s.base is None else s.base + 1
        carried[s.id] = tuple(snap(n) for n in range(first, s.to + 1))
        volumes[s.id] = (VolumeRow(s.id * 10, s.id, 0, f"{name}/{s.id}/vol-0.zst",
                                   int(s.mb * 2 * MB), int(s.mb * MB), "0" * 64),)
    return StoreFacts(name, tuple(rows), carried, volumes, damaged or {})


# A chain of a full @0 and two -I incrementals, and a second chain starting at a full @8.
CHAIN = (S(1, 0, mb=10), S(2, 4, base=0, parent=1, mb=5), S(3, 9, base=4, parent=2, mb=5))
NEAR = (S(4, 8, mb=12), S(5, 9, base=8, parent=4, mb=1))
