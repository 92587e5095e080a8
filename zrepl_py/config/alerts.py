"""``[alerts]`` and ``[metrics]``: where alerts go, when staleness is alerted, and the
Prometheus exposition (docs/alerts.md)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from pydantic import ConfigDict, Field, StrictBool, field_validator, model_validator

from zrepl_py.values.fields import Duration, Table

if TYPE_CHECKING:
    from zrepl_py.config.secret import Secret


class SecretRef(Table):
    """Where a secret comes from: ``{ env = "NAME" }`` or ``{ file = "/path" }``, exactly one.

    The value itself is never written in the config (docs/style.md#habits-worth-copying,
    item 7); it is read when first needed (``load``), so ``zbak config check`` does not need
    the secret present.
    """

    env: str | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError('give exactly one of env = "NAME" or file = "/path"')
        if self.env is not None:  # a secret's variable never reaches zfs/ssh/rsync children
            from zrepl_py.proc.childenv import register_secret_env

            register_secret_env(self.env)
        return self

    def load(self) -> Secret:
        """Read the secret and return it as a ``zrepl_py.config.secret.Secret``.

        Raises:
            SecretUnavailable: the variable is unset or the file cannot be read (the message
                names the variable or file, never a value).
        """
        from zrepl_py.config.secret import Secret
        from zrepl_py.errors import SecretUnavailable

        try:
            if self.env is not None:
                return Secret.from_env(self.env)
            assert self.file is not None  # _exactly_one
            return Secret.from_file(self.file)
        except KeyError:
            raise SecretUnavailable(f"environment variable {self.env} is not set") from None
        except OSError as exc:
            raise SecretUnavailable(f"cannot read secret file {self.file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise SecretUnavailable(f"secret file {self.file} is not UTF-8 text") from None


AlertKind = Literal["failure", "recovery", "stale", "budget", "degraded"]
ALERT_KINDS: tuple[AlertKind, ...] = get_args(AlertKind)
StaleAction = Literal["snapshot", "replicate", "archive", "copy", "prune", "audit", "drill"]


class WebhookConfig(Table):
    """``[alerts.webhook]``: POST each alert as JSON to ``url``.

    ``url`` may be a ``SecretRef`` (chat webhooks carry their token in the URL); header
    values are always ``SecretRef`` (``{ Authorization = { env = "ZBAK_HOOK_AUTH" } }``).
    """

    url: str | SecretRef
    headers: dict[str, SecretRef] = {}
    timeout: Duration = dt.timedelta(seconds=10)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | SecretRef) -> str | SecretRef:
        if isinstance(value, str) and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError("expected an http:// or https:// URL")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, SecretRef]) -> dict[str, SecretRef]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
                raise ValueError(f"invalid HTTP header name {name!r}")
        return value


class EmailConfig(Table):
    """``[alerts.email]``: send each alert as a mail through an SMTP server (smtplib).

    ``starttls`` upgrades a plain connection (port 587); ``ssl`` connects with TLS from the
    start (SMTPS, port 465). Certificates are verified against the system CAs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    host: str
    port: int = Field(587, ge=1, le=65535)
    starttls: StrictBool = True
    ssl: StrictBool = False
    sender: str = Field(alias="from")
    to: list[str] = Field(min_length=1)
    username: str | None = None
    password: SecretRef | None = None
    timeout: Duration = dt.timedelta(seconds=30)

    @field_validator("sender", "to")
    @classmethod
    def _addresses(cls, value: str | list[str]) -> str | list[str]:
        for address in [value] if isinstance(value, str) else value:
            if not re.fullmatch(r"[^@\s<>,]+@[^@\s<>,]+", address):
                raise ValueError(f"invalid mail address {address!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> EmailConfig:
        if self.ssl and self.starttls:
            raise ValueError("ssl (SMTPS) and starttls exclude each other: set starttls = false")
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        if self.password is not None and not (self.ssl or self.starttls or _loopback(self.host)):
            raise ValueError(f"the SMTP password would cross the network to {self.host} in"
                             " clear text: set starttls = true (or ssl = true), or relay"
                             " through a server on 127.0.0.1")
        return self


class AppriseConfig(Table):
    """``[alerts.apprise]``: each alert to every service named by an apprise URL
    (ntfy, Telegram, Slack, Matrix, Pushover, ...; needs ``zbak[apprise]``).

    Each URL is a ``SecretRef`` (``{ env = "NAME" }`` or ``{ file = "/path" }``): apprise URLs
    carry the service's token, so they are never written in the file nor logged.
    """

    urls: list[SecretRef] = Field(min_length=1)


def _loopback(host: str) -> bool:
    """True for ``localhost`` and addresses in 127.0.0.0/8 or ``::1`` (RFC 1122, RFC 4291)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class AlertsConfig(Table):
    """``[alerts]``: where alerts go and when staleness is alerted (see zrepl_py/alerts).

    ``stale_after`` maps an action to how long it may go without a successful run before a
    ``stale`` alert (checked by the daemon; only for actions a job schedules). ``repeat_after``
    is the shortest time between two alerts of the same kind for the same job, action and
    target (a recovery always goes out and re-arms its failure alert).
    """

    webhook: WebhookConfig | None = None
    email: EmailConfig | None = None
    apprise: AppriseConfig | None = None
    stale_after: dict[StaleAction, Duration] = {
        "replicate": dt.timedelta(hours=26),
        "archive": dt.timedelta(hours=50),
        "copy": dt.timedelta(hours=50),
        "drill": dt.timedelta(days=8),
    }
    repeat_after: Duration = dt.timedelta(hours=24)
    events: list[AlertKind] = list(ALERT_KINDS)


class MetricsConfig(Table):
    """``[metrics]``: Prometheus exposition (see zrepl_py/status/metrics.py).

    ``listen`` (``HOST:PORT``) makes ``zbak daemon`` serve ``/metrics``; ``textfile`` is a
    node_exporter textfile-collector file rewritten atomically after every run.
    """

    listen: str | None = None
    textfile: Path | None = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is None:
            return value
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected HOST:PORT, e.g. '127.0.0.1:9811'")
        return value

    @field_validator("textfile")
    @classmethod
    def _textfile(cls, value: Path | None) -> Path | None:
        if value is not None and (not value.is_absolute() or value.suffix != ".prom"):
            raise ValueError("expected an absolute path ending in .prom (node_exporter reads only those)")
        return value

    def listen_address(self) -> tuple[str, int] | None:
        """``listen`` split into ``(host, port)`` (brackets of an IPv6 literal removed)."""
        if self.listen is None:
            return None
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)
