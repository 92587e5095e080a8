"""What a hook is told: its ``ZBAK_*`` environment variables (pure).

Every hook gets ``ZBAK_HOOK`` (``pre`` or ``post``), ``ZBAK_ACTION`` (``snapshot``,
``replicate``, ``archive``, ``prune``, ``audit``), ``ZBAK_JOB``, ``ZBAK_HOST`` (the source's
``[hosts]`` name, ``local`` for this machine), ``ZBAK_DATASET`` (the job's dataset),
``ZBAK_TARGETS`` (replicate: the targets; archive and prune: the store; one per line) and
``ZBAK_TIMEOUT`` (seconds). A post hook also gets what happened: ``ZBAK_RESULT`` (``ok``,
``partial``, ``failed``, ``aborted`` when a failed pre hook stopped the action,
``interrupted``), ``ZBAK_PRE_RESULT`` (``ok``, ``failed``, ``none``), ``ZBAK_ERROR`` (the
action's error or warnings, empty when none), ``ZBAK_BYTES`` (bytes moved), ``ZBAK_DATASETS``
(the datasets the action covered, one per line: ZFS names may hold spaces) and
``ZBAK_SNAPSHOT`` (snapshot: the one taken; replicate: the newest snapshot now on the
targets; archive: the newest snapshot archived; empty otherwise). The names hold no secret
word, so ``proc.childenv`` passes them; nothing else zbak knows is added.
"""

from __future__ import annotations

import dataclasses

ERROR_CHARS = 4000
"""``ZBAK_ERROR`` is cut to this many characters."""
RESULTS = ("ok", "partial", "failed", "aborted", "interrupted")


@dataclasses.dataclass(frozen=True)
class Facts:
    """What every hook of one action run is told.

    Attributes:
        action: the action (``DAEMON_ACTIONS``).
        job: the ``[jobs.NAME]`` key.
        host: the source's host name (``local``: this machine).
        dataset: the job's source dataset (``POOL/PATH``).
        targets: replication targets, or the store, as the config writes them.
    """

    action: str
    job: str
    host: str
    dataset: str
    targets: tuple[str, ...] = ()


@dataclasses.dataclass
class Outcome:
    """What the action did, for the post hook; the action fills it in while it runs.

    Attributes:
        result: one of ``RESULTS``.
        error: the action's error or warnings, None when none.
        bytes: bytes moved.
        datasets: the datasets the action covered.
        snapshot: see ``ZBAK_SNAPSHOT`` in the module doc.
    """

    result: str = "ok"
    error: str | None = None
    bytes: int = 0
    datasets: tuple[str, ...] = ()
    snapshot: str | None = None


def variables(phase: str, facts: Facts, timeout: float, *, outcome: Outcome | None = None,
              pre_result: str = "none") -> dict[str, str]:
    """The hook's ``ZBAK_*`` variables (see the module doc).

    Args:
        phase: ``pre`` or ``post``.
        facts: the action run's facts.
        timeout: the hook's timeout in seconds.
        outcome: for ``post``, what the action did.
        pre_result: for ``post``, ``ok``/``failed`` of the pre hook, ``none`` without one.
    """
    found = {
        "ZBAK_HOOK": phase,
        "ZBAK_ACTION": facts.action,
        "ZBAK_JOB": facts.job,
        "ZBAK_HOST": facts.host,
        "ZBAK_DATASET": facts.dataset,
        "ZBAK_TARGETS": "\n".join(facts.targets),
        "ZBAK_TIMEOUT": f"{timeout:g}",
    }
    if outcome is not None:
        found.update({
            "ZBAK_RESULT": outcome.result,
            "ZBAK_PRE_RESULT": pre_result,
            "ZBAK_ERROR": (outcome.error or "")[:ERROR_CHARS],
            "ZBAK_BYTES": str(outcome.bytes),
            "ZBAK_DATASETS": "\n".join(outcome.datasets),
            "ZBAK_SNAPSHOT": outcome.snapshot or "",
        })
    # execve(2) cannot pass a NUL byte; no zbak message holds one, but a name could.
    return {key: value.replace("\x00", "") for key, value in found.items()}
