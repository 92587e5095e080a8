"""Pre and post hooks around one action run of one job (``[jobs.NAME.hooks.ACTION]``).

``ActionHooks`` is entered by the action right after it took its lock (a run that finds the
lock held runs no hook) and before it records its own run. Entering runs ``pre``; leaving
runs ``post``, whatever happened in between (zrepl #392: an ``xfs_freeze -f`` in ``pre``
needs its ``xfs_freeze -u`` in ``post`` even when ``pre`` timed out or the action failed):

- ``pre`` fails, ``on_pre_failure = "abort"``: the action does not run; ``post`` runs with
  ``ZBAK_RESULT=aborted``, then ``HookFailed`` is raised.
- ``pre`` fails, ``on_pre_failure = "continue"``: the action runs; after ``post``,
  ``HookFailed`` is raised (the action's own result stays as it was recorded).
- the action raises: ``post`` runs with ``ZBAK_RESULT=failed`` (``interrupted`` for
  SIGTERM or Ctrl-C) and the action's error propagates.
- ``post`` fails after a good action: ``HookFailed``.

Each hook command is a run of its own in the catalog (action ``hook``, target
``pre-ACTION`` or ``post-ACTION``, ``observe.runlog``), so a failing hook is a failed run with
a ``failure`` alert, and the next good one sends the ``recovery``. A post hook still runs
when its run cannot be recorded (the catalog is down): undoing the pre hook matters more;
its failure is then alerted directly. Dry runs run no hook.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING

from zrepl_py.clock import Clock
from zrepl_py.config.jobs import HookConfig
from zrepl_py.errors import CatalogError, HookFailed, PipelineCancelled
from zrepl_py.hooks.command import run_command
from zrepl_py.hooks.environment import Facts, Outcome, variables
from zrepl_py.observe.events import Event, emit
from zrepl_py.observe.runlog import RunSet

if TYPE_CHECKING:
    from zrepl_py.catalog.repository import Catalog

log = logging.getLogger(__name__)


class ActionHooks:
    """The hooks of one action run (see the module doc); a no-op without hooks or in a dry run.

    Args:
        config: the action's ``HookConfig``, or None when it has no hooks.
        catalog / clock: where and when hook runs are recorded.
        facts: what every hook is told (``hooks.environment``).
        dry_run: the action changes nothing: no hook runs.

    Attributes:
        outcome: what the action did; the action fills it in for the post hook (its result
            and error are set from an exception leaving the block).
    """

    def __init__(self, config: HookConfig | None, catalog: Catalog, clock: Clock, facts: Facts,
                 *, dry_run: bool = False):
        self.config = None if dry_run else config
        self.catalog, self.clock, self.facts = catalog, clock, facts
        self.outcome = Outcome()
        self._pre = "none"
        self._problems: list[str] = []

    def __enter__(self) -> ActionHooks:
        """Run ``pre`` (when configured).

        Raises:
            HookFailed: ``pre`` failed and ``on_pre_failure`` is ``abort`` (``post`` ran).
            KeyboardInterrupt: zbak was interrupted during ``pre`` (``post`` ran).
        """
        if self.config is None or self.config.pre is None:
            return self
        try:
            problem = self._run("pre", self.config.pre, variables(
                "pre", self.facts, self._timeout()))
        except BaseException:
            self.outcome.result = "interrupted"
            self._post()
            raise
        self._pre = "failed" if problem else "ok"
        if problem is None:
            return self
        what = f"the pre-{self.facts.action} hook of job {self.facts.job} failed: {problem}"
        if self.config.on_pre_failure == "abort":
            self.outcome.result = "aborted"
            self.outcome.error = f"not run: {what}"
            self._post()
            raise HookFailed(f"{what}; {self.facts.action} not run (on_pre_failure = abort)"
                             + self._post_note())
        self._problems.append(what + f"; {self.facts.action} ran anyway"
                              " (on_pre_failure = continue)")
        return self

    def __exit__(self, _type: type[BaseException] | None, exc: BaseException | None,
                 _tb: TracebackType | None) -> None:
        """Run ``post``; raise ``HookFailed`` for a hook failure after a good action.

        Raises:
            HookFailed: see the module doc (never over the action's own exception).
        """
        if self.config is None:
            return
        if exc is not None:
            self.outcome.result = ("interrupted" if isinstance(exc, (KeyboardInterrupt,
                                                                     PipelineCancelled))
                                   else "failed")
            self.outcome.error = str(exc) or type(exc).__name__
        self._post()
        if exc is None and self._problems:
            raise HookFailed("; ".join(self._problems))

    def _timeout(self) -> float:
        assert self.config is not None
        return self.config.timeout.total_seconds()

    def _post(self) -> None:
        """Run ``post`` (when configured); a failure joins ``_problems``."""
        assert self.config is not None
        if self.config.post is None:
            return
        problem = self._run("post", self.config.post, variables(
            "post", self.facts, self._timeout(), outcome=self.outcome, pre_result=self._pre))
        if problem is not None:
            self._problems.append(f"the post-{self.facts.action} hook of job {self.facts.job}"
                                  f" failed: {problem}")

    def _post_note(self) -> str:
        return f"; {self._problems[-1]}" if self._problems else ""

    def _run(self, phase: str, argv: list[str], env: dict[str, str]) -> str | None:
        """Run one hook command as a recorded run; return its problem, None when it succeeded."""
        target = f"{phase}-{self.facts.action}"
        label = f"{target} hook of job {self.facts.job}"
        try:
            runs: RunSet | None = RunSet(self.catalog, self.clock, self.facts.job, "hook",
                                         [target])
        except CatalogError as exc:
            log.error("%s: its run cannot be recorded (%s); running it anyway", label, exc)
            runs = None
        try:
            outcome = run_command(argv, env, timeout=self._timeout(), label=label)
        except BaseException as exc:
            if runs is not None:
                runs.close(exc)
            raise
        if outcome.problem is not None:
            log.error("%s failed: %s", label, outcome.problem)
        if runs is None:
            if outcome.problem is not None:
                emit(Event("failure", self.facts.job, "hook", target,
                           f"{label} failed: {outcome.problem}", self.clock.now()))
            return outcome.problem
        if outcome.problem is not None:
            runs.records[target].result = "failed"
            runs.records[target].error = outcome.problem
        try:
            runs.close()
        except CatalogError as exc:
            log.error("%s: its end cannot be recorded: %s", label, exc)
        return outcome.problem
