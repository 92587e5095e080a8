"""Webhook channel: POST each alert as JSON (standard library ``urllib``, tenacity retries).

Transient failures (connection refused or reset, timeouts, HTTP 408, 429 and 5xx) are retried
with exponential backoff; any other HTTP status is permanent. Redirects are refused, so an
``Authorization`` header never follows a redirect to another server. Logs and errors name
only the server (``scheme://host:port``): a webhook URL's path often is the token.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import IO

import tenacity

from zrepl_py.alerts.message import scrub, webhook_payload
from zrepl_py.alerts.retrying import Transient, deliver
from zrepl_py.config.secret import Secret
from zrepl_py.errors import AlertDeliveryFailed
from zrepl_py.observe.events import Event

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: http.client.HTTPMessage, newurl: str) -> None:
        return None  # urllib then raises HTTPError with the 3xx status


class WebhookSink:
    """Deliver events to one webhook.

    Args:
        url: the full URL (a Secret: it may carry a token).
        headers: extra request headers, values as Secrets (``Authorization``, ...).
        host: the machine's name put in every payload.
        timeout: seconds per attempt.
        attempts: tries in all (at least 1).
        wait: a tenacity wait strategy between tries (default exponential 1, 2, 4 ... 30 s).
    """

    def __init__(self, url: Secret, headers: dict[str, Secret], host: str, *, timeout: float = 10.0,
                 attempts: int = 4, wait: tenacity.wait.wait_base | None = None):
        self._url = url
        self._headers = headers
        self._host = host
        self._timeout = timeout
        self._attempts = max(1, attempts)
        self._wait = wait if wait is not None else tenacity.wait_exponential(multiplier=1, max=30)
        self._opener = urllib.request.build_opener(_NoRedirect)
        parts = urllib.parse.urlsplit(url.reveal())
        self.server = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        """``scheme://host[:port]`` of the webhook: all that logs and errors ever show."""

    def secrets(self) -> list[str]:
        """The secret values this sink holds (so messages can be scrubbed of them)."""
        return [self._url.reveal(), *(h.reveal() for h in self._headers.values())]

    def __call__(self, event: Event) -> None:
        """POST ``event`` (see ``message.webhook_payload``).

        Raises:
            AlertDeliveryFailed: a permanent HTTP status, or transient failures on every try.
        """
        body = json.dumps(webhook_payload(event, self._host, self.secrets())).encode()
        deliver(lambda n: self._post(body, n), attempts=self._attempts, wait=self._wait,
                what=f"webhook {self.server}")
        log.info("alert %s sent to webhook %s", event.kind, self.server)

    def _post(self, body: bytes, attempt: int) -> None:
        request = urllib.request.Request(self._url.reveal(), data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        request.add_header("User-Agent", "zbak-alerts")
        for name, value in self._headers.items():
            request.add_header(name, value.reveal())
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            exc.close()
            problem = f"HTTP {exc.code} {exc.reason}"
            if exc.code in RETRY_STATUSES:
                log.warning("webhook %s answered %s (try %d)", self.server, problem, attempt)
                raise Transient(problem) from None
            raise AlertDeliveryFailed(f"webhook {self.server} refused the alert: {problem}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            problem = str(reason) if not isinstance(reason, OSError) else (
                reason.strerror or type(reason).__name__)
            problem = scrub(problem, self.secrets())
            log.warning("webhook %s unreachable: %s (try %d)", self.server, problem, attempt)
            raise Transient(f"unreachable: {problem}") from None
