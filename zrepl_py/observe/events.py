"""Operational events (failure, recovery, staleness, budget, degraded pool) and their sinks.

Producers (``runlog.recorded_run``, the daemon's health checks, ``alerts.staleness``) call
``emit(event)``; every registered sink gets it. With no sink registered the event is only
logged, so a manual ``zbak replicate`` without ``[alerts]`` still leaves a trace.
A failing sink is logged and never stops the other sinks or the run that emitted the event.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Literal

log = logging.getLogger(__name__)

EventKind = Literal["failure", "recovery", "stale", "budget", "degraded"]
EVENT_KINDS: tuple[str, ...] = ("failure", "recovery", "stale", "budget", "degraded")


@dataclasses.dataclass(frozen=True)
class Event:
    """One thing an operator should hear about.

    Attributes:
        kind: ``failure`` (a run ended failed), ``recovery`` (first success after a failure
            of the same job/action/target), ``stale`` (no success within ``stale_after``),
            ``budget`` (held replication bases past the protection budget), ``degraded``
            (a pool is not ONLINE, or under its free-space floor).
        job: the ``[jobs.NAME]`` key, or None for host-wide events (a degraded pool).
        action: ``snapshot``/``replicate``/``archive``/``prune``/``audit``/``health``, or None.
        target: the replication target, store, host or pool concerned, or None.
        message: one line for a human; never contains a secret.
        time: when it happened, aware UTC.
    """

    kind: EventKind
    job: str | None
    action: str | None
    target: str | None
    message: str
    time: dt.datetime

    def as_dict(self) -> dict[str, str | None]:
        """The event as JSON-ready strings (``time`` in ISO 8601 with ``+00:00``)."""
        return {"kind": self.kind, "job": self.job, "action": self.action,
                "target": self.target, "message": self.message, "time": self.time.isoformat()}


Sink = Callable[[Event], None]
"""Receives events; may raise (the error is logged and the other sinks still run)."""

_sinks: list[Sink] = []
_lock = threading.Lock()


def register(sink: Sink) -> Callable[[], None]:
    """Add ``sink`` to the sinks every ``emit`` calls; returns a function that removes it."""
    with _lock:
        _sinks.append(sink)

    def unregister() -> None:
        with _lock:
            if sink in _sinks:
                _sinks.remove(sink)

    return unregister


def emit(event: Event, *, reported: bool = False) -> None:
    """Log ``event`` (WARNING, INFO for a recovery) and hand it to every registered sink.

    Args:
        event: what happened.
        reported: the producer shows it already (an error the command prints, a line it
            logs): the event is then logged at DEBUG, so a failure is one line on stderr.

    Never raises: an alert channel that is down must not turn a good run into a failed one.
    """
    level = logging.INFO if event.kind == "recovery" else logging.WARNING
    if reported:
        level = logging.DEBUG
    log.log(level, "event %s: job=%s action=%s target=%s: %s", event.kind, event.job,
            event.action, event.target, event.message)
    with _lock:
        sinks = list(_sinks)
    for sink in sinks:
        try:
            sink(event)
        except Exception as exc:  # a sink must never break the emitter
            log.error("alert sink %s failed for %s event: %s",
                      getattr(sink, "__name__", type(sink).__name__), event.kind, exc)
