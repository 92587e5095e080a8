"""The store as it stood at a time (``objects.cutoff``, ``zbak catalog rebuild --not-after``):
per key the newest version written no later than TIME, later ones untrusted; and the
``--not-after`` value (``values.units.parse_moment``)."""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.objects.cutoff import as_of, written_after
from zrepl_py.stores.base import ObjectInfo, Version
from zrepl_py.values.units import parse_moment

T = dt.datetime(2026, 11, 20, 3, 0, tzinfo=dt.UTC)


def _v(key: str, vid: str, minutes: int, *, marker: bool = False, latest: bool = False,
       size: int = 10) -> Version:
    info = ObjectInfo(key, 0 if marker else size, "STANDARD", T + dt.timedelta(minutes=minutes))
    return Version(info, vid, latest, marker)


def test_the_newest_version_by_time_is_read_and_later_ones_are_untrusted():
    view = as_of([_v("m", "forged", 5, latest=True), _v("m", "second", -1),
                  _v("m", "first", -60), _v("n", "new", 1, latest=True)], T)
    assert view.versions == {"m": "second"} and view.listing["m"].modified < T
    assert [(v.info.key, v.version_id) for v in view.untrusted] == [("m", "forged"),
                                                                     ("n", "new")]
    assert "n" not in view.listing  # a key written only after TIME did not exist then


def test_a_later_delete_marker_is_untrusted_and_hides_nothing():
    view = as_of([_v("v", "marker", 1, marker=True, latest=True), _v("v", "mine", -5)], T)
    assert view.versions == {"v": "mine"}
    assert [(v.version_id, v.marker) for v in view.untrusted] == [("marker", True)]


def test_a_delete_marker_before_time_hides_the_key_as_s3_would_have_then():
    view = as_of([_v("v", "marker", -1, marker=True, latest=True), _v("v", "old", -5)], T)
    assert view.listing == {} and view.untrusted == []


def test_a_version_written_exactly_at_time_is_trusted():
    assert as_of([_v("k", "edge", 0, latest=True)], T).versions == {"k": "edge"}


def test_a_store_without_versions_has_only_its_newer_objects_to_show():
    old, new = (_v("a", "-", -1).info, _v("b", "-", 1).info)
    assert written_after([old, new], T) == [new]


@pytest.mark.parametrize(("text", "moment"), [
    ("2026-11-20T03:00:00Z", T), ("2026-11-20T03:00:00", T),
    ("2026-11-20T04:00:00+01:00", T), ("2d", T - dt.timedelta(days=2)),
    ("90m", T - dt.timedelta(minutes=90))])
def test_not_after_takes_iso_8601_utc_or_a_duration_before_now(text, moment):
    assert parse_moment(text, T) == moment
    assert parse_moment(text, T).tzinfo == dt.UTC


@pytest.mark.parametrize("text", ["yesterday", "", "2026-13-01", "-2d"])
def test_a_bad_not_after_names_both_forms(text):
    with pytest.raises(ValueError, match="ISO 8601 time .* or a duration before now"):
        parse_moment(text, T)
