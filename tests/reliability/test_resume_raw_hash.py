"""An interrupted upload resumes by the BLAKE3 of each stored volume's raw bytes, and a progress
record written before BLAKE3 (``raw_sha256``) is still resumed by its SHA-256
(docs/decisions.md#the-raw-volume-hash-is-blake3).

``zbak archive`` (the real CLI under ``support/crash_runner.py``) of a 3 MiB full in 1 MiB volumes
is killed (SIGKILL) once its progress record lists two volumes; then the record is left as
written, or rewritten as the older code wrote it (the SHA-256 of each volume's raw bytes, or
a SHA-256 of other bytes), and ``zbak archive`` runs again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import blake3
import pytest
import zstandard
from support.cli import faulty_zbak, file_archive_config, prop, run_zbak, zfs

from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import PROGRESS

pytestmark = [pytest.mark.zfs]

MiB = 1 << 20


def raw_of(volume: Path) -> bytes:
    """The raw bytes of a stored (zstd) volume."""
    return zstandard.ZstdDecompressor().decompressobj().decompress(volume.read_bytes())


@pytest.mark.parametrize("record", ["as written", "old, same bytes", "old, other bytes"])
def test_a_killed_upload_resumes_by_the_raw_hash_its_record_names(zpool, tmp_path, record):
    data = f"{zpool.name}/data"
    zfs("create", data)
    (Path(prop(data, "mountpoint")) / "a.bin").write_bytes(os.urandom(3 * MiB))
    zfs("snapshot", f"{data}@0")
    config, store = file_archive_config(tmp_path, data, volume_size="1MiB")
    assert run_zbak("--config", str(config), "init", "--no-checks")[0] == ExitStatus.OK
    # Steps: volume 0, its record, volume 1, its record: killed with two volumes recorded.
    killed = faulty_zbak("--config", str(config), "archive",
                         env={"ZBAK_FAULT_KILL_AFTER": "4", "ZBAK_LOG_LEVEL": "WARNING"})
    assert killed.returncode == -9, killed.stderr
    (path,) = store.rglob(PROGRESS)
    written = json.loads(path.read_bytes())
    volumes = written["volumes"]
    assert len(volumes) == 2
    raws = [raw_of(store / v["key"]) for v in volumes]
    assert [v["raw_blake3"] for v in volumes] == [blake3.blake3(r).hexdigest() for r in raws]
    assert not [v for v in volumes if "raw_sha256" in v]
    if record != "as written":
        for volume, raw in zip(volumes, raws, strict=True):
            del volume["raw_blake3"]
            volume["raw_sha256"] = hashlib.sha256(
                raw if record == "old, same bytes" else raw + b"\0").hexdigest()
        path.write_text(json.dumps(written))
    stamps = {v["key"]: (store / v["key"]).stat().st_mtime_ns for v in volumes}

    status, out, err = run_zbak("--config", str(config), "archive", "--json")
    assert status == ExitStatus.OK, out + err
    (row,) = json.loads(out)["rows"]
    kept = [key for key, stamp in stamps.items() if (store / key).stat().st_mtime_ns == stamp]
    if record == "old, other bytes":
        assert kept == [], "a volume whose recorded hash differs was kept"
        assert "resumed" not in row["volumes"], row
    else:
        assert kept == list(stamps), "a volume the record lists was uploaded again"
        assert "resumed" in row["volumes"], row
    assert not list(store.rglob(PROGRESS))
    into = f"{zpool.name}/back"
    status, out, err = run_zbak("--config", str(config), "restore", data, "--to", "@0",
                                "--into", into, "--from", "cold", "--yes")
    assert status == ExitStatus.OK, out + err
    assert prop(f"{into}@0", "guid") == prop(f"{data}@0", "guid")
