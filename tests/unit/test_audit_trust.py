"""The audit's trust rule for manifests (``audit.objects.must_read``, pure): a manifest an
earlier audit read and found agreeing is trusted only while the listing shows the same
object and that read is younger than its share of ``TRUST_MANIFESTS_FOR``
(docs/decisions.md#audit-trusts-a-manifest-whose-listing-has-not-changed)."""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.audit.objects import TRUST_MANIFESTS_FOR, must_read
from zrepl_py.stores.base import ObjectInfo

NOW = dt.datetime(2026, 11, 25, 12, tzinfo=dt.UTC)
LISTED = ObjectInfo("p/manifest.json", 1622, "STANDARD", NOW, etag="e1")
DAY = dt.timedelta(days=1)


@pytest.mark.parametrize("stamp, info, read", [
    (None, LISTED, True),                                    # never read
    (("1622:e1", NOW - DAY), LISTED, False),                 # read yesterday, unchanged
    (("1622:e0", NOW - DAY), LISTED, True),                  # another etag: replaced
    (("1621:e1", NOW - DAY), LISTED, True),                  # another size
    (("1622:e1", NOW - DAY), LISTED._replace(etag=None), True),  # the store gives no etag
    (("1622:e1", NOW - 31 * DAY), LISTED, True),             # older than any share
    (("1622:e1", NOW - 14 * DAY), LISTED, False),            # younger than every share
], ids=["no stamp", "unchanged", "other etag", "other size", "no etag", "31 days", "14 days"])
def test_a_manifest_is_read_unless_the_same_object_was_read_recently(stamp, info, read):
    assert must_read(1, info, stamp, NOW) is read


def test_the_shares_spread_over_the_second_half_of_the_trust_period():
    """Stream ids spread a store stamped in one audit over days 15 to 30."""
    at = NOW - TRUST_MANIFESTS_FOR * 0.75
    stamp = ("1622:e1", at)
    verdicts = [must_read(i, LISTED, stamp, NOW) for i in range(1000)]
    assert 400 < sum(verdicts) < 600
    assert not must_read(999, LISTED, ("1622:e1", NOW - TRUST_MANIFESTS_FOR * 0.99), NOW)
    assert must_read(0, LISTED, ("1622:e1", NOW - TRUST_MANIFESTS_FOR * 0.51), NOW)
