"""How an alert reads: the webhook's JSON body and the mail's subject and text (pure).

Every channel says the same thing: what happened (``kind``), to which job, action and
target, the event's message, when (UTC) and on which machine. Known secret values are cut
out of the message before it leaves (defence in depth: zbak's own messages carry none).
"""

from __future__ import annotations

from collections.abc import Iterable

from zrepl_py.observe.events import Event

_TITLES = {
    "failure": "FAILED",
    "recovery": "recovered",
    "stale": "STALE",
    "budget": "over protection budget",
    "degraded": "DEGRADED",
}
REDACTED = "<redacted>"


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each non-empty secret value in ``text`` by ``<redacted>``."""
    for value in secrets:
        if value:
            text = text.replace(value, REDACTED)
    return text


def headline(event: Event, host: str) -> str:
    """One line: ``zbak@HOST: replicate of job nightly to backup:tank/r FAILED``."""
    what = event.action or "zbak"
    if event.job:
        what += f" of job {event.job}"
    if event.target:
        what += f" to {event.target}" if event.action == "replicate" else f" ({event.target})"
    return f"zbak@{host}: {what} {_TITLES.get(event.kind, event.kind)}"


def webhook_payload(event: Event, host: str, secrets: Iterable[str] = ()) -> dict[str, str | None]:
    """The JSON object POSTed to a webhook.

    Keys: ``source`` ("zbak"), ``host``, ``kind``, ``job``, ``action``, ``target``,
    ``message``, ``time`` (ISO 8601 UTC) and ``text`` (headline and message in one string,
    which Slack, Mattermost and Rocket.Chat incoming webhooks display as is).
    """
    message = scrub(event.message, secrets)
    payload: dict[str, str | None] = {"source": "zbak", "host": host}
    payload.update(event.as_dict())
    payload["message"] = message
    payload["text"] = f"{headline(event, host)}: {message}"
    return payload


def mail_subject(event: Event, host: str) -> str:
    """The mail subject: ``[zbak] `` and the headline."""
    return f"[zbak] {headline(event, host)}"


def mail_body(event: Event, host: str, secrets: Iterable[str] = ()) -> str:
    """The plain-text mail body: the message, then one ``field: value`` line per fact."""
    lines = [scrub(event.message, secrets), ""]
    for key, value in (("kind", event.kind), ("job", event.job), ("action", event.action),
                       ("target", event.target), ("time", event.time.isoformat()),
                       ("host", host)):
        lines.append(f"{key}: {value if value is not None else '-'}")
    return "\n".join(lines) + "\n"
