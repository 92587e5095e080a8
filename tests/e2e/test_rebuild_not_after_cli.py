"""``zbak catalog rebuild STORE --not-after TIME`` (docs/security.md#recovery-after-an-intrusion)
as the admin types it on a clean host, with a fresh state directory and read-only credentials
(moto behind ``support.s3proxy`` refusing every write, as S3 answers a key allowed only
``s3:Get*``/``s3:List*``): the store is read as it stood at TIME, so an intruder's overwritten
manifests and forged newer chain are ignored and listed as untrusted, and the old chain
rebuilds and restores. Without ``--not-after`` (the second case) the same store rebuilds the
forgery and loses the real chain: so the test can fail. A store without versions refuses a
TIME its newer objects make meaningless, with one line and exit 2."""

from __future__ import annotations

import json
import os
import textwrap
import uuid
from pathlib import Path

import pytest
from support.catalog import catalogued_versions
from support.cli import exists, initialised, prop, restored_content, tree_digest, zfs
from support.intrusion import (
    FORGED_NAME,
    clean_host,
    forge_newer_chain,
    server_cutoff,
    store_table,
)
from support.s3proxy import S3Proxy

from zrepl_py.errors import ExitStatus

KiB = 1 << 10


@pytest.mark.parametrize("cutoff", [True, False], ids=["not-after", "newest"])
def test_rebuild_not_after_ignores_overwritten_manifests_and_a_forged_chain(
        zpool, tmp_path, s3_server, s3_bucket, capsys, cutoff):
    bucket = f"zbak-lock-{uuid.uuid4().hex[:12]}"
    client = s3_server.client()
    client.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    (mount / "a").write_bytes(os.urandom(256 * KiB))
    zfs("snapshot", f"{data}@1")
    (mount / "b").write_bytes(os.urandom(64 * KiB))
    zfs("snapshot", f"{data}@2")
    table = store_table(bucket, s3_server.endpoint_url, s3_server.region)
    (tmp_path / "master").mkdir()
    master = initialised(tmp_path / "master", table + textwrap.dedent(f"""
        [jobs.data]
        dataset = "{data}"
        [jobs.data.archive]
        store = "cold"
    """), capsys)
    status, out, err = master("archive")
    assert status == ExitStatus.OK, out + err
    versions = client.list_object_versions(Bucket=bucket, Prefix="zbak/")["Versions"]
    manifests = sorted(v["Key"].removeprefix("zbak/") for v in versions
                       if v["Key"].endswith(("manifest.json", "manifest.json.copy")))
    assert len(manifests) == 4  # a full and an incremental, each with its copy
    at = server_cutoff(client, bucket)

    forged = forge_newer_chain(client, bucket, "zbak", manifests[0])
    for key in manifests:  # the intruder's versions of the genuine manifests
        client.put_object(Bucket=bucket, Key=f"zbak/{key}", Body=b"{}")

    proxy = S3Proxy(s3_server.endpoint_url, read_only=True)
    try:
        run = clean_host(tmp_path / "clean", store_table(bucket, proxy.url, s3_server.region),
                         "data", data)
        rebuild = ["catalog", "rebuild", "cold", "--json"]
        status, out, err = run(*rebuild, *(["--not-after", at.isoformat()] if cutoff else []))
        doc = json.loads(out)
        if not cutoff:  # the newest versions: the forgery is in, the real chain is not
            assert status == ExitStatus.FAILED, out + err
            assert len(doc["added"]) == 1 and len(doc["skipped"]) == 2, doc
            status, out, err = run("restore", data, "--to", "@2", "--into",
                                   f"{zpool.name}/back", "--from", "cold", "--yes")
            assert status != ExitStatus.OK and not exists(f"{zpool.name}/back"), out + err
            return
        assert status == ExitStatus.OK, out + err
        assert len(doc["added"]) == 2 and doc["skipped"] == [], doc
        untrusted = {(u["key"], u["kind"]) for u in doc["untrusted"]}
        assert untrusted == {(k, "version") for k in forged + manifests}, untrusted
        recorded = catalogued_versions(tmp_path / "clean" / "state" / "catalog.sqlite")
        assert len(recorded) == 2
        for key, version_id, until in recorded:  # the genuine version, its lock's date
            head = client.head_object(Bucket=bucket, Key=f"zbak/{key}", VersionId=version_id)
            assert head["ObjectLockMode"] == "COMPLIANCE" and head["LastModified"] <= at
            assert until == head["ObjectLockRetainUntilDate"], key
        status, out, err = run("catalog", "rebuild", "cold", "--merge", "--not-after",
                               at.isoformat())  # the table, as the admin reads it
        assert status == ExitStatus.OK, out + err
        assert "2 already in the catalog" in out and "7 later version(s)" in out, out
        (row,) = [line.split() for line in out.splitlines() if line.startswith(forged[0])]
        assert row[2] == "version" and row[5] == "UTC", row
        assert proxy.refused == [], "a rebuild writes nothing to the store"
        status, out, err = run("restore", data, "--to", "@2", "--into", f"{zpool.name}/back",
                               "--from", "cold", "--yes")
        assert status == ExitStatus.OK, out + err
        assert prop(f"{zpool.name}/back@2", "guid") == prop(f"{data}@2", "guid")
        assert restored_content(f"{zpool.name}/back") == tree_digest(mount)
        status, out, err = run("restore", data, "--to", f"@{FORGED_NAME}", "--into",
                               f"{zpool.name}/forged", "--from", "cold", "--yes")
        assert status != ExitStatus.OK and "Traceback" not in out + err
    finally:
        proxy.close()


def test_a_store_without_versions_refuses_a_time_older_than_its_objects_in_one_line(
        zpool, tmp_path, capsys):
    """``file://`` keeps no versions: a TIME before its newest object is refused (exit 2,
    one line naming the store and the first newer object); a TIME after every object
    rebuilds."""
    store = tmp_path / "store"
    store.mkdir()
    data = f"{zpool.name}/data"
    zfs("create", data)
    (Path(prop(data, "mountpoint")) / "a").write_bytes(os.urandom(64 * KiB))
    zfs("snapshot", f"{data}@1")
    body = (f'[stores.cold]\nurl = "file://{store}"\n[jobs.data]\ndataset = "{data}"\n'
            '[jobs.data.archive]\nstore = "cold"\n')
    for host in ("master", "clean"):
        (tmp_path / host).mkdir()
    status, out, err = initialised(tmp_path / "master", body, capsys)("archive")
    assert status == ExitStatus.OK, out + err
    run = initialised(tmp_path / "clean", body, capsys)
    status, out, err = run("catalog", "rebuild", "cold", "--not-after", "1h")
    assert status == ExitStatus.USAGE, out + err
    (line,) = err.strip().splitlines()
    assert "store cold keeps no object versions" in line and "written after" in line, line
    status, out, err = run("catalog", "rebuild", "cold", "--not-after", "nonsense")
    assert status == ExitStatus.USAGE and "--not-after: expected an ISO 8601" in err, err
    status, out, err = run("catalog", "rebuild", "cold", "--not-after", "0s", "--json")
    assert status == ExitStatus.OK, out + err
    assert len(json.loads(out)["added"]) == 1 and json.loads(out)["untrusted"] == []
