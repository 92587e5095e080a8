"""The upload progress record keeps each volume's stored version, so a resumed upload
catalogues the versions of the volumes it skipped (docs/design.md#object-lock), and names the
hash of each volume's raw bytes by its algorithm (docs/decisions.md#the-raw-volume-hash-is-blake3)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from zrepl_py.archive.progress import DoneVolume, Progress
from zrepl_py.catalog.rows import StoredVersion
from zrepl_py.objects.manifest import VolumeRecord

SHA = "cd" * 32
UNTIL = dt.datetime(2026, 12, 28, 14, 0, 1, tzinfo=dt.UTC)


def test_a_record_reads_back_each_volumes_version_and_lock_date():
    record = Progress(8, "zstd-3", (
        DoneVolume(VolumeRecord(0, "p/vol-000000.zst", 8, 4, SHA), SHA, StoredVersion("v0", UNTIL)),
        DoneVolume(VolumeRecord(1, "p/vol-000001.zst", 8, 4, SHA), SHA, StoredVersion("v1", None)),
        DoneVolume(VolumeRecord(2, "p/vol-000002.zst", 3, 2, SHA), SHA)))
    assert Progress.from_json(record.to_json()) == record


def test_a_record_written_before_versions_were_kept_reads_as_no_version():
    old = json.dumps({"volume_size": 8, "codec": "zstd-3", "volumes": [
        {"index": 0, "key": "p/vol-000000.zst", "raw_bytes": 8, "stored_bytes": 4,
         "sha256": SHA, "raw_sha256": SHA}]}).encode()
    (volume,) = Progress.from_json(old).volumes
    assert volume.version is None and volume.record.key == "p/vol-000000.zst"
    assert (volume.raw_algorithm, volume.raw_hash) == ("sha256", SHA)


def test_a_record_names_each_volumes_raw_hash_by_its_algorithm():
    record = Progress(8, "zstd-3", (
        DoneVolume(VolumeRecord(0, "p/vol-000000.zst", 8, 4, SHA), "ab" * 32),
        DoneVolume(VolumeRecord(1, "p/vol-000001.zst", 8, 4, SHA), SHA, raw_algorithm="sha256")))
    volumes = json.loads(record.to_json())["volumes"]
    assert [(v.get("raw_blake3"), v.get("raw_sha256")) for v in volumes] == [
        ("ab" * 32, None), (None, SHA)]
    assert Progress.from_json(record.to_json()) == record


@pytest.mark.parametrize("hashes", [{}, {"raw_md5": "ab" * 16}])
def test_a_volume_naming_no_known_raw_hash_is_no_record(hashes):
    """Refused with the errors ``ProgressHome.read`` reads as an unreadable record."""
    bad = json.dumps({"volume_size": 8, "codec": "zstd-3", "volumes": [
        {"index": 0, "key": "p/vol-000000.zst", "raw_bytes": 8, "stored_bytes": 4,
         "sha256": SHA, **hashes}]}).encode()
    with pytest.raises((KeyError, TypeError, ValueError)):
        Progress.from_json(bad)
