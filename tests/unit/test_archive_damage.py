"""What a listing of a stream's prefix says about it (archive/damage.py, pure part)."""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.archive.damage import stream_damage
from zrepl_py.catalog.rows import StreamRow, VolumeRow
from zrepl_py.stores.base import ObjectInfo, Thaw

NOW = dt.datetime(2026, 11, 25, 12, tzinfo=dt.UTC)
PREFIX = "local/tank/d/00000000000000000040-incr-00000000000003e8-00000000000003e9/"
STREAM = StreamRow(
    id=7, host="local", dataset="tank/d", store="cold", kind="incremental", parent_id=6,
    from_guid=1000, to_guid=1001, from_name="3", to_name="4", to_createtxg=40, raw_bytes=300,
    stored_bytes=300, object_prefix=PREFIX, storage_class="STANDARD", compression="zstd",
    state="uploaded", created_at=NOW, uploaded_at=NOW, verified_at=None)
VOLUMES = [VolumeRow(i + 1, 7, i, f"{PREFIX}vol-{i:06d}.zst", 100, 100, "0" * 64)
           for i in range(3)]


def listing(*leaves: str, sizes: dict[str, int] | None = None) -> dict[str, ObjectInfo]:
    sizes = sizes or {}
    return {PREFIX + leaf: ObjectInfo(PREFIX + leaf, sizes.get(leaf, 100), "STANDARD", NOW,
                                      Thaw.NOT_NEEDED) for leaf in leaves}


ALL = ("vol-000000.zst", "vol-000001.zst", "vol-000002.zst", "manifest.json",
       "manifest.json.copy")


@pytest.mark.parametrize("leaves", [ALL, ALL[:-1], ALL[:3] + ALL[4:]])
def test_a_stream_whose_volumes_and_a_manifest_are_listed_is_whole(leaves):
    assert stream_damage(STREAM, VOLUMES, listing(*leaves)) is None


def test_a_missing_volume_is_a_loss_naming_the_stream_and_the_key():
    damage = stream_damage(STREAM, VOLUMES, listing(*(ALL[:1] + ALL[2:])))
    assert damage.lost and damage.stream is STREAM
    assert "stream 7 (@4)" in damage.problem
    assert f"{PREFIX}vol-000001.zst) is missing" in damage.problem


def test_a_volume_of_another_size_is_a_loss():
    damage = stream_damage(STREAM, VOLUMES, listing(*ALL, sizes={"vol-000002.zst": 42}))
    assert damage.lost and "has 42 bytes, the catalog records 100" in damage.problem


def test_a_manifest_missing_with_its_copy_is_damage_but_no_loss():
    damage = stream_damage(STREAM, VOLUMES, listing(*ALL[:3]))
    assert not damage.lost and "manifest.json and manifest.json.copy are missing" in damage.problem
