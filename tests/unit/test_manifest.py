"""Stream manifests (objects/manifest.py): the JSON round trip and what a reader refuses."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from zrepl_py.errors import StreamCorrupt
from zrepl_py.objects.checked import canonical_sha256
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest, VolumeRecord

BIG_GUID = 2**64 - 3


def manifest(**changes) -> Manifest:
    fields = dict(
        host="local", dataset="tank/a b", kind="incremental",
        from_snap=CarriedSnapshot("0", 17, 5), to_snap=CarriedSnapshot("9", BIG_GUID, 30),
        snapshots=(CarriedSnapshot("5", 99, 20), CarriedSnapshot("9", BIG_GUID, 30)),
        volumes=(VolumeRecord(0, "k/vol-000000.zst", 10, 4, "a" * 64),
                 VolumeRecord(1, "k/vol-000001.zst", 3, 2, "c" * 64)),
        compression="zstd", compression_level=3, send_flags=("-I",), storage_class="GLACIER",
        tool="zbak 0.1.0", created_at=dt.datetime(2026, 11, 21, 1, 2, 3, tzinfo=dt.UTC))
    fields.update(changes)
    return Manifest(**fields)


def test_a_manifest_survives_the_json_round_trip_with_64_bit_guids_written_as_strings():
    m = manifest()
    data = m.to_json()
    assert json.loads(data)["to"]["guid"] == str(BIG_GUID)
    assert Manifest.from_json(data, "here") == m
    assert json.loads(data)["raw_bytes"] == 13 and json.loads(data)["stored_bytes"] == 6


@pytest.mark.parametrize("damage", [
    lambda o: o.update(format="zbak-stream/9"),
    lambda o: o.update(raw_bytes=14),
    lambda o: o["volumes"].reverse(),
    lambda o: o.update(volumes=[]),
    lambda o: o["volumes"][0].update(sha256="xyz"),
    lambda o: o.update(kind="full"),
    lambda o: o["to"].update(guid=str(2**64)),
    lambda o: o.pop("dataset"),
    lambda o: o["volumes"][0].update(raw_sha256="b" * 64),  # /2 holds no raw hash
    lambda o: o.update(compression="zstd"),  # /1's field in a /2 manifest
])
def test_a_damaged_or_inconsistent_manifest_is_refused_with_its_location(damage):
    obj = json.loads(manifest().to_json())
    damage(obj)
    with pytest.raises(StreamCorrupt, match="manifest store:key"):
        Manifest.from_json(json.dumps(obj).encode(), "store:key")


def test_text_that_is_not_json_is_refused():
    with pytest.raises(StreamCorrupt):
        Manifest.from_json(b"\x00garbage", "store:key")


def test_a_sealed_stream_s_manifest_names_its_codec_chain_and_holds_no_raw_hash():
    m = manifest(compression="zstd+age")
    obj = json.loads(m.to_json())
    assert obj["format"] == "zbak-stream/2" and obj["codec"] == ["zstd", "age"]
    assert "raw_sha256" not in m.to_json().decode() and "compression" not in obj
    assert Manifest.from_json(m.to_json(), "here") == m


def test_a_format_1_manifest_is_still_read_and_its_raw_hashes_are_dropped():
    """Written before sealed storage: ``compression`` instead of ``codec``, a
    ``raw_sha256`` per volume; a malformed raw hash is still refused."""
    obj = json.loads(manifest().to_json())
    obj.pop("sha256")
    obj.update(format="zbak-stream/1", compression="+".join(obj.pop("codec")))
    for volume in obj["volumes"]:
        volume["raw_sha256"] = "b" * 64
    obj["sha256"] = canonical_sha256(obj)
    assert Manifest.from_json(json.dumps(obj).encode(), "here") == manifest()
    obj.pop("sha256")
    obj["volumes"][0]["raw_sha256"] = "xyz"
    with pytest.raises(StreamCorrupt, match="malformed sha256"):
        Manifest.from_json(json.dumps(obj).encode(), "here")
