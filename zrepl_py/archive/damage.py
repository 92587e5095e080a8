"""Streams whose objects are gone from the store: find them cheaply, mark them ``bad``.

docs/decisions.md#a-damaged-chain-is-never-extended: a volume deleted from the store (a lifecycle
rule, an operator, a broken disk) made every later incremental of its chain unrestorable, yet ``zbak
archive`` kept extending that chain. Now, before ``zbak archive`` extends a chain,
:func:`chain_damage` compares a listing of the store (the job's tree, listed once per run: no read,
no request per object) with the catalog (:func:`stream_damage`, pure):

* a volume missing, or stored with another size than the catalog records, is a LOSS: the
  stream cannot be restored, so :func:`mark_bad` marks it ``bad``, which takes it and every
  stream applying after it out of restores (only ``LIVING_STATES`` are restored from), and
  the planner starts a new full;
* a manifest missing together with its ``.copy`` is no loss (restores read the catalog's
  volume rows), but ``zbak catalog rebuild`` could not recover the chain past it, so the
  chain is not extended either: the planner starts a new full, the stream stays restorable.

What a listing cannot see (a volume of the right size holding other bytes) is found by
``zbak audit --deep``, which marks the stream bad through :func:`mark_bad` as well.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence

from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import LIVING_STATES, StreamRow, VolumeRow, bad_reason, first_three
from zrepl_py.errors import CatalogConflict
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY
from zrepl_py.observe.events import Event, emit
from zrepl_py.stores.base import ObjectInfo

MARKABLE_STATES = LIVING_STATES | {"uploading"}
"""States a stream may be marked ``bad`` from (``catalog.repository.STATE_TRANSITIONS``)."""


@dataclasses.dataclass(frozen=True)
class Damage:
    """What the store lacks of one catalogued stream.

    Attributes:
        stream: the stream.
        what: what the store lacks, naming each object's key (the reason a lost stream
            is marked bad with).
        lost: True when a volume is missing or has another size (the stream cannot be
            restored: mark it bad); False when only the manifest and its copy are missing.
    """

    stream: StreamRow
    what: str
    lost: bool

    @property
    def problem(self) -> str:
        """One sentence naming the stream, its store and the objects (for logs, the plan
        and the event)."""
        stream = self.stream
        return f"stream {stream.id} (@{stream.to_name}) in store {stream.store}: {self.what}"


def stream_damage(stream: StreamRow, volumes: Sequence[VolumeRow],
                  listing: Mapping[str, ObjectInfo]) -> Damage | None:
    """Compare one stream's catalog rows with a listing of its prefix (pure).

    Args:
        stream: the catalogued stream.
        volumes: its volume rows, by index.
        listing: key -> ObjectInfo of the objects under ``stream.object_prefix``.

    Returns:
        None when every volume is listed with its recorded size (bytes) and the manifest
        or its copy is listed; else the :class:`Damage`.
    """
    wrong = []
    for volume in volumes:
        info = listing.get(volume.key)
        if info is None:
            wrong.append(f"volume {volume.index} ({volume.key}) is missing")
        elif info.size != volume.stored_bytes:
            wrong.append(f"volume {volume.index} ({volume.key}) has {info.size} bytes, the"
                         f" catalog records {volume.stored_bytes}")
    if wrong:
        return Damage(stream, first_three(wrong), lost=True)
    prefix = stream.object_prefix
    if prefix + MANIFEST not in listing and prefix + MANIFEST_COPY not in listing:
        return Damage(stream, f"its {MANIFEST} and {MANIFEST_COPY} are missing ({prefix}), so"
                      " a lost catalog could not be rebuilt past it", lost=False)
    return None


def chain_damage(chain: Sequence[StreamRow], volumes: Mapping[int, Sequence[VolumeRow]],
                 listing: Mapping[str, ObjectInfo]) -> list[Damage]:
    """The damage of ``chain``'s streams, condemned ones skipped (pure): ``volumes`` are the
    catalog's rows by stream id, ``listing`` a listing covering the chain's prefixes."""
    return [damage for damage in (stream_damage(stream, volumes.get(stream.id, ()), listing)
                                  for stream in chain if stream.state != "condemned")
            if damage is not None]


def mark_bad(catalog: Catalog, stream: StreamRow, problem: str, now: dt.datetime, *,
             job: str | None, action: str) -> bool:
    """Mark ``stream`` ``bad`` with its reason (:func:`bad_reason`, which every refusal
    to restore or extend it then states) and emit a ``failure`` event naming it (an
    alert: a chain lost restorable snapshots). A stream already bad (or condemned) is
    left alone, so repeated audits raise one alert, not one per run, and the first
    reason stays.

    Args:
        catalog: where the state is written.
        stream: the stream (its state as last read).
        problem: what is wrong with the stream itself, naming each object's key
            (``Damage.what``, an audit's finding, zfs receive's refusal); not the
            stream's own id, which messages add.
        now: aware UTC.
        job / action: who found it (``archive``, ``audit``, ``restore``), for the reason
            and the event.

    Returns:
        True when the stream was marked now; False when it was bad or condemned already
        (also when ``stream.state`` is older than the catalog's).

    Raises:
        CatalogError: the catalog failed.
    """
    if stream.state not in MARKABLE_STATES:
        return False
    try:
        catalog.set_stream_state(stream.id, "bad", now, reason=bad_reason(problem, action, now))
    except CatalogConflict:
        return False
    message = (f"stream {stream.id} ({stream.kind} @{stream.to_name} of"
               f" {stream.host}:{stream.dataset}) in store {stream.store} is marked bad:"
               f" {problem}. It and every stream after it in its chain can no longer be"
               " restored from this store; `zbak archive` starts a new full")
    emit(Event("failure", job, action, f"{stream.store}:{stream.dataset}", message, now))
    return True
