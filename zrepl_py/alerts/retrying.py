"""Delivery with retries, shared by the alert sinks (webhook, email)."""

from __future__ import annotations

from collections.abc import Callable

import tenacity

from zrepl_py.errors import AlertDeliveryFailed


class Transient(Exception):
    """A delivery failure worth another attempt; carries a message without secrets."""


def deliver(send: Callable[[int], None], *, attempts: int, wait: tenacity.wait.wait_base,
            what: str) -> None:
    """Call ``send(attempt number)`` until it returns, retrying on ``Transient``.

    Args:
        send: one delivery attempt (1-based number, for its log line); raises ``Transient``
            for a failure worth retrying, ``AlertDeliveryFailed`` for a permanent one.
        attempts: tries at most (at least 1).
        wait: tenacity's wait between tries.
        what: the destination for the message, e.g. ``"webhook https://h/..."``.

    Raises:
        AlertDeliveryFailed: a permanent failure, or ``Transient`` on every try.
    """
    try:
        for attempt in tenacity.Retrying(stop=tenacity.stop_after_attempt(attempts), wait=wait,
                                         retry=tenacity.retry_if_exception_type(Transient),
                                         reraise=True):
            with attempt:
                send(attempt.retry_state.attempt_number)
    except Transient as exc:
        raise AlertDeliveryFailed(f"{what}: {exc} (after {attempts} tries)") from None
