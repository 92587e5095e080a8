"""Email channel: one plain-text mail per alert through an SMTP server (``smtplib``).

``starttls`` upgrades the connection before login (RFC 3207), ``ssl`` speaks TLS from the
first byte (SMTPS); both verify the server's certificate against the system CAs. The password
is handed to ``SMTP.login`` only; smtplib's own wire debugging stays off (level 0), so it is
never printed. Transient failures (connection refused or dropped, timeouts, 4xx replies, RFC
5321 section 4.2.1) are retried with backoff; 5xx replies are permanent.
"""

from __future__ import annotations

import email.message
import email.policy
import email.utils
import logging
import smtplib
import ssl

import tenacity

from zrepl_py.alerts.message import mail_body, mail_subject
from zrepl_py.alerts.retrying import Transient, deliver
from zrepl_py.config.secret import Secret
from zrepl_py.errors import AlertDeliveryFailed
from zrepl_py.observe.events import Event

log = logging.getLogger(__name__)

# Python folds a long Subject right after "Subject:" at the default 78 columns; RFC 5322
# section 2.1.1 allows lines up to 998, so headers stay on one line up to 200 characters.
_POLICY = email.policy.SMTP.clone(max_line_length=200)


class EmailSink:
    """Deliver events by mail.

    Args:
        server: SMTP host name; port: its port.
        sender: the From address; recipients: the To addresses.
        host: the machine's name put in every mail.
        starttls / use_ssl: see the module doc (never both).
        username / password: SMTP AUTH credentials, both or neither.
        timeout: seconds per network operation.
        attempts: tries in all; wait: a tenacity wait strategy (default exponential to 60 s).
    """

    def __init__(self, server: str, port: int, sender: str, recipients: list[str], host: str, *,
                 starttls: bool = True, use_ssl: bool = False, username: str | None = None,
                 password: Secret | None = None, timeout: float = 30.0, attempts: int = 4,
                 wait: tenacity.wait.wait_base | None = None):
        self.server = f"{server}:{port}"
        """``host:port`` of the SMTP server, for logs and errors."""
        self._host, self._port = server, port
        self._sender, self._recipients = sender, list(recipients)
        self._machine = host
        self._starttls, self._ssl = starttls, use_ssl
        self._username, self._password = username, password
        self._timeout = timeout
        self._attempts = max(1, attempts)
        self._wait = wait if wait is not None else tenacity.wait_exponential(multiplier=2, max=60)

    def secrets(self) -> list[str]:
        """The secret values this sink holds (so messages can be scrubbed of them)."""
        return [self._password.reveal()] if self._password is not None else []

    def message(self, event: Event) -> email.message.EmailMessage:
        """The mail for ``event`` (subject from ``message.mail_subject``, UTF-8 text body)."""
        mail = email.message.EmailMessage(policy=_POLICY)
        mail["Subject"] = mail_subject(event, self._machine)
        mail["From"] = self._sender
        mail["To"] = ", ".join(self._recipients)
        mail["Date"] = email.utils.format_datetime(event.time)
        mail["Message-ID"] = email.utils.make_msgid(domain=self._machine or None)
        mail.set_content(mail_body(event, self._machine, self.secrets()))
        return mail

    def __call__(self, event: Event) -> None:
        """Send the mail for ``event``.

        Raises:
            AlertDeliveryFailed: a permanent SMTP reply (5xx, bad login), or transient
                failures on every try.
        """
        mail = self.message(event)
        deliver(lambda n: self._send(mail, n), attempts=self._attempts, wait=self._wait,
                what=f"mail via {self.server}")
        log.info("alert %s mailed via %s to %s", event.kind, self.server, ", ".join(self._recipients))

    def _send(self, mail: email.message.EmailMessage, attempt: int) -> None:
        context = ssl.create_default_context()
        try:
            smtp: smtplib.SMTP
            if self._ssl:
                smtp = smtplib.SMTP_SSL(self._host, self._port, timeout=self._timeout, context=context)
            else:
                smtp = smtplib.SMTP(self._host, self._port, timeout=self._timeout)
            with smtp:
                if self._starttls:
                    smtp.starttls(context=context)
                if self._username is not None and self._password is not None:
                    smtp.login(self._username, self._password.reveal())
                smtp.send_message(mail, from_addr=self._sender, to_addrs=self._recipients)
        except smtplib.SMTPAuthenticationError as exc:
            raise AlertDeliveryFailed(f"mail via {self.server}: login as {self._username} "
                                      f"refused ({exc.smtp_code})") from None
        except smtplib.SMTPResponseException as exc:
            problem = f"SMTP {exc.smtp_code} {_text(exc.smtp_error)}"
            if 400 <= exc.smtp_code < 500:
                log.warning("mail via %s: %s (try %d)", self.server, problem, attempt)
                raise Transient(problem) from None
            raise AlertDeliveryFailed(f"mail via {self.server} refused: {problem}") from None
        except smtplib.SMTPRecipientsRefused as exc:
            refused = ", ".join(sorted(exc.recipients))
            raise AlertDeliveryFailed(f"mail via {self.server}: recipients refused: {refused}") from None
        except smtplib.SMTPNotSupportedError as exc:
            raise AlertDeliveryFailed(f"mail via {self.server}: {exc}") from None
        except ssl.SSLError as exc:
            raise AlertDeliveryFailed(f"mail via {self.server}: TLS failed: {exc.reason}") from None
        except (smtplib.SMTPException, OSError) as exc:
            problem = (exc.strerror if isinstance(exc, OSError) and exc.strerror else
                       str(exc) or type(exc).__name__)
            log.warning("mail via %s failed: %s (try %d)", self.server, problem, attempt)
            raise Transient(problem) from None


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
