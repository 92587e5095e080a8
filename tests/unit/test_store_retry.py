"""The store retry policy: transient errors are retried with backoff, nothing else is."""

from __future__ import annotations

import pytest

from zrepl_py.errors import ObjectNotFound, StorePermanent, StoreTransient
from zrepl_py.stores.retry import RetryPolicy

TINY = RetryPolicy(attempts=3, initial_wait=0.001, max_wait=0.002)


class Flaky:
    """Raise the given errors in turn, then return "done"; count the calls."""

    def __init__(self, *errors: Exception):
        self.errors = list(errors)
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return ("done", args, kwargs)


def test_a_call_failing_transiently_twice_is_retried_until_it_succeeds():
    """docs/reliability.md#r16-retry-policy."""
    fn = Flaky(StoreTransient("slow down", store="s"), StoreTransient("reset", store="s"))
    assert TINY.call(fn, 1, k=2) == ("done", (1,), {"k": 2})
    assert fn.calls == 3


def test_a_permanent_error_is_raised_at_once_without_a_retry():
    """docs/reliability.md#r16-retry-policy."""
    fn = Flaky(StorePermanent("access denied", store="s"))
    with pytest.raises(StorePermanent, match="access denied"):
        TINY.call(fn)
    assert fn.calls == 1


def test_a_missing_object_is_not_retried():
    """docs/reliability.md#r16-retry-policy."""
    fn = Flaky(ObjectNotFound("gone", store="s", key="k"))
    with pytest.raises(ObjectNotFound):
        TINY.call(fn)
    assert fn.calls == 1


def test_an_error_that_is_no_store_error_passes_through_unretried():
    fn = Flaky(ValueError("bug"))
    with pytest.raises(ValueError):
        TINY.call(fn)
    assert fn.calls == 1


def test_transient_errors_beyond_the_attempts_raise_store_transient_naming_the_attempts():
    """docs/reliability.md#r16-retry-policy."""
    last = StoreTransient("throttled", store="s3store", key="k")
    fn = Flaky(StoreTransient("a"), StoreTransient("b"), last, StoreTransient("never reached"))
    with pytest.raises(StoreTransient, match="throttled .gave up after 3 attempts.") as caught:
        TINY.call(fn)
    assert fn.calls == 3
    assert caught.value.__cause__ is last
    assert (caught.value.store, caught.value.key) == ("s3store", "k")


def test_one_attempt_means_no_retry():
    fn = Flaky(StoreTransient("a"))
    with pytest.raises(StoreTransient, match="^a$"):
        RetryPolicy(attempts=1).call(fn)
    assert fn.calls == 1


def test_the_policy_works_as_a_decorator():
    fn = Flaky(StoreTransient("a"))
    wrapped = TINY(fn)
    assert wrapped(5)[0] == "done" and fn.calls == 2


def test_backoff_is_jittered_below_a_doubling_bound_capped_at_max_wait():
    """docs/reliability.md#r16-retry-policy."""
    policy = RetryPolicy(attempts=10, initial_wait=0.5, max_wait=3.0)
    for retry_number, bound in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 3.0), (9, 3.0)]:
        waits = [policy.backoff(retry_number) for _ in range(200)]
        assert all(0 <= w <= bound for w in waits)
        assert max(waits) > bound / 2  # jittered across the range, not stuck at 0


@pytest.mark.parametrize("kwargs", [{"attempts": 0}, {"initial_wait": -1}, {"max_wait": -1}])
def test_a_nonsense_policy_is_refused(kwargs):
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)
