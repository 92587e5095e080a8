"""The write-once rule of a versioned, locked store (``objects.versions.pin``): which
version of each key is zbak's, what is tampering, which versions the catalog does not know."""

from __future__ import annotations

import datetime as dt

from zrepl_py.objects.versions import pin
from zrepl_py.stores.base import ObjectInfo, Version

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def _v(key: str, vid: str, size: int = 10, *, latest: bool = False,
       marker: bool = False) -> Version:
    info = ObjectInfo(key, 0 if marker else size, "STANDARD", T0)
    return Version(info, vid, latest, marker)


def test_the_recorded_version_is_zbaks_and_a_newer_one_is_tampering():
    pinned = pin([_v("a", "evil", 3, latest=True), _v("a", "mine", 10)], {"a": "mine"})
    assert pinned.listing["a"].size == 10 and pinned.versions == {"a": "mine"}
    (tampered,) = pinned.tampered
    assert (tampered.key, tampered.own.version_id, tampered.latest.version_id) == (
        "a", "mine", "evil")
    assert [v.version_id for v in pinned.unknown["a"]] == ["evil"]


def test_without_a_record_the_first_version_is_zbaks_and_a_delete_marker_is_tampering():
    pinned = pin([_v("m", "marker", latest=True, marker=True), _v("m", "second"),
                  _v("m", "first", 7)], {})
    assert pinned.versions == {"m": "first"} and pinned.listing["m"].size == 7
    assert [t.latest.marker for t in pinned.tampered] == [True]
    assert [v.version_id for v in pinned.unknown["m"]] == ["second"]


def test_a_key_whose_recorded_version_is_gone_is_left_out_as_lost():
    pinned = pin([_v("a", "other", latest=True)], {"a": "mine"})
    assert "a" not in pinned.listing and not pinned.tampered
    assert [v.version_id for v in pinned.unknown["a"]] == ["other"]


def test_an_untouched_key_is_neither_tampered_nor_unknown():
    pinned = pin([_v("a", "mine", latest=True)], {"a": "mine"})
    assert pinned.versions == {"a": "mine"} and not pinned.tampered and not pinned.unknown
