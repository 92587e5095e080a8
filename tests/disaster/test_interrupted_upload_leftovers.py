"""An archive killed mid-put leaves what the put had written; the rerun removes it.

``kill -9`` of ``zbak archive`` (a process, as cron runs it) while it uploads an 80 MiB full of
random data in 4 MiB volumes, once four volumes are durable and the fifth is being written:
the ``file://`` store keeps that put's temporary file (``.vol-000004.zst.partial-...``), S3
an open multipart upload. What must hold
(``docs/decisions.md#leftover-uploads-of-interrupted-archives``):

* ``zbak audit`` reports the leftover before the rerun, with its key and size;
* the rerun converges (exit 0, the stored volumes resumed) and leaves nothing of the
  killed put behind, and ``zbak audit --deep`` is clean;
* a leftover under ANOTHER stream's prefix (another dataset's archive, which could be running
  now) is not the rerun's to remove, however old: the audit reports it, ``zbak audit
  --repair --stale-uploads-days 0`` removes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from conftest import MIB, PACED, PACED_VOLUME, volume_in_flight

from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import PROGRESS

pytestmark = [pytest.mark.zfs, pytest.mark.slow]

SIZE = 80 * MIB
VOLUME = 4 * MIB


def big_snapshot(site, store_toml: str, volume: int = VOLUME) -> None:
    """Jobs ``data`` (``site.data``) and ``other`` (``POOL/other``, never run) archiving to
    store ``cold``; an 80 MiB snapshot ``@big`` of ``site.data``."""
    subprocess.run(["zfs", "create", f"{site.pool}/other"], check=True)
    site.write(f"""
        [stores.cold]
        {store_toml}
        volume_size = {volume}
        [jobs.data]
        dataset = "{site.data}"
        [jobs.data.archive]
        store = "cold"
        [jobs.other]
        dataset = "{site.pool}/other"
        [jobs.other.archive]
        store = "cold"
    """)
    site.ok("init", "--no-checks")
    (site.mount / "big.bin").write_bytes(os.urandom(SIZE))
    subprocess.run(["zfs", "snapshot", f"{site.data}@big"], check=True)


def test_a_rerun_removes_the_temporary_file_of_the_put_a_kill_interrupted(site):
    store = site.tmp / "store"
    store.mkdir()
    big_snapshot(site, f'url = "file://{store}"')
    # Job other's stream in the same store, whose put was cut an hour ago (or runs now):
    # not this stream's, so the rerun leaves it.
    other_dir = store / "local" / site.pool / "other" / f"{1:020d}-full-{7:016x}"
    other_dir.mkdir(parents=True)
    other = other_dir / ".vol-000000.zst.partial-abc12345"
    other.write_bytes(b"x" * 1000)
    an_hour_ago = time.time() - 3600
    os.utime(other, (an_hour_ago, an_hour_ago))

    site.kill_when(volume_in_flight(store, 4), "archive", "data")
    prefix = next(store.rglob(PROGRESS)).parent
    left = sorted(prefix.glob(".vol-*.partial-*"))
    assert left, "the kill should have left the fifth volume's temporary file"
    key = str(left[0].relative_to(store).with_name(left[0].name.split(".partial-")[0][1:]))

    found = {f["key"]: f for f in site.unfinished_uploads()}
    assert key in found, found
    assert f"temporary file {left[0].name}, {left[0].stat().st_size:,} bytes" in (
        found[key]["problem"]), found[key]
    assert found[key]["dataset"] == site.data and found[key]["severity"] == "info"

    rows = json.loads(site.ok("archive", "data", "--json"))["rows"]
    assert rows[0]["stream"] == "full @big" and "resumed" in rows[0]["volumes"], rows
    assert not [p for p in store.rglob("*") if ".partial-" in p.name and p != other], \
        sorted(store.rglob(".*"))
    assert other.exists(), "the rerun removed another stream's leftover"
    deep = site.run("audit", "--deep", "--json")
    assert deep.returncode == ExitStatus.OK, deep.stdout + deep.stderr
    (report,) = [f for f in json.loads(deep.stdout)["findings"]
                 if f["problem"].startswith("an unfinished upload of ")]
    assert report["key"] == str(other.relative_to(store).with_name("vol-000000.zst"))
    assert "1,000 bytes" in report["problem"] and report["dataset"] == f"{site.pool}/other"

    site.ok("audit", "--repair", "--yes", "--stale-uploads-days", "0")
    assert not [p for p in store.rglob("*") if ".partial-" in p.name]
    assert site.unfinished_uploads() == []


@pytest.mark.s3
def test_a_rerun_to_s3_aborts_the_multipart_upload_a_kill_left_open(site, s3_server, s3_bucket):
    """32 MiB volumes go up as multipart uploads of four 8 MiB parts, paced (``PACED``); the
    kill lands once a volume is durable and the next one's upload holds a part."""
    big_snapshot(site, f'url = "s3://{s3_bucket}/zbak"\nendpoint = "{s3_server.endpoint_url}"'
                       f'\nregion = "us-east-1"\n{PACED}', volume=PACED_VOLUME)
    client = s3_server.client()

    def uploads() -> list[dict]:
        return client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])

    def part_in_flight_after_a_volume() -> bool:
        listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="zbak/").get("Contents", ())
        if not any(item["Key"].endswith("/" + PROGRESS) for item in listed):
            return False
        return any(client.list_parts(Bucket=s3_bucket, Key=u["Key"], UploadId=u["UploadId"])
                   .get("Parts") for u in uploads())

    site.kill_when(part_in_flight_after_a_volume, "archive", "data")
    found = {f["key"]: f for f in site.unfinished_uploads()}
    # Read after the audit: moto may still store the part whose request the kill cut.
    (upload,) = uploads()
    parts = client.list_parts(Bucket=s3_bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    size = sum(p["Size"] for p in parts["Parts"])
    key = upload["Key"].removeprefix("zbak/")
    assert f"multipart upload {upload['UploadId']}, {size:,} bytes" in found[key]["problem"], \
        found

    rows = json.loads(site.ok("archive", "data", "--json"))["rows"]
    assert rows[0]["stream"] == "full @big" and "resumed" in rows[0]["volumes"], rows
    assert uploads() == []
    assert site.run("audit", "--deep").status == ExitStatus.OK
    assert site.unfinished_uploads() == []
