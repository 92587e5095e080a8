"""Alerts: webhook (JSON POST), email (SMTP) and apprise (ntfy, Telegram, Slack, Matrix, ...)
on failure, recovery, staleness, protection budget and degraded pools.

Producers emit ``zrepl_py.observe.events.Event``s (``runlog.recorded_run`` on failure, recovery and
budget warnings; ``check_staleness``; the daemon's health checks). ``install(config.alerts)``
registers the dispatcher that delivers them (in a background thread; ``close()`` flushes);
the daemon calls it once at start, ``check_staleness(catalog, config, now, since=start)``
every few minutes and ``dispatcher.close()`` at shutdown.

Modules: ``message`` (what an alert says, pure), ``webhook``, ``email``, ``apprise_sink``
(channels with tenacity retries), ``dispatch`` (filter, repeat hold-back, fan-out),
``staleness``.
"""

from __future__ import annotations

from zrepl_py.alerts.dispatch import Dispatcher, channels_from_config, install
from zrepl_py.alerts.staleness import check_staleness, stale_events

__all__ = ["Dispatcher", "channels_from_config", "check_staleness", "install", "stale_events"]
