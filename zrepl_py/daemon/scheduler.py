"""``Daemon``: APScheduler 3 wiring for ``zbak daemon`` (docs/design.md#operations).

- One APScheduler job per (job, action) of the config (``daemon.plan``), stored in the
  catalog database (``daemon.store``), with ``coalesce=True``, ``max_instances=1`` and
  ``misfire_grace_time`` from ``[daemon]`` (unset: no limit). At start-up the scheduler
  starts paused, the stored jobs are reconciled with the config (unchanged ones keep their
  stored next-run time; changed ones are rescheduled; removed ones deleted), then it resumes:
  a stored next-run time in the past is a run missed while the daemon was down, and
  APScheduler runs it once (all missed fire times coalesced into one run).
- A run is ``zbak ACTION JOB`` in a child process (``daemon.child``): it takes the same
  per-dataset lock as a manual run; when a manual run holds it, the child exits 3 and the
  daemon logs the run as skipped. The daemon's own runs of one dataset queue in order
  (``daemon.gate``) instead of skipping each other.
- ``stop()`` (SIGTERM/SIGINT from ``zbak daemon``): no new run starts, queued runs give up,
  running children get SIGTERM (they stop their transfers cleanly and record the run as
  failed), and after ``[daemon] stop_timeout`` any still running are killed. A run that was
  interrupted, or was still queued at its dataset's gate, is set due again (its next-run
  time goes back to when it was due), so the next start-up runs it once more; the shutdown
  waits for every run's worker to record that before it writes the times back, so none is
  missed. ``run()`` then returns OK.

Other parts of zbak hook in before ``run()``: ``add_task`` (an in-process periodic call, not
persisted: staleness checks) and ``after_run`` (called after every run: metrics).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from zrepl_py.config.daemon import DAEMON_ACTIONS
from zrepl_py.config.schema import Config
from zrepl_py.daemon import child
from zrepl_py.daemon.gate import Gate
from zrepl_py.daemon.logs import RunLogger, run_logger
from zrepl_py.daemon.plan import base_action, make_trigger, missed_runs, plan_entries, split_id
from zrepl_py.errors import ExitStatus
from zrepl_py.invocation.context import lock_key
from zrepl_py.proc import spawn

if TYPE_CHECKING:  # APScheduler 3 has no type information: these are Any to mypy
    from apscheduler.events import JobEvent
    from apscheduler.schedulers.base import BaseScheduler

log = logging.getLogger(__name__)
UTC = dt.UTC
RUN_FUNCTION = "zrepl_py.daemon.scheduler:run_scheduled"
"""What the stored jobs call (a textual reference: the job store pickles it by name)."""
TASK_PREFIX = "task:"
HOOK_GRACE = 5.0
"""Seconds ``stop()`` waits past the children's exit for runs to finish reporting."""
_current: Daemon | None = None


def run_scheduled(job: str, action: str) -> None:
    """The function every stored job calls: run ``action`` of ``job`` in the running daemon."""
    daemon = _current
    if daemon is None:
        log.warning("%s of job %s fired outside a running daemon: ignored", action, job)
        return
    daemon.run_action(job, action)


def job_defaults(grace: int | None) -> dict[str, object]:
    """APScheduler job defaults (docs/reliability.md#r30-scheduler): one instance per job
    (``max_instances=1``: a run longer than its interval does not start a second), missed fire
    times coalesced into one run (``coalesce=True``), and a late run still runs unless ``grace``
    seconds late (``misfire_grace_time``; None: always; zfs_uploader #49)."""
    return {"coalesce": True, "max_instances": 1, "misfire_grace_time": grace}


@dataclasses.dataclass
class _Running:
    popen: spawn.Popen[str]
    started: dt.datetime


class Daemon:
    """The scheduler of one ``zbak daemon`` process.

    Args:
        config: the validated config.
        config_path: its file; children run ``zbak --config PATH ...`` with it.
        env: the children's environment (default: this process's); ``ZBAK_LOG_LEVEL`` is
            set from ``log_level`` unless present.
        debug: run children with ``--debug``.
    """

    def __init__(self, config: Config, config_path: Path, *, env: Mapping[str, str] | None = None,
                 debug: bool = False):
        self.config = config
        self.config_path = Path(config_path).absolute()
        self.debug = debug
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("ZBAK_LOG_LEVEL", "DEBUG" if debug else config.log_level)
        self.entries = plan_entries(config)
        self._gates = {lock_key(job): Gate() for job in config.jobs.values()}
        self._tasks: list[tuple[str, float, Callable[[], object]]] = []
        self._after_run: list[Callable[[str, str, int], None]] = []
        self._stop_requested = False
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._due: dict[str, dt.datetime] = {}  # job id -> due time of its latest run
        self._interrupted: dict[str, dt.datetime] = {}  # job id -> that due time
        self._inside = 0  # run_action calls not yet returned (running, queued or reporting)
        self._idle = threading.Condition(self._lock)
        self.scheduler = None

    # -- extension ---------------------------------------------------------------------

    def add_task(self, task_id: str, seconds: float, func: Callable[[], object]) -> None:
        """Call ``func()`` every ``seconds`` while the daemon runs (first call one interval
        after start), in a worker thread; an exception is logged. Not persisted. Call
        before ``run()``."""
        self._tasks.append((TASK_PREFIX + task_id, seconds, func))

    def after_run(self, callback: Callable[[str, str, int], None]) -> None:
        """Call ``callback(job, action, exit_status)`` after every run (e.g. to rewrite a
        metrics textfile), in the run's worker thread; an exception is logged."""
        self._after_run.append(callback)

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask ``run()`` to shut down (safe from a signal handler: it only sets a flag)."""
        self._stop_requested = True

    def run(self) -> ExitStatus:
        """Schedule until ``stop()``; then stop running actions (see the module doc).

        Returns:
            ExitStatus.OK after a clean shutdown.

        Raises:
            CatalogNotCurrent, CatalogUnavailable: the catalog is not usable (`zbak init`).
        """
        global _current
        from apscheduler.events import (
            EVENT_JOB_ERROR,
            EVENT_JOB_MAX_INSTANCES,
            EVENT_JOB_MISSED,
            EVENT_JOB_SUBMITTED,
        )
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.jobstores.memory import MemoryJobStore
        from apscheduler.schedulers.background import BackgroundScheduler

        from zrepl_py.catalog.db import make_engine, require_current
        from zrepl_py.daemon.store import job_store, table_name

        engine = make_engine(self.config.catalog_url)
        try:
            require_current(engine)
            workers = len(self.entries) + len(self._tasks) + 2
            scheduler = BackgroundScheduler(
                timezone=UTC,
                jobstores={"default": job_store(engine, self.config.daemon),
                           "internal": MemoryJobStore()},
                executors={"default": ThreadPoolExecutor(workers)},
                job_defaults=job_defaults(self._grace()),
            )  # fmt: skip
            self.scheduler = scheduler
            scheduler.add_listener(self._on_event, EVENT_JOB_SUBMITTED | EVENT_JOB_MISSED
                                   | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_ERROR)
            _current = self
            scheduler.start(paused=True)
            try:
                self._reconcile(scheduler)
                for task_id, seconds, func in self._tasks:
                    scheduler.add_job(_guarded(task_id, func), "interval", seconds=seconds,
                                      id=task_id, name=task_id, jobstore="internal")
                scheduler.resume()
                log.info("daemon started: %d scheduled actions in table %s of %s",
                         len(self.entries), table_name(self.config.daemon),
                         engine.url.render_as_string(hide_password=True))
                while not self._stop_requested:
                    time.sleep(0.2)
                log.info("stopping: no new runs; running ones are asked to stop")
                scheduler.pause()
                self._shutdown_runs()
                with self._lock:
                    again = sorted(self._interrupted.items())
                for job_id, due in again:
                    scheduler.modify_job(job_id, jobstore="default", next_run_time=due)
                    log.info("%s did not finish: due again at the next start (due at %s)",
                             job_id, due.astimezone(UTC).isoformat())
            finally:
                if not self._stopping.is_set():  # an error above: still stop the children
                    self._shutdown_runs()
                # APScheduler 3.11's loop runs one more _process_jobs when shutdown() wakes
                # it (state STOPPED, no longer PAUSED): without its stores it finds nothing
                # to submit to the stopped executor, and the stored times stay as set here.
                for alias in ("default", "internal"):
                    scheduler.remove_jobstore(alias)
                scheduler.shutdown(wait=True)
                _current = None
        finally:
            engine.dispose()
        log.info("daemon stopped")
        return ExitStatus.OK

    def _grace(self) -> int | None:
        grace = self.config.daemon.misfire_grace_time
        return None if grace is None else max(1, int(grace.total_seconds()))

    def _reconcile(self, scheduler: BaseScheduler) -> None:
        """Make the stored jobs match ``self.entries`` (see the module doc)."""
        now = dt.datetime.now(UTC)
        stored = {job.id: job for job in scheduler.get_jobs(jobstore="default")}
        for entry in self.entries:
            trigger = make_trigger(entry)
            job = stored.pop(entry.id, None)
            if job is not None and job.name != entry.name:
                log.info("%s: schedule changed to %s", entry.id, entry.schedule)
                scheduler.remove_job(entry.id, jobstore="default")
                job = None
            if job is None:
                scheduler.add_job(RUN_FUNCTION, trigger, args=(entry.job, entry.action),
                                  id=entry.id, name=entry.name, jobstore="default",
                                  misfire_grace_time=self._grace())  # fmt: skip
                continue
            if job.misfire_grace_time != self._grace():
                scheduler.modify_job(entry.id, jobstore="default",
                                     misfire_grace_time=self._grace())
            if type(job.trigger) is not type(trigger):
                # Stored by an older zbak (APScheduler's CronTrigger): the one parser from now on.
                scheduler.modify_job(entry.id, jobstore="default", trigger=trigger)
            if job.next_run_time is not None and job.next_run_time <= now:
                missed = missed_runs(trigger, job.next_run_time, now)
                run_logger(log, entry.job, entry.action).warning(
                    "missed while the daemon was down: %d run(s) since %s; catching up once",
                    missed, job.next_run_time.astimezone(UTC).isoformat())
        for job_id in stored:
            log.info("%s is no longer in the config: removed from the schedule", job_id)
            scheduler.remove_job(job_id, jobstore="default")

    def _on_event(self, event: JobEvent) -> None:
        from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MISSED, EVENT_JOB_SUBMITTED

        if event.job_id.startswith(TASK_PREFIX) and event.code != EVENT_JOB_ERROR:
            return
        job, action = split_id(event.job_id)
        logger = run_logger(log, job or None, action or None)
        if event.code == EVENT_JOB_SUBMITTED:
            with self._lock:
                self._due[event.job_id] = event.scheduled_run_times[-1]
            due = event.scheduled_run_times[-1].astimezone(UTC).isoformat()
            logger.info("due at %s", due, extra={"scheduled": due})
        elif event.code == EVENT_JOB_MISSED:
            due = event.scheduled_run_time.astimezone(UTC).isoformat()
            logger.warning("the run due at %s is later than misfire_grace_time: not run", due,
                           extra={"scheduled": due})
        elif event.code == EVENT_JOB_ERROR:
            logger.error("scheduled call failed: %s", event.exception)
        else:
            logger.warning("the previous run is still going: this one is skipped")

    # -- runs --------------------------------------------------------------------------

    def run_action(self, job: str, action: str) -> None:
        """Run ``zbak ACTION JOB`` once, after the job's earlier runs in this daemon.

        A run still waiting for its turn when the daemon stops is not started; like an
        interrupted run it is set due again, so the next start runs it (``run``)."""
        with self._lock:
            self._inside += 1
        try:
            self._run(job, action)
        finally:
            with self._lock:
                self._inside -= 1
                self._idle.notify_all()

    def _not_started(self, job_id: str, logger: RunLogger) -> None:
        with self._lock:
            due = self._due.get(job_id) or dt.datetime.now(UTC)
            self._interrupted.setdefault(job_id, due)
        logger.info("not started: the daemon is stopping; due again at the next start")

    def _run(self, job: str, action: str) -> None:
        logger = run_logger(log, job, action)
        job_id = f"{job}:{action}"
        config = self.config.jobs.get(job)
        if config is None:
            return
        if self._stopping.is_set():
            self._not_started(job_id, logger)
            return
        gate = self._gates[lock_key(config)]
        if not gate.acquire(DAEMON_ACTIONS.index(base_action(action)), self._stopping):
            self._not_started(job_id, logger)
            return
        try:
            with self._lock:
                stopping = self._stopping.is_set()
                if not stopping:
                    argv = child.action_argv(self.config_path, action, job, debug=self.debug)
                    running = _Running(child.start(argv, self.env), dt.datetime.now(UTC))
                    self._running[job_id] = running
            if stopping:
                self._not_started(job_id, logger)
                return
            logger.info("started (pid %d)", running.popen.pid)
            began = time.monotonic()
            code, messages = child.wait(running.popen, job, action)
            seconds = time.monotonic() - began
        finally:
            gate.release()
            with self._lock:
                self._running.pop(job_id, None)
                self._idle.notify_all()
        self._report(job_id, logger, code, seconds, messages, running.started)
        for callback in self._after_run:
            try:
                callback(job, action, code)
            except Exception:  # a hook's failure must not stop the daemon
                logger.exception("after-run hook %r failed", callback)

    def _report(self, job_id: str, logger: RunLogger, code: int, seconds: float, messages: list[str],
                started: dt.datetime) -> None:
        if code != ExitStatus.OK and self._stopping.is_set():
            with self._lock:
                self._interrupted[job_id] = self._due.get(job_id, started)
            logger.warning("interrupted by shutdown after %.1f s (exit %d)", seconds, code)
        else:
            child.log_exit(logger, split_id(job_id)[0], code, seconds, messages)

    def _shutdown_runs(self) -> None:
        """Stop queued and running runs: SIGTERM, wait ``stop_timeout``, then SIGKILL."""
        with self._lock:
            self._stopping.set()
            running = list(self._running.values())
        for run in running:
            child.terminate(run.popen)
        deadline = time.monotonic() + self.config.daemon.stop_timeout.total_seconds()
        with self._lock:
            while self._running and time.monotonic() < deadline:
                self._idle.wait(0.2)
            late = list(self._running.values())
        for run in late:
            log.warning("pid %d did not stop within stop_timeout: killed", run.popen.pid)
            child.kill(run.popen)
        with self._lock:
            while self._running:
                self._idle.wait(0.2)
            # Then every worker returns (queued ones give up within Gate.SETTLE + its poll),
            # after recording its due-again time; an after-run hook gets until the deadline.
            settle = max(deadline, time.monotonic() + HOOK_GRACE)
            while self._inside and time.monotonic() < settle:
                self._idle.wait(0.2)
            if self._inside:
                log.warning("%d run(s) still in after-run hooks: not waiting for them", self._inside)


def _guarded(task_id: str, func: Callable[[], object]) -> Callable[[], None]:
    def call() -> None:
        try:
            func()
        except Exception:  # a task's failure must not stop the daemon
            log.exception("daemon task %s failed", task_id)

    return call
