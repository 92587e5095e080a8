"""``zbak daemon --once``: run every action that is due now, one after the other, and exit
(for a systemd timer or cron instead of the long-running daemon).

An action of a job is due (``due_entries``, pure over the plan and the catalog's runs)
when its schedule (``daemon.plan``: the job's cron lines, ``[daemon] prune_schedule`` /
``audit_schedule``, or ``[daemon] every``) fired since its newest recorded run started, or
when it never ran; with ``[daemon] misfire_grace_time``, only a fire time within that grace
counts (later ones are skipped, as the daemon skips them). However many fire times were
missed, the action runs once (coalesced, like the daemon's catch-up). A run that left no
row (it found the dataset locked, or a pre hook aborted it) is due again next time.

Each run is the daemon's child, ``zbak ACTION JOB`` (``daemon.child``): the same command,
lock, catalog records, hooks and alerts as a manual run, its log lines relayed. Due runs go
in the plan's order: jobs in config order, each job's actions snapshot first, audit last.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from zrepl_py.catalog.rows import RunRow
from zrepl_py.daemon import child
from zrepl_py.daemon.logs import run_logger
from zrepl_py.daemon.plan import Entry, copy_action, make_trigger
from zrepl_py.errors import ExitStatus
from zrepl_py.proc import spawn

log = logging.getLogger(__name__)
UTC = dt.UTC
FINE = frozenset({ExitStatus.OK, ExitStatus.LOCKED, ExitStatus.THAW_PENDING})
"""Exit statuses of a run that do not make ``--once`` fail: done, skipped because a manual
run held the lock (it runs again next time), waiting for a thaw (the next run goes on)."""


def last_starts(runs: Iterable[RunRow]) -> dict[tuple[str, str], dt.datetime]:
    """The newest start of each (job, action) among ``runs``, over all its targets; a copy
    counts per store copied to (action ``copy:STORE``: its runs' targets are
    ``STORE:DATASET``)."""
    found: dict[tuple[str, str], dt.datetime] = {}
    for run in runs:
        key = (run.job, run.action if run.action != "copy" or run.target is None
               else copy_action(run.target.partition(":")[0]))
        if key not in found or run.started_at > found[key]:
            found[key] = run.started_at
    return found


def due_entries(entries: Sequence[Entry], started: Mapping[tuple[str, str], dt.datetime],
                now: dt.datetime, grace: dt.timedelta | None) -> list[Entry]:
    """The entries due at ``now`` (see the module doc), in the order of ``entries``.

    Args:
        entries: the plan (``daemon.plan.plan_entries``).
        started: ``last_starts`` of the catalog's runs.
        now: aware UTC.
        grace: ``[daemon] misfire_grace_time``, or None (any missed fire time counts).
    """
    due = []
    for entry in entries:
        last = started.get((entry.job, entry.action))
        if last is None:
            due.append(entry)
            continue
        since = last + dt.timedelta(microseconds=1)
        if grace is not None:
            since = max(since, now - grace)
        fire = make_trigger(entry).get_next_fire_time(None, since)
        if fire is not None and fire <= now:
            due.append(entry)
    return due


def run_entries(entries: Sequence[Entry], config_path: Path, env: Mapping[str, str], *,
                debug: bool = False, stop_timeout: float = 30.0) -> ExitStatus:
    """Run each entry as ``zbak ACTION JOB`` in turn (``daemon.child``), logging how each ended.

    Args:
        entries: the runs to make, in order.
        config_path: the config file the children read.
        env: the children's environment (they read the store and alert secrets).
        debug: run the children with ``--debug``.
        stop_timeout: seconds an interrupted child gets to stop before it is killed.

    Returns:
        OK when every run ended in ``FINE``, else FAILED (every run was still made).

    Raises:
        KeyboardInterrupt: zbak was interrupted (SIGTERM, Ctrl-C); the running child got
            SIGTERM and up to ``stop_timeout`` seconds to stop cleanly (it records its run
            as failed), then SIGKILL.
    """
    worst = ExitStatus.OK
    for entry in entries:
        logger = run_logger(log, entry.job, entry.action)
        popen = child.start(child.action_argv(config_path, entry.action, entry.job,
                                              debug=debug), env)
        logger.info("started (pid %d)", popen.pid)
        began = time.monotonic()
        try:
            code, messages = child.wait(popen, entry.job, entry.action)
        except BaseException:
            child.terminate(popen)
            try:
                popen.wait(stop_timeout)
            except spawn.TimeoutExpired:
                child.kill(popen)
            raise
        child.log_exit(logger, entry.job, code, time.monotonic() - began, messages)
        if code not in FINE:
            worst = ExitStatus.FAILED
    return worst
