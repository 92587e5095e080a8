"""Apprise channel: each alert to one notification service (ntfy, Telegram, Slack, Matrix,
Pushover, ...) through the apprise library (``zbak[apprise]``), one URL per service.

An apprise URL usually carries the service's token (``tgram://BOTTOKEN/CHATID``,
``ntfy://user:pass@host/topic``), often where a host name would stand, so the URL is a
secret: logs and errors name a sink only by its place in ``[alerts.apprise] urls`` and its
scheme (``apprise url 1 (tgram://)``). apprise logs through the ``apprise`` logger, at DEBUG
with the full URL and elsewhere with the host part (the token for some services): that
logger is kept out of zbak's log (``propagate`` off); while a sink sends, its records are
collected, and a failure's reason is taken from them with every part of the URL cut out.

apprise answers a notify with success or not, without saying whether trying again could
help, so every unsuccessful send is retried with backoff (``retrying.deliver``), like a
webhook's connection error. Nothing is written to disk (apprise's persistent store is kept
in memory).
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import TYPE_CHECKING

import tenacity

from zrepl_py.alerts.message import headline, mail_body, scrub
from zrepl_py.alerts.retrying import Transient, deliver
from zrepl_py.config.secret import Secret
from zrepl_py.errors import AlertDeliveryFailed
from zrepl_py.observe.events import Event

if TYPE_CHECKING:  # imported when the first alert is sent (_service)
    import apprise

log = logging.getLogger(__name__)

APPRISE_LOGGER = "apprise"
_TYPES = {"recovery": "success", "budget": "warning", "stale": "warning"}
"""apprise's NotifyType per event kind; other kinds (failure, degraded) are ``failure``."""
_MIN_PART = 4
"""URL parts shorter than this are not cut out of apprise's messages (``ntfy``, ports)."""


class _Collector(logging.Handler):
    """Keeps the messages of apprise's WARNING and ERROR records while one send runs (the
    alert dispatcher sends from one thread, one channel at a time)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def url_parts(url: str) -> list[str]:
    """The URL and every part of it that could be a token (user, password, host, path
    segments, query values, fragment), longest first, for ``message.scrub`` (pure)."""
    parts = urllib.parse.urlsplit(url)
    found = [url, parts.netloc, parts.username or "", parts.password or "", parts.hostname or "",
             parts.fragment, *parts.path.split("/"),
             *(v for _, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))]
    return sorted({p for p in found if len(p) >= _MIN_PART}, key=len, reverse=True)


class AppriseSink:
    """Deliver events to one apprise URL.

    Args:
        url: the apprise URL (a Secret).
        host: the machine's name put in every notification.
        index: the URL's place in ``[alerts.apprise] urls`` (1-based), for logs and errors.
        attempts: tries in all (at least 1).
        wait: a tenacity wait strategy between tries (default exponential 1, 2, 4 ... 30 s).

    Raises:
        AlertDeliveryFailed: (on the first call, when apprise is loaded) apprise does not
            accept the URL.
    """

    def __init__(self, url: Secret, host: str, *, index: int = 1, attempts: int = 4,
                 wait: tenacity.wait.wait_base | None = None):
        self._url = url
        self._host = host
        self._attempts = max(1, attempts)
        self._wait = wait if wait is not None else tenacity.wait_exponential(multiplier=1, max=30)
        scheme = urllib.parse.urlsplit(url.reveal()).scheme or "?"
        self.name = f"apprise url {index} ({scheme}://)"
        """How logs and errors name this sink: never more of the URL than its scheme."""
        self._apprise: apprise.Apprise | None = None

    def secrets(self) -> list[str]:
        """The URL and its parts (so messages can be scrubbed of them)."""
        return url_parts(self._url.reveal())

    def _service(self) -> apprise.Apprise:
        """The apprise object holding this URL (created on first use: the import and the
        plugin look-up cost only when an alert is sent)."""
        if self._apprise is None:
            import apprise

            source = logging.getLogger(APPRISE_LOGGER)
            source.propagate = False  # see the module doc
            if not source.handlers:  # else Python's last-resort handler prints to stderr
                source.addHandler(logging.NullHandler())
            service = apprise.Apprise(asset=apprise.AppriseAsset(storage_mode="memory"))
            if not service.add(self._url.reveal()):
                raise AlertDeliveryFailed(f"{self.name}: apprise does not accept this URL (see"
                                          " https://github.com/caronc/apprise/wiki for the"
                                          " URL of each service)")
            self._apprise = service
        return self._apprise

    def __call__(self, event: Event) -> None:
        """Notify the service of ``event``: title ``message.headline``, body
        ``message.mail_body``, type failure / warning / success by kind.

        Raises:
            AlertDeliveryFailed: the URL is not accepted, or the send failed on every try.
        """
        service = self._service()
        title = headline(event, self._host)
        body = mail_body(event, self._host, self.secrets())
        kind = _TYPES.get(event.kind, "failure")
        deliver(lambda n: self._send(service, title, body, kind, n), attempts=self._attempts,
                wait=self._wait, what=self.name)
        log.info("alert %s sent to %s", event.kind, self.name)

    def _send(self, service: apprise.Apprise, title: str, body: str, kind: str,
              attempt: int) -> None:
        collector = _Collector()
        source = logging.getLogger(APPRISE_LOGGER)
        source.addHandler(collector)
        try:
            sent = bool(service.notify(body=body, title=title, notify_type=kind))
        except Exception as exc:  # a plugin's own error: retried like a refusal
            collector.lines.append(f"{type(exc).__name__}: {exc}")
            sent = False
        finally:
            source.removeHandler(collector)
        if not sent:
            reason = scrub("; ".join(collector.lines[-2:]) or "not delivered", self.secrets())
            log.warning("%s: %s (try %d)", self.name, reason, attempt)
            raise Transient(reason)
