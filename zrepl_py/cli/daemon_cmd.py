"""``zbak daemon``: run the scheduler in the foreground until SIGTERM or SIGINT (systemd
``Type=simple``); exits 0 after a clean stop. See ``zrepl_py.daemon``."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import click

from zrepl_py.cli.common import Invocation, pass_invocation
from zrepl_py.config.extras import require_for_config
from zrepl_py.errors import ExitStatus
from zrepl_py.runtime.gcpause import end_startup

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from zrepl_py.alerts.dispatch import Dispatcher
    from zrepl_py.config.schema import Config
    from zrepl_py.daemon.scheduler import Daemon

log = logging.getLogger(__name__)


@click.command("daemon")
@click.option("--log-format", type=click.Choice(["human", "json"]), default=None,
              help="Log lines as text or one JSON object per line (default: [daemon] log_format).")
@click.option("--once", is_flag=True,
              help="Run every action due now (its schedule fired since its last run, or it"
                   " never ran) one after the other, then exit: for a systemd timer or cron.")
@pass_invocation
def command(inv: Invocation, log_format: str | None, once: bool) -> ExitStatus:
    """Run every job's snapshot, replicate, archive, prune and audit on their schedules.

    Runs missed while the daemon was down run once at start-up. Each run takes the same
    per-dataset lock as a manual run. SIGTERM stops running transfers cleanly and exits 0.
    With --once: exit 0 when every due run succeeded (or was skipped for a lock, or waits
    for a thaw), else 1.
    """
    from zrepl_py.config.loading import load_config
    from zrepl_py.daemon.logs import configure
    from zrepl_py.daemon.scheduler import Daemon

    path = inv.config_file
    config = load_config(path)
    # Refused at start, not by every scheduled run's alert (the runs open stores later).
    require_for_config(config)
    level = inv.log_level(config.log_level)
    configure(log_format or config.daemon.log_format, level)
    env = {**os.environ, **inv.env}
    if inv.verbosity:  # -v/-q reach the runs too
        env["ZBAK_LOG_LEVEL"] = level
    end_startup()  # the collector runs in a long-lived process (runtime.gcpause)
    if once:
        return _once(inv, config, path, env)
    daemon = Daemon(config, path, env=env, debug=inv.debug)
    dispatcher, server = _operations(daemon, config, path)
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, lambda signum, frame: daemon.stop())
                    for sig in (signal.SIGTERM, signal.SIGINT)}  # fmt: skip
    else:  # an in-process caller (tests) stops it with daemon.stop()
        previous = {}
    try:
        return daemon.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.shutdown()
        dispatcher.close()


STALENESS_EVERY = 300.0  # seconds between staleness checks: alerts come within minutes


def _operations(daemon: Daemon, config: Config, path: Path
                ) -> tuple[Dispatcher, WSGIServer | None]:
    """Register alerts, the staleness check and metrics with ``daemon``; return the alert
    dispatcher and the metrics HTTP server (or None)."""
    from zrepl_py.alerts import check_staleness, install
    from zrepl_py.clock import SystemClock
    from zrepl_py.invocation.context import Context
    from zrepl_py.status import metrics

    clock = SystemClock()
    started = clock.now()
    ctx = Context(config=config, config_path=path)
    dispatcher = install(config.alerts)
    daemon.add_task("staleness", STALENESS_EVERY,
                    lambda: check_staleness(ctx.catalog(), config, clock.now(), since=started))
    registry, collector = metrics.registry_for(ctx)
    server = None
    if (listen := config.metrics.listen_address()) is not None:
        server = metrics.serve(registry, listen)
    textfile = config.metrics.textfile

    def refresh(job: str, action: str, code: int) -> None:
        # Held bytes need the source hosts, so they are read here and never during a
        # scrape; the endpoint's budget alert compares them (docs/monitoring.md#alert-rules).
        collector.refresh_held()
        if textfile is not None:
            metrics.write_textfile(ctx, textfile, registry=registry)

    daemon.after_run(refresh)
    return dispatcher, server


def _once(inv: Invocation, config: Config, path: Path, env: dict[str, str]) -> ExitStatus:
    """``--once``: the due runs (``daemon.once``), then what the daemon does around runs:
    the staleness check (alerts) and the metrics textfile."""
    from zrepl_py.alerts import check_staleness, install
    from zrepl_py.daemon.once import due_entries, last_starts, run_entries
    from zrepl_py.daemon.plan import plan_entries
    from zrepl_py.invocation.context import Context
    from zrepl_py.status import metrics

    dispatcher = install(config.alerts)
    try:
        with Context(config=config, config_path=path) as ctx:
            catalog = ctx.catalog()
            due = due_entries(plan_entries(config),
                              last_starts(catalog.last_runs()), ctx.clock.now(),
                              config.daemon.misfire_grace_time)
            log.info("daemon --once: %d run(s) due: %s", len(due),
                     ", ".join(f"{e.action} {e.job}" for e in due) or "nothing")
            status = run_entries(due, path.absolute(), env, debug=inv.debug,
                                 stop_timeout=config.daemon.stop_timeout.total_seconds())
            check_staleness(catalog, config, ctx.clock.now())
            if config.metrics.textfile is not None and due:
                try:
                    metrics.write_textfile(ctx, config.metrics.textfile)
                except OSError as exc:
                    log.error("cannot write [metrics] textfile %s: %s", config.metrics.textfile,
                              exc.strerror or exc)
        return status
    finally:
        dispatcher.close()
