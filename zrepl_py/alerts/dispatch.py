"""The ``[alerts]`` sink: filter by kind, hold back repeats, hand each alert to every channel.

One ``Dispatcher`` is registered with ``zrepl_py.observe.events`` (``install``). It remembers, per
(kind, job, action, target), when it last sent an alert, and sends the same again only after
``repeat_after`` (a job failing every hour mails once a day, not 24 times). A ``recovery`` is
always sent and re-arms the failure, staleness and budget alerts of its job, action and
target. The memory lives in the process (the daemon); a one-shot ``zbak`` command starts
afresh. A channel that fails is logged and does not stop the others.

Delivery runs in one background thread, in order: a webhook or mail server that hangs (up to
its retries and timeouts, minutes) must not keep a run holding its dataset lock. ``flush``
waits for what is queued; ``install`` registers a flush at interpreter exit (up to
``EXIT_FLUSH_SECONDS``) so a one-shot command still delivers its alerts.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import datetime as dt
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Sequence

from zrepl_py.alerts.message import scrub
from zrepl_py.config.alerts import AlertsConfig
from zrepl_py.observe.events import Event

log = logging.getLogger(__name__)

EXIT_FLUSH_SECONDS = 120.0
"""How long a process exiting waits for queued alerts (webhook and mail retries included)."""

Channel = Callable[[Event], None]


class Dispatcher:
    """Sends events to ``channels`` (see module doc).

    Args:
        channels: callables taking an Event (``WebhookSink``, ``EmailSink``); each may raise.
            A channel's ``secrets()`` values are cut out of every message, for all channels.
        kinds: the event kinds to send; others are ignored.
        repeat_after: shortest time between two alerts with the same key.
        background: deliver from a worker thread (False: in the caller, as tests may want).
    """

    def __init__(self, channels: Sequence[Channel], *, kinds: Iterable[str],
                 repeat_after: dt.timedelta, background: bool = True):
        self.channels = list(channels)
        self.kinds = frozenset(kinds)
        self.repeat_after = repeat_after
        self.background = background
        # (kind, job, action, target) -> when it was last sent
        self._sent: dict[tuple[str, str | None, str | None, str | None], dt.datetime] = {}
        self._lock = threading.Lock()
        self._queue: collections.deque[Event] = collections.deque()
        self._pending = 0
        self._wake = threading.Condition()
        self._worker: threading.Thread | None = None
        self._unregister: Callable[[], None] | None = None

    def _due(self, event: Event) -> bool:
        key = (event.kind, event.job, event.action, event.target)
        with self._lock:
            if event.kind == "recovery":
                for kind in ("failure", "stale", "budget"):
                    self._sent.pop((kind, event.job, event.action, event.target), None)
                return True
            last = self._sent.get(key)
            if last is not None and event.time - last < self.repeat_after:
                return False
            self._sent[key] = event.time
            return True

    def __call__(self, event: Event) -> None:
        """Send ``event`` to every channel unless filtered or repeated too soon."""
        if event.kind not in self.kinds:
            return
        if not self._due(event):
            log.info("alert %s for job=%s action=%s target=%s already sent within %s; held back",
                     event.kind, event.job, event.action, event.target, self.repeat_after)
            return
        secrets = [v for c in self.channels for v in getattr(c, "secrets", list)()]
        event = dataclasses.replace(event, message=scrub(event.message, secrets))
        if not self.background:
            self._deliver(event)
            return
        with self._wake:
            self._queue.append(event)
            self._pending += 1
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._run, name="zbak-alerts", daemon=True)
                self._worker.start()
            self._wake.notify_all()

    def _deliver(self, event: Event) -> None:
        for channel in self.channels:
            try:
                channel(event)
            except Exception as exc:  # one channel down must not silence the rest
                log.error("alert %s not delivered: %s", event.kind, exc)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue:
                    self._wake.wait()
                event = self._queue.popleft()
            try:
                self._deliver(event)
            finally:
                with self._wake:
                    self._pending -= 1
                    self._wake.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued alert was handed to every channel (or ``timeout`` seconds).

        Returns:
            True when nothing is left queued or being delivered.
        """
        with self._wake:
            done = self._wake.wait_for(lambda: self._pending == 0, timeout)
        if not done:
            log.warning("%d alert(s) still undelivered after %s s", self._pending, timeout)
        return done

    def close(self, timeout: float | None = EXIT_FLUSH_SECONDS) -> None:
        """Stop receiving events (unregister) and flush what is queued."""
        if self._unregister is not None:
            self._unregister()
            self._unregister = None
            atexit.unregister(self._at_exit)
        self.flush(timeout)

    def _at_exit(self) -> None:
        self.flush(EXIT_FLUSH_SECONDS)


def channels_from_config(alerts: AlertsConfig, *, host: str | None = None) -> list[Channel]:
    """Build the webhook, email and apprise channels ``alerts`` configures (secrets read
    now; apprise itself loads with the first alert it sends).

    Raises:
        SecretUnavailable: a secret's variable is unset or its file unreadable.
        ExtraMissing: ``[alerts.apprise]`` is set and apprise is not installed (exit 2).
    """
    # Each sink is imported only when configured: smtplib, urllib.request and tenacity cost
    # every command about 20 ms, and most configs set none.
    machine = host or socket.gethostname()
    channels: list[Channel] = []
    if alerts.webhook is not None:
        from zrepl_py.alerts.webhook import WebhookSink
        from zrepl_py.config.secret import Secret

        hook = alerts.webhook
        url = hook.url.load() if not isinstance(hook.url, str) else Secret(hook.url)
        channels.append(WebhookSink(url, {k: v.load() for k, v in hook.headers.items()}, machine,
                                    timeout=hook.timeout.total_seconds()))
    if alerts.email is not None:
        from zrepl_py.alerts.email import EmailSink

        mail = alerts.email
        channels.append(EmailSink(
            mail.host, mail.port, mail.sender, mail.to, machine, starttls=mail.starttls,
            use_ssl=mail.ssl, username=mail.username,
            password=mail.password.load() if mail.password is not None else None,
            timeout=mail.timeout.total_seconds(),
        ))
    if alerts.apprise is not None:
        from zrepl_py.alerts.apprise_sink import AppriseSink
        from zrepl_py.config.extras import APPRISE, APPRISE_USER
        from zrepl_py.runtime.extras import require

        require(APPRISE, APPRISE_USER)
        channels += [AppriseSink(ref.load(), machine, index=i)
                     for i, ref in enumerate(alerts.apprise.urls, 1)]
    return channels


def install(alerts: AlertsConfig, *, host: str | None = None,
            channels: Sequence[Channel] | None = None, background: bool = True) -> Dispatcher:
    """Register a Dispatcher for ``alerts`` with ``zrepl_py.observe.events`` and return it.

    Call ``close()`` on it to unregister and flush (the daemon at shutdown); a flush also runs
    at interpreter exit. With no webhook and no email configured nothing is registered
    (events are still logged by ``events.emit``). ``channels`` replaces the configured ones.

    Args:
        host: the machine name alerts carry (default ``socket.gethostname()``).

    Raises:
        SecretUnavailable: see ``channels_from_config``.
    """
    from zrepl_py.observe import events

    chosen = list(channels) if channels is not None else channels_from_config(alerts, host=host)
    dispatcher = Dispatcher(chosen, kinds=alerts.events, repeat_after=alerts.repeat_after,
                            background=background)
    if chosen:
        dispatcher._unregister = events.register(dispatcher)
        atexit.register(dispatcher._at_exit)
    return dispatcher
