"""The daemon's log lines: human (``time LEVEL logger: [job action] message``) or JSON lines.

JSON lines carry one object per line with the keys ``time`` (ISO 8601 UTC, milliseconds),
``level``, ``logger``, ``message``, ``job`` and ``action`` (null outside a run), plus
``scheduled`` (the run's due time) where known and ``exception`` for a traceback. Records
get ``job``/``action`` from the ``extra`` of the logging call (``run_logger``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any

from zrepl_py.runtime.logsetup import setup_logging

UTC = dt.UTC
_EXTRA_KEYS = ("scheduled",)


def _iso(created: float) -> str:
    return dt.datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per record (see the module doc); never more than one line."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one line of JSON."""
        data = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "job": getattr(record, "job", None),
            "action": getattr(record, "action", None),
        }
        for key in _EXTRA_KEYS:
            if getattr(record, key, None) is not None:
                data[key] = getattr(record, key)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False, default=str)


class HumanFormatter(logging.Formatter):
    """``2026-01-02T03:04:05Z INFO zrepl_py.daemon: [job action] message`` (UTC)."""

    converter = staticmethod(time.gmtime)

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s",
                         datefmt="%Y-%m-%dT%H:%M:%SZ")

    def format(self, record: logging.LogRecord) -> str:
        """Return the record with ``[job action]`` before its message when it has them."""
        text = super().format(record)
        job, action = getattr(record, "job", None), getattr(record, "action", None)
        if job or action:
            head = f"{record.name}: "
            at = text.find(head)
            if at >= 0:
                tag = " ".join(str(v) for v in (job, action) if v)
                text = f"{text[:at + len(head)]}[{tag}] {text[at + len(head):]}"
        return text


def configure(log_format: str, level: str) -> None:
    """Set the root logger to ``level`` with one stderr handler in ``log_format``
    (``human`` or ``json``), keeping ``logsetup``'s pins on the wire loggers. APScheduler
    logs only errors unless ``level`` is DEBUG: the daemon logs its runs, skips and misses
    itself, with job and action."""
    setup_logging(level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLinesFormatter() if log_format == "json" else HumanFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    logging.getLogger("apscheduler").setLevel(logging.DEBUG if level == "DEBUG" else logging.ERROR)


RunLogger = logging.LoggerAdapter[logging.Logger]
"""A logger that adds a run's job and action to each record (``run_logger``)."""


class _RunAdapter(RunLogger):
    """Adds job/action and keeps a call's own ``extra`` (3.11's adapter drops it)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]
                ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def run_logger(logger: logging.Logger, job: str | None, action: str | None) -> RunLogger:
    """``logger`` with ``job`` and ``action`` attached to every record (a call may add
    ``extra={"scheduled": ...}``)."""
    return _RunAdapter(logger, {"job": job, "action": action})
