"""The one retry policy of the object stores: exponential backoff with full jitter, on
``StoreTransient`` only (tenacity).

Backends map their library's errors to ``StoreTransient`` / ``StorePermanent`` first, then run
the mapped call under a :class:`RetryPolicy`; a permanent error (or any other exception) passes
through at once. botocore's own retries are switched off in ``s3.py`` so this is the only policy
(two stacked policies would multiply the attempts and the waits).

Full jitter (a wait drawn uniformly from 0 to the exponential bound) is what the AWS Architecture
Blog recommends for many clients hitting one service ("Exponential Backoff And Jitter", 2015).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import tenacity

from zrepl_py.errors import StoreTransient

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a transient store failure is retried.

    Attributes:
        attempts: total tries of one operation, the first included (>= 1; 1 = no retry).
        initial_wait: the bound of the first wait, seconds; the bound doubles per retry.
        max_wait: the largest bound of one wait, seconds.

    With the defaults (6 attempts, 0.5 s doubling to at most 20 s) an operation gives up after at
    most 0.5 + 1 + 2 + 4 + 8 = 15.5 s of waiting, which rides out S3 ``SlowDown`` bursts and
    short network cuts without hiding an outage for long.
    """

    attempts: int = 6
    initial_wait: float = 0.5
    max_wait: float = 20.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, not {self.attempts}")
        if self.initial_wait < 0 or self.max_wait < 0:
            raise ValueError("waits must be >= 0 seconds")

    def backoff(self, retry_number: int) -> float:
        """The wait in seconds before retry number ``retry_number`` (1 = the first retry):
        uniform in ``[0, min(max_wait, initial_wait * 2**(retry_number - 1))]``; the same law
        tenacity's ``wait_random_exponential`` applies in :meth:`call`. Used where a loop
        retries by itself (resuming a GET mid-stream)."""
        bound = min(self.max_wait, self.initial_wait * 2 ** max(0, retry_number - 1))
        return random.uniform(0, bound)

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)``, retrying while it raises ``StoreTransient``.

        Returns:
            what ``fn`` returns.

        Raises:
            StoreTransient: the last transient error, once ``attempts`` tries failed; its
                message says how many tries were made, ``__cause__`` is the last error.
            any other exception ``fn`` raises, at once (not retried).
        """
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_random_exponential(multiplier=self.initial_wait, max=self.max_wait),
            retry=tenacity.retry_if_exception_type(StoreTransient),
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            return retrying(fn, *args, **kwargs)
        except StoreTransient as exc:
            if self.attempts == 1:
                raise
            raise StoreTransient(
                f"{exc} (gave up after {self.attempts} attempts)", store=exc.store, key=exc.key
            ) from exc

    def __call__(self, fn: Callable[P, T]) -> Callable[P, T]:
        """Use the policy as a decorator: ``@RetryPolicy(attempts=3)``."""

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            return self.call(fn, *args, **kwargs)

        return wrapper


def _log_retry(state: tenacity.RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    wait = state.next_action.sleep if state.next_action else 0.0
    log.info("store: transient failure (attempt %d): %s; retrying in %.1f s",
             state.attempt_number, exc, wait)
