"""Which versions ``zbak prune`` deletes on a write-once store (``pruning.unknown_versions``):
every version and delete marker of a catalogued stream's key that is not zbak's, each once
its own lock lapses; never zbak's own version, nor a key no catalogued stream owns."""

from __future__ import annotations

import datetime as dt

from zrepl_py.catalog.rows import ManifestLock, StreamRow, VolumeRow
from zrepl_py.pruning.unknown_versions import Stray, decide, strays
from zrepl_py.stores.base import ObjectInfo, Version

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
PREFIX = "local/tank/data/s1/"


def _v(key: str, vid: str, *, latest: bool = False, marker: bool = False) -> Version:
    return Version(ObjectInfo(PREFIX + key, 0 if marker else 10, "STANDARD", T0), vid, latest,
                   marker)


def _stream(state: str = "uploaded") -> StreamRow:
    return StreamRow(1, "local", "tank/data", "cold", "full", None, None, 7, None, "1", 1, 10,
                     10, PREFIX, "STANDARD", "zstd", state, T0, T0, None)


VOLUMES = {1: [VolumeRow(1, 1, 0, PREFIX + "vol-000000.zst", 10, 10, "0" * 64, "mine", T0)]}


def test_versions_not_zbaks_and_every_marker_are_strays_zbaks_own_never():
    listing = [_v("manifest.json", "marker", latest=True, marker=True),
               _v("manifest.json", "first"),
               _v("stray.tmp", "other", latest=True),  # no catalogued stream owns it
               _v("vol-000000.zst", "evil", latest=True), _v("vol-000000.zst", "mine"),
               _v("vol-000000.zst", "older")]
    found = strays(listing, [_stream()], VOLUMES)
    assert [(s.key.removeprefix(PREFIX), s.version_id, s.marker) for s in found] == [
        ("manifest.json", "marker", True), ("vol-000000.zst", "evil", False),
        ("vol-000000.zst", "older", False)]
    assert {s.stream_id for s in found} == {1}


def test_a_recorded_manifest_version_is_zbaks_even_when_it_is_not_the_first():
    """The catalog records the manifest versions the upload made (revision 0011): the
    recorded one is never a stray; the key's first one then is, as any other."""
    listing = [_v("manifest.json", "recorded", latest=True), _v("manifest.json", "first")]
    found = strays(listing, [_stream()], VOLUMES, [ManifestLock(1, "recorded", "copy", T0)])
    assert [s.version_id for s in found] == ["first"]


def test_a_condemned_streams_keys_are_left_to_its_chain_delete():
    listing = [_v("vol-000000.zst", "evil", latest=True), _v("vol-000000.zst", "mine")]
    assert strays(listing, [_stream("condemned")], VOLUMES) == []


def test_a_version_is_kept_while_its_own_lock_holds_and_deleted_once_it_lapses():
    stray = Stray(PREFIX + "vol-000000.zst", "evil", False, T0, 1,
                  T0 + dt.timedelta(hours=1))
    kept = decide(stray, T0)
    assert not kept.delete
    assert kept.reason == "unknown version, locked until 2026-11-01 01:00:00 UTC (Object Lock)"
    assert decide(stray, T0 + dt.timedelta(hours=1)).delete
    unlocked = decide(Stray(stray.key, "evil", False, T0, 1), T0)
    assert unlocked.delete and "not locked" in unlocked.reason
    assert decide(Stray(stray.key, "m", True, T0, 1), T0).delete
