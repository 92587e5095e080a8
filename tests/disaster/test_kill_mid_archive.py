"""docs/decisions.md#an-interrupted-upload-resumes-by-its-raw-volume-hashes, an archive killed
mid-upload: ``kill -9`` of ``zbak archive`` (a process, as cron or systemd runs it) while it
uploads an 80 MiB full of random data in 4 MiB volumes.

The kill lands after the first volume, about half of them, or all but the last one or two
(``progress.json`` is polled). Then, with no help:

* the next ``zbak archive`` converges: exit 0, the stored volumes are resumed (hashed, not
  uploaded again), and its progress sampler fires (``zbak status``'s running-transfer file
  shows bytes moved; before the fix, every resume of such a stream died with "'Progress'
  object is not callable");
* the store holds exactly what the catalog owns (volumes, manifest and copy, the catalog
  export; no ``progress.json``); the kill's temporary file of the ``file://`` store is not an
  object and ``zbak audit --repair`` removes it;
* ``zbak audit`` is clean and a restore of the snapshot gives the original content.

Every ``zfs send`` of these runs goes through ``pv -L`` at ``SEND_RATE``
(``support.cli.rate_limited_zfs``): a run moves its 128 MiB in 4 s or more however fast the
host, so the kill lands mid-stream and the sampler (one sample a second) fires in every
rerun, also one that only hashes the volumes it resumes.

One kill point runs against moto's S3 server too (4 MiB volumes go up as single PutObjects,
so a kill leaves no multipart upload behind), and one with 32 MiB volumes, each a multipart
upload of four 8 MiB parts sent four at a time: the kill lands while parts are in flight, the
rerun resumes all the same, and ``zbak audit --repair`` aborts the upload the kill left open.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import botocore.exceptions
import pytest
from conftest import MIB, content_of, restored_content
from support.archive_checks import catalog_of, catalogued, converged_problems
from support.cli import rate_limited_zfs, start_zbak, zfs

from zrepl_py.config.loading import load_config
from zrepl_py.objects.layout import PROGRESS
from zrepl_py.observe.transfers import DIRECTORY as RUNNING
from zrepl_py.stores.registry import open_store

pytestmark = [pytest.mark.zfs, pytest.mark.slow]

SEND_RATE = 32 * MIB
"""Bytes per second of every ``zfs send`` here: 128 MiB take 4 s or more."""
SIZE = 128 * MIB
VOLUME = 4 * MIB
TOTAL = SIZE // VOLUME + 1  # the send stream is a little longer than the file


def archive_config(site, store_toml: str, volume: int = VOLUME) -> None:
    site.write(f"""
        [stores.cold]
        {store_toml}
        volume_size = {volume}
        [jobs.data]
        dataset = "{site.data}"
        [jobs.data.archive]
        store = "cold"
        compression_level = 15
    """)
    site.ok("init", "--no-checks")
    (site.mount / "big.bin").write_bytes(os.urandom(SIZE))
    zfs("snapshot", f"{site.data}@big")


def kill_after(site, volumes: int, recorded, total: int = TOTAL) -> int:
    """Run ``zbak archive`` as a process and SIGKILL it once ``recorded()`` (the volume
    count of the upload's progress.json, or None) reaches ``volumes``; return that count."""
    proc = start_zbak("--config", str(site.config), "archive",
                      env={**slow_send(site), "ZBAK_LOG_LEVEL": "WARNING"})
    try:
        deadline = time.monotonic() + 120
        seen = None
        while time.monotonic() < deadline and proc.poll() is None:
            seen = recorded()
            if seen is not None and seen >= volumes:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"the archive was not killed: {err.decode()}"
    assert seen is not None and seen < total
    return seen


def slow_send(site) -> dict[str, str]:
    """The environment whose ``zfs send`` runs at ``SEND_RATE`` (see the module docstring)."""
    return rate_limited_zfs(site.tmp / "slow-zfs", SEND_RATE)


def file_progress(store: Path):
    def recorded() -> int | None:
        for path in store.rglob(PROGRESS):
            try:
                return len(json.loads(path.read_bytes())["volumes"])
            except (OSError, ValueError):
                return None  # replaced under us: read it again
        return None
    return recorded


def rerun_converges(site, killed_at: int, *, total: int = TOTAL) -> None:
    """The rerun resumes, its progress sampler fires (the running-transfer file ``zbak
    status`` reads shows bytes moved while it runs), and it leaves exactly the catalog's
    objects."""
    proc = start_zbak("--config", str(site.config), "archive", "--json",
                      env={**slow_send(site), "ZBAK_LOG_LEVEL": "WARNING"})
    moved = _bytes_published(site.tmp / "state" / RUNNING, proc)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{out.decode()}{err.decode()}"
    row = json.loads(out)["rows"][0]
    assert row["stream"] == "full @big", row
    written, _, resumed = row["volumes"].partition(", ")
    assert resumed and int(resumed.split()[0]) >= killed_at, row
    assert int(written.split()[0]) + int(resumed.split()[0]) == total, row
    assert (site.tmp / "slow-zfs" / "sends.log").read_text(), "zfs send was not rate-limited"
    assert moved > 0, "the resumed send's progress sampler never fired"
    config = load_config(site.config)
    backend = open_store("cold", config.stores["cold"])
    try:
        with catalog_of(site.config) as catalog:
            streams = catalogued(catalog, site.data)
        assert [(s.kind, s.to_name, len(v)) for s, v in streams] == [("full", "big", total)]
        assert converged_problems(backend, streams) == []
    finally:
        backend.close()
    site.ok("audit")
    into = f"{site.pool}/back"
    site.ok("restore", site.data, "--to", "@big", "--into", into, "--from", "cold", "--yes")
    assert restored_content(into) == content_of(f"{site.data}@big", site.pool, "big")


def _bytes_published(running: Path, proc) -> int:
    """The most bytes an archive's running-transfer file showed while ``proc`` ran (the
    file is replaced atomically, so each read sees a whole record)."""
    most = 0
    while proc.poll() is None:
        for path in running.glob("archive-*.json"):
            try:
                most = max(most, json.loads(path.read_bytes()).get("bytes") or 0)
            except (OSError, ValueError):
                continue  # removed as the transfer ended
        time.sleep(0.05)
    return most


@pytest.mark.parametrize("point", [1, TOTAL // 2, TOTAL - 2])
def test_an_archive_killed_mid_upload_resumes_on_the_next_run_and_restores(site, point):
    store = site.tmp / "store"
    store.mkdir()
    archive_config(site, f'url = "file://{store}"')
    killed_at = kill_after(site, point, file_progress(store))
    rerun_converges(site, killed_at)
    strays = [p for p in store.rglob("*") if p.is_file() and ".partial-" in p.name]
    assert len(strays) <= 1, strays  # at most the put the kill interrupted
    site.ok("audit", "--repair", "--yes", "--stale-uploads-days", "0")
    assert not [p for p in store.rglob("*") if p.is_file() and ".partial-" in p.name]


def test_an_archive_to_s3_killed_mid_upload_resumes_on_the_next_run(site, s3_server, s3_bucket):
    archive_config(site, f'url = "s3://{s3_bucket}/zbak"\nendpoint = "{s3_server.endpoint_url}"'
                         '\nregion = "us-east-1"')
    client = s3_server.client()

    def recorded() -> int | None:
        listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="zbak/")
        for item in listed.get("Contents", ()):
            if item["Key"].endswith("/" + PROGRESS):
                body = client.get_object(Bucket=s3_bucket, Key=item["Key"])["Body"].read()
                return len(json.loads(body)["volumes"])
        return None

    killed_at = kill_after(site, TOTAL // 2, recorded)
    rerun_converges(site, killed_at)
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def test_an_archive_to_s3_killed_while_parts_upload_concurrently_resumes_and_repair_aborts_the_upload(
        site, s3_server, s3_bucket):
    """32 MiB volumes go up as multipart uploads of four 8 MiB parts, four at a time (the
    store's default part size and upload concurrency); the kill lands while a volume's parts
    are in flight. The rerun skips the durable volumes and converges; the upload the kill
    left open is no object, and ``zbak audit --repair`` aborts it."""
    volume = 32 * MIB
    total = SIZE // volume + 1
    archive_config(site, f'url = "s3://{s3_bucket}/zbak"\nendpoint = "{s3_server.endpoint_url}"'
                         '\nregion = "us-east-1"', volume)
    client = s3_server.client()

    def recorded() -> int | None:
        """The progress.json volume count, once a multipart upload with a part is open."""
        uploads = client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
        try:
            if not any(client.list_parts(Bucket=s3_bucket, Key=u["Key"], UploadId=u["UploadId"])
                       .get("Parts") for u in uploads):
                return None
        except botocore.exceptions.ClientError:
            return None  # NoSuchUpload: it completed between the two calls
        listed = client.list_objects_v2(Bucket=s3_bucket, Prefix="zbak/")
        for item in listed.get("Contents", ()):
            if item["Key"].endswith("/" + PROGRESS):
                body = client.get_object(Bucket=s3_bucket, Key=item["Key"])["Body"].read()
                return len(json.loads(body)["volumes"])
        return None

    killed_at = kill_after(site, 1, recorded, total)
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads"), \
        "the kill should have left a multipart upload open"
    rerun_converges(site, killed_at, total=total)
    site.ok("audit", "--repair", "--yes", "--stale-uploads-days", "0")
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
