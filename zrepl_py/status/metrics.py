"""Prometheus metrics: the facts of ``zbak status`` as gauges (prometheus_client).

Two ways out, both configured under ``[metrics]``:

* ``listen = "127.0.0.1:9811"``: ``zbak daemon`` serves ``http://HOST:PORT/metrics``
  (``serve``). Each scrape reads the catalog afresh (a few indexed queries per job), so
  manual runs show up too; held bytes need the source host and are read by ``refresh_held``
  (the daemon calls it after every run), never during a scrape.
* ``textfile = "/var/lib/node_exporter/zbak.prom"``: rewritten atomically (a temporary file
  in the same directory, then rename(2)) by ``write_textfile``, which the daemon calls after
  every run and ``zbak status --prom-textfile PATH`` calls on demand (cron without a daemon).

Metrics (labels in braces; ``target`` is "" for actions without one; times are Unix seconds
UTC, sizes bytes):

==============================================  ===============================================
``zbak_last_success_timestamp_seconds``          {job, action, target} end of the newest ok run
``zbak_last_run_timestamp_seconds``              {job, action, target} start of the newest run
``zbak_last_run_ok``                             {job, action, target} 1 ok, 0 failed/partial
``zbak_last_run_bytes``                          {job, action, target} bytes moved by it
``zbak_last_run_duration_seconds``               {job, action, target} its end minus its start
``zbak_running_since_timestamp_seconds``         {job, action, target} a run marked running
``zbak_replication_lag_seconds``                 {job, target, dataset} see ``zrepl_py.status.report``
``zbak_replication_lag_snapshots``               {job, target, dataset}
``zbak_archive_chain_length``                    {job, dataset, store} streams, full included
``zbak_archive_chain_stored_bytes``              {job, dataset, store}
``zbak_audit_ok``                                {job} newest audit run: 1 ok, 0 found problems
``zbak_held_bytes``                              {job} bytes pinned by zbak's holds
``zbak_replication_held_bytes``                  {job} the part pinned by replication cursors
``zbak_snapshots``                               {job} live snapshots under the source
``zbak_replication_cursor_timestamp_seconds``    {job, target, dataset} creation of the
                                                 snapshot the target's cursor names
``zbak_drill_last_success_timestamp_seconds``    {job, source} end of the newest ok drill
``zbak_drill_duration_seconds``                  {job, source} its recovery time
``zbak_drill_bytes``                             {job, source} the bytes it restored
``zbak_drill_ok``                                {job, source} newest drill: 1 ok (or skipped,
                                                 pending), 0 failed
``zbak_copy_lag_streams``                        {job, store} streams the copy store lacks
                                                 and the next ``zbak copy`` copies
``zbak_copy_lag_bytes``                          {job, store} their stored bytes
``zbak_copy_lag_seconds``                        {job, store} age of the oldest of them (0:
                                                 none lacks; ``zrepl_py.copying.lag``)
``zbak_copy_max_lag_seconds``                    {job, store} the copy's ``max_lag`` (or its
                                                 default; absent when not judged)
``zbak_stale_after_seconds``                     {action} ``[alerts] stale_after``
``zbak_protection_budget_max_bytes``             {job} ``protection_budget.max_bytes``
``zbak_protection_budget_max_age_seconds``       {job} ``protection_budget.max_age``
==============================================  ===============================================

A never-replicated target has no lag sample (absent, not zero); alert on
``time() - zbak_last_success_timestamp_seconds`` for staleness. The limits of the config are
exported too (``zbak_stale_after_seconds``, ``zbak_protection_budget_*``; absent when not
set), so alert rules can follow the config instead of repeating its numbers
(docs/decisions.md#alert-limits-are-exported-as-metrics).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zrepl_py.status.report import Held, JobStatus, job_status, read_held

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from zrepl_py.config.schema import Config
    from zrepl_py.invocation.context import Context

log = logging.getLogger(__name__)

_RUN = ["job", "action", "target"]
_OK = {"ok": 1.0, "failed": 0.0, "partial": 0.0}


def _ts(value: dt.datetime) -> float:
    return value.timestamp()


def families(states: Sequence[JobStatus], config: Config | None = None) -> list[Metric]:
    """The metric families for ``states`` and the limits of ``config`` (pure; see the module
    doc for names and labels)."""
    success = GaugeMetricFamily("zbak_last_success_timestamp_seconds",
                                "End of the newest successful run (Unix seconds).", labels=_RUN)
    started = GaugeMetricFamily("zbak_last_run_timestamp_seconds",
                                "Start of the newest run (Unix seconds).", labels=_RUN)
    run_ok = GaugeMetricFamily("zbak_last_run_ok",
                               "1 when the newest finished run ended ok, 0 when it failed.",
                               labels=_RUN)
    run_bytes = GaugeMetricFamily("zbak_last_run_bytes",
                                  "Bytes moved by the newest finished run.", labels=_RUN)
    run_seconds = GaugeMetricFamily("zbak_last_run_duration_seconds",
                                    "End minus start of the newest finished run (seconds).",
                                    labels=_RUN)
    running = GaugeMetricFamily("zbak_running_since_timestamp_seconds",
                                "Start of a run still marked running (Unix seconds).", labels=_RUN)
    lag_s = GaugeMetricFamily("zbak_replication_lag_seconds",
                              "Newest source snapshot's creation minus the replica cursor's.",
                              labels=["job", "target", "dataset"])
    lag_n = GaugeMetricFamily("zbak_replication_lag_snapshots",
                              "Source snapshots newer than the replica cursor.",
                              labels=["job", "target", "dataset"])
    chain_len = GaugeMetricFamily("zbak_archive_chain_length",
                                  "Streams in the current archive chain, the full included.",
                                  labels=["job", "dataset", "store"])
    chain_bytes = GaugeMetricFamily("zbak_archive_chain_stored_bytes",
                                    "Stored bytes of the current archive chain.",
                                    labels=["job", "dataset", "store"])
    audit = GaugeMetricFamily("zbak_audit_ok",
                              "1 when the newest audit run ended ok, 0 when it found problems.",
                              labels=["job"])
    held = GaugeMetricFamily("zbak_held_bytes",
                             "Bytes of source snapshots pinned by zbak's holds.", labels=["job"])
    held_replication = GaugeMetricFamily(
        "zbak_replication_held_bytes",
        "Bytes of source snapshots pinned by replication cursors (protection_budget.max_bytes).",
        labels=["job"])
    snaps = GaugeMetricFamily("zbak_snapshots", "Live catalogued snapshots under the source.",
                              labels=["job"])
    cursor = GaugeMetricFamily("zbak_replication_cursor_timestamp_seconds",
                               "Creation of the snapshot a target's cursor names (Unix seconds).",
                               labels=["job", "target", "dataset"])
    for state in states:
        job = state.job
        snaps.add_metric([job], state.snapshots)
        for s in state.last_success:
            success.add_metric([job, s.action, s.target or ""], _ts(s.time))
        for run in state.last_runs:
            labels = [job, run.action, run.target or ""]
            started.add_metric(labels, _ts(run.started_at))
            if run.result == "running":
                running.add_metric(labels, _ts(run.started_at))
                continue
            run_ok.add_metric(labels, _OK.get(run.result, 0.0))
            run_bytes.add_metric(labels, run.bytes)
            if run.ended_at is not None:
                run_seconds.add_metric(labels, (run.ended_at - run.started_at).total_seconds())
            if run.action == "audit" and run.target is None:
                audit.add_metric([job], _OK.get(run.result, 0.0))
        for target in state.targets:
            for d in target.datasets:
                if d.lag_seconds is not None:
                    lag_s.add_metric([job, target.target, d.dataset], d.lag_seconds)
                if d.lag_snapshots is not None:
                    lag_n.add_metric([job, target.target, d.dataset], d.lag_snapshots)
                if d.cursor_time is not None:
                    cursor.add_metric([job, target.target, d.dataset], _ts(d.cursor_time))
        for chain in state.chains:
            chain_len.add_metric([job, chain.dataset, chain.store], chain.length)
            chain_bytes.add_metric([job, chain.dataset, chain.store], chain.stored_bytes)
        if state.held_bytes is not None:
            held.add_metric([job], state.held_bytes)
        if state.held_replication_bytes is not None:
            held_replication.add_metric([job], state.held_replication_bytes)
    return [success, started, run_ok, run_bytes, run_seconds, running, lag_s, lag_n, chain_len,
            chain_bytes, audit, held, held_replication, snaps, cursor, *_drill_families(states),
            *_copy_families(states), *_limits(states, config)]


def _copy_families(states: Sequence[JobStatus]) -> list[Metric]:
    """The ``zbak_copy_*`` families (labels job, store: the store copied to)."""
    labels = ["job", "store"]
    streams = GaugeMetricFamily("zbak_copy_lag_streams",
                                "Streams the copy store lacks that the next zbak copy copies.",
                                labels=labels)
    size = GaugeMetricFamily("zbak_copy_lag_bytes",
                             "Stored bytes of the streams the copy store lacks.", labels=labels)
    age = GaugeMetricFamily("zbak_copy_lag_seconds",
                            "Age of the oldest stream the copy store lacks (0: none lacks).",
                            labels=labels)
    limit = GaugeMetricFamily("zbak_copy_max_lag_seconds",
                              "[jobs.JOB.copy.STORE] max_lag, or twice its schedule's gap.",
                              labels=labels)
    for state in states:
        for lag in state.copies:
            where = [state.job, lag.store]
            streams.add_metric(where, lag.streams)
            size.add_metric(where, lag.bytes)
            age.add_metric(where, lag.lag_seconds)
            if lag.max_lag is not None:
                limit.add_metric(where, lag.max_lag)
    return [streams, size, age, limit]


def _drill_families(states: Sequence[JobStatus]) -> list[Metric]:
    """The ``zbak_drill_*`` families (labels job, source)."""
    labels = ["job", "source"]
    success = GaugeMetricFamily("zbak_drill_last_success_timestamp_seconds",
                                "End of the newest restore drill that ended ok (Unix seconds).",
                                labels=labels)
    duration = GaugeMetricFamily("zbak_drill_duration_seconds",
                                 "Recovery time of the newest ok drill: seconds its restores took.",
                                 labels=labels)
    size = GaugeMetricFamily("zbak_drill_bytes", "Bytes the newest ok drill restored.",
                             labels=labels)
    ok = GaugeMetricFamily("zbak_drill_ok",
                           "1 when the newest drill did not fail (ok, skipped, pending), 0 when"
                           " it failed.", labels=labels)
    for state in states:
        for drill in state.drill_successes:
            where = [state.job, drill.source]
            success.add_metric(where, _ts(drill.ended_at))
            if drill.seconds is not None:
                duration.add_metric(where, drill.seconds)
            size.add_metric(where, drill.bytes)
        for drill in state.drills:
            ok.add_metric([state.job, drill.source], 0.0 if drill.result == "failed" else 1.0)
    return [success, duration, size, ok]


def _limits(states: Sequence[JobStatus], config: Config | None) -> list[Metric]:
    """The config's alert limits: ``[alerts] stale_after`` per action and each job's
    replication ``protection_budget`` (absent where not set)."""
    stale = GaugeMetricFamily("zbak_stale_after_seconds",
                              "[alerts] stale_after: longest time without a successful run.",
                              labels=["action"])
    budget_bytes = GaugeMetricFamily("zbak_protection_budget_max_bytes",
                                     "[jobs.JOB.replicate] protection_budget.max_bytes.",
                                     labels=["job"])
    budget_age = GaugeMetricFamily("zbak_protection_budget_max_age_seconds",
                                   "[jobs.JOB.replicate] protection_budget.max_age (seconds).",
                                   labels=["job"])
    if config is not None:
        for action, limit in sorted(config.alerts.stale_after.items()):
            stale.add_metric([action], limit.total_seconds())
        for state in states:
            job = config.jobs.get(state.job)
            budget = job.replicate.protection_budget if job and job.replicate else None
            if budget is not None and budget.max_bytes is not None:
                budget_bytes.add_metric([state.job], budget.max_bytes)
            if budget is not None and budget.max_age is not None:
                budget_age.add_metric([state.job], budget.max_age.total_seconds())
    return [stale, budget_bytes, budget_age]


class StatusCollector(Collector):
    """A prometheus_client collector reading ``ctx``'s catalog at every scrape.

    Held bytes are cached: ``refresh_held`` reads them from the source hosts (the daemon
    calls it after each run); a scrape never dials a host. A catalog that cannot be read
    yields no samples for that scrape (logged), so the endpoint keeps answering.

    Args:
        ctx: a ``zrepl_py.invocation.context.Context`` kept open by the caller (the daemon's).
    """

    def __init__(self, ctx: Context):
        self._ctx = ctx
        self._held: dict[str, Held] = {}
        self._lock = threading.Lock()

    def refresh_held(self) -> None:
        """Read every job's held bytes now (one ``zfs get`` per job's source host)."""
        found = {name: read_held(self._ctx, name, job) for name, job in self._ctx.config.jobs.items()}
        with self._lock:
            self._held = found

    def states(self) -> list[JobStatus]:
        """Every job's status from the catalog, with the cached held bytes.

        Raises:
            CatalogError: the catalog cannot be read.
        """
        catalog, now = self._ctx.catalog(), self._ctx.clock.now()
        with self._lock:
            held = dict(self._held)
        return [job_status(catalog, name, job, now, held=held.get(name), next_runs={})
                for name, job in self._ctx.config.jobs.items()]

    def collect(self) -> Iterable[Metric]:
        """Called by prometheus_client at each scrape or textfile write."""
        from zrepl_py.errors import ZbakError

        try:
            states = self.states()
        except ZbakError as exc:
            log.error("metrics: cannot read the catalog: %s", exc)
            return []
        return families(states, self._ctx.config)


class _Fixed(Collector):
    def __init__(self, states: Sequence[JobStatus], config: Config):
        self._states, self._config = states, config

    def collect(self) -> Iterable[Metric]:
        return families(self._states, self._config)


def registry_for(ctx: Context) -> tuple[CollectorRegistry, StatusCollector]:
    """A fresh registry holding one StatusCollector for ``ctx`` (no process metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    collector = StatusCollector(ctx)
    registry.register(collector)
    return registry, collector


def serve(registry: CollectorRegistry, listen: tuple[str, int]) -> WSGIServer:
    """Serve ``registry`` at ``http://HOST:PORT/metrics`` from a daemon thread.

    Args:
        listen: ``(host, port)``, e.g. ``MetricsConfig.listen_address()``; port 0 picks one.

    Returns:
        The ``wsgiref`` server (``server.server_port`` is the bound port; call
        ``server.shutdown()`` to stop it).

    Raises:
        OSError: the address cannot be bound.
    """
    server, _thread = start_http_server(listen[1], addr=listen[0], registry=registry)
    log.info("metrics served at http://%s:%d/metrics", listen[0], server.server_port)
    return server


def write_textfile(ctx: Context, path: Path | str, *, states: Sequence[JobStatus] | None = None,
                   registry: CollectorRegistry | None = None) -> None:
    """Write the metrics to ``path`` for node_exporter's textfile collector, atomically.

    Args:
        ctx: the Context (used when neither ``states`` nor ``registry`` is given).
        states: statuses already computed (``zbak status``), else read now with held bytes.
        registry: a registry to write instead (the daemon's, with its cached held bytes).

    Raises:
        OSError: the file or its temporary sibling cannot be written.
        CatalogError: the catalog cannot be read (only when ``states`` is None).
    """
    if registry is None:
        if states is None:
            from zrepl_py.status.report import job_statuses

            states = job_statuses(ctx)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Fixed(states, ctx.config))
    write_to_textfile(str(path), registry)
