"""What an audit reports: findings, each saying what is wrong, where, and what to do."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class Severity(enum.StrEnum):
    """How bad a finding is. ``error``: a retained snapshot is (or may be) unrestorable or the
    catalog contradicts the store; ``warning``: something needs attention soon (an unfinished
    prune, a lagging archive); ``info``: worth knowing, nothing wrong (leftover objects).
    ``zbak audit`` exits 4 when any finding is a warning or an error."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem found by an audit level.

    Attributes:
        severity: see :class:`Severity`.
        level: ``graph`` (catalog only), ``objects`` (store listing and manifests) or
            ``deep`` (volume contents, test receives).
        problem: what is wrong, in a sentence naming the objects involved.
        action: what to do about it.
        job: the job audited (filled by the driver).
        host / dataset: the source dataset (``host`` "local" for this machine).
        store: the store's name in the config.
        chain: the id of the full stream the stream's chain starts at (None: no full found).
        stream: the stream's catalog id.
        key: the object key in ``store``.
        target: the replica target (config string) for cursor findings.
    """

    severity: Severity
    level: str
    problem: str
    action: str
    job: str | None = None
    host: str | None = None
    dataset: str | None = None
    store: str | None = None
    chain: int | None = None
    stream: int | None = None
    key: str | None = None
    target: str | None = None

    @property
    def wrong(self) -> bool:
        """True for warnings and errors (what makes ``zbak audit`` exit 4)."""
        return self.severity is not Severity.INFO

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form (severity as its string)."""
        data = dataclasses.asdict(self)
        data["severity"] = self.severity.value
        return data
