"""S3 Object Lock as the admin sets it up (docs/design.md#object-lock), on moto's
server over HTTP through the real CLI: ``zbak init`` refuses a bucket that cannot lock
objects with one line and exit 2; ``zbak archive`` into a lock store locks every version it
writes (volumes in one PutObject and in a multipart upload, manifests, the catalog export)
and keeps its upload progress out of the bucket; an intruder holding the master's keys
cannot delete any of them, and can when the store has no ``object_lock``."""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from pathlib import Path

import botocore.exceptions
import pytest
import sqlalchemy as sa
from support.catalog import catalogued_versions
from support.cli import Zbak, exists, initialised, prop, restored_content, tree_digest, zfs
from support.intrusion import clean_host, store_table

from zrepl_py.catalog.db import make_engine
from zrepl_py.catalog.export import mark_file, node_name
from zrepl_py.catalog.models import stream_table, volume_table
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import export_key, generation_key

MiB = 1 << 20
LOCK = 'object_lock = { mode = "compliance", period = "3d" }'


def _config(tmp: Path, s3_server, bucket: str, *extra: str) -> Path:
    config = tmp / "zbak.toml"
    config.write_text("\n".join([
        f'state_dir = "{tmp / "state"}"', "[stores.cold]", f'url = "s3://{bucket}/zbak"',
        f'endpoint = "{s3_server.endpoint_url}"', f'region = "{s3_server.region}"', *extra]))
    return config


@pytest.mark.parametrize("versioned", [False, True], ids=["plain", "versioned-only"])
def test_init_refuses_a_bucket_that_cannot_lock_objects_with_one_line_and_exit_2(
        tmp_path, s3_server, s3_bucket, capsys, versioned):
    if versioned:
        s3_server.client().put_bucket_versioning(
            Bucket=s3_bucket, VersioningConfiguration={"Status": "Enabled"})
    run = Zbak(_config(tmp_path, s3_server, s3_bucket, LOCK), capsys)
    status, out, err = run("init")
    assert status == ExitStatus.USAGE, out + err
    (line,) = [line for line in out.splitlines() if "store cold" in line]
    assert "FAILED" in line and f"bucket {s3_bucket} cannot lock objects" in line
    assert ("versioning enabled" if versioned else "versioning never enabled") in line
    assert "Object Lock off" in line and "[stores.cold.object_lock]" in line
    assert "Traceback" not in out + err


def test_init_accepts_a_bucket_created_with_object_lock(tmp_path, s3_server, s3_bucket, capsys):
    bucket = f"zbak-lock-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    run = Zbak(_config(tmp_path, s3_server, bucket, LOCK), capsys)
    status, out, err = run("init")
    assert status == ExitStatus.OK, out + err
    assert "versioned, Object Lock on (COMPLIANCE for 3d)" in out


def test_a_wrong_lock_mode_exits_2_naming_the_key_and_the_file(tmp_path, s3_server, s3_bucket,
                                                                capsys):
    config = _config(tmp_path, s3_server, s3_bucket,
                     'object_lock = { mode = "strict", period = "3d" }')
    status, out, err = Zbak(config, capsys)("config", "check")
    assert status == ExitStatus.USAGE
    assert "stores.cold.object_lock.mode" in err and str(config) in err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("locked", [True, False], ids=["locked", "unlocked"])
def test_every_version_an_archive_writes_is_locked_and_the_masters_keys_cannot_delete_it(
        zpool, tmp_path, s3_server, s3_bucket, capsys, locked):
    """9 MiB of random data: the volume goes up in a multipart upload (8 MiB parts), the
    manifests and the catalog export in single PutObjects. Unlocked (the same bucket, the
    store without ``object_lock``), the intruder's deletes by version id succeed."""
    bucket, client = _lock_bucket(s3_server)
    data = f"{zpool.name}/data"
    zfs("create", data)
    (Path(prop(data, "mountpoint")) / "f").write_bytes(os.urandom(9 * MiB))
    zfs("snapshot", f"{data}@1")
    run = _archiving(tmp_path, s3_server, bucket, data, capsys, "64MiB", locked)
    before = dt.datetime.now(dt.UTC)
    status, out, err = run("archive")
    after = dt.datetime.now(dt.UTC)
    assert status == ExitStatus.OK, out + err
    listing = client.list_object_versions(Bucket=bucket)
    versions = listing.get("Versions", [])
    keys = {v["Key"] for v in versions}
    assert any(k.endswith(".zst") for k in keys) and any("manifest" in k for k in keys)
    assert any("_zbak/catalog/" in k for k in keys)
    heads = {v["VersionId"]: client.head_object(Bucket=bucket, Key=v["Key"],
                                                VersionId=v["VersionId"]) for v in versions}
    assert any("-" in h["ETag"] for h in heads.values())  # the volume: a multipart upload
    if locked:
        # the upload progress stayed on the host: no progress key, no delete marker
        assert not listing.get("DeleteMarkers") and not any("progress" in k for k in keys)
        for version, head in heads.items():
            assert head.get("ObjectLockMode") == "COMPLIANCE", version
            until = head["ObjectLockRetainUntilDate"]
            assert before + dt.timedelta(days=3) <= until <= after + dt.timedelta(days=3, seconds=1)
    else:
        assert not any(h.get("ObjectLockMode") for h in heads.values())
    for v in versions:  # the intruder, with the master's keys (moto's test keys)
        delete = {"Bucket": bucket, "Key": v["Key"], "VersionId": v["VersionId"]}
        if not locked:
            client.delete_object(**delete)
            continue
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            client.delete_object(**delete)
        assert refused.value.response["Error"]["Code"] == "AccessDenied", v["Key"]
    left = client.list_object_versions(Bucket=bucket).get("Versions", [])
    assert len(left) == (len(versions) if locked else 0)
    # the catalog records each volume's version and its lock, as the upload learnt them
    recorded = catalogued_versions(tmp_path / "state" / "catalog.sqlite")
    assert recorded
    by_key = {v["Key"].removeprefix("zbak/"): v["VersionId"] for v in versions}
    for key, version_id, retain_until in recorded:
        assert version_id == by_key[key], key
        assert retain_until == (heads[version_id]["ObjectLockRetainUntilDate"] if locked
                                else None), key
    # and each manifest's and manifest copy's version, with the earlier lock (locked only)
    ((prefix, manifest, copy, until),) = _manifest_versions(tmp_path / "state" / "catalog.sqlite")
    if not locked:
        assert (manifest, copy, until) == (None, None, None)
        return
    assert (manifest, copy) == (by_key[prefix + "manifest.json"],
                                by_key[prefix + "manifest.json.copy"])
    assert until == min(heads[v]["ObjectLockRetainUntilDate"] for v in (manifest, copy))


@pytest.mark.parametrize("recorded", [True, False], ids=["versions-recorded", "no-versions"])
def test_a_restore_reads_the_recorded_versions_whatever_the_intruder_wrote_over_them(
        zpool, tmp_path, s3_server, s3_bucket, capsys, recorded):
    """A full and an incremental in a lock store; the intruder, with the master's keys,
    overwrites one volume key with garbage of the same size, another with a short one, hides
    the rest and both manifests behind delete markers. The restore reads the versions the
    catalog records and brings back @2 with its guid and files. With no versions in the
    catalog (a catalog from before revision 0010: the columns emptied), it reads the newest
    versions and fails, receiving nothing."""
    bucket, client = _lock_bucket(s3_server)
    data, mount, run = _two_streams(zpool, tmp_path, s3_server, bucket, capsys)
    catalog = tmp_path / "state" / "catalog.sqlite"
    volumes = [key for key, _, _ in catalogued_versions(catalog)]
    assert len(volumes) >= 4
    keys = [v["Key"] for v in client.list_object_versions(Bucket=bucket)["Versions"]]
    same = client.head_object(Bucket=bucket, Key=f"zbak/{volumes[0]}")["ContentLength"]
    client.put_object(Bucket=bucket, Key=f"zbak/{volumes[0]}", Body=os.urandom(same))
    client.put_object(Bucket=bucket, Key=f"zbak/{volumes[1]}", Body=b"junk")
    for key in volumes[2:] + [k.removeprefix("zbak/") for k in keys if "manifest" in k]:
        client.delete_object(Bucket=bucket, Key=f"zbak/{key}")  # a delete marker
    if not recorded:
        _forget_versions(catalog)
    status, out, err = run("restore", data, "--to", "@2", "--into", f"{zpool.name}/back",
                           "--from", "cold", "--yes")
    if not recorded:
        assert status != ExitStatus.OK and not exists(f"{zpool.name}/back"), out + err
        return
    assert status == ExitStatus.OK, out + err
    assert prop(f"{zpool.name}/back@2", "guid") == prop(f"{data}@2", "guid")
    assert restored_content(f"{zpool.name}/back") == tree_digest(mount)


def test_audit_names_every_tampered_key_and_marks_nothing_bad_and_archive_carries_on(
        zpool, tmp_path, s3_server, s3_bucket, capsys):
    """A full and an incremental in 1 MiB volumes in a lock store. The intruder, with the
    master's keys, overwrites one volume with same-size garbage twice, another with a short
    object, hides a third behind a delete marker, overwrites the full's manifest and hides the
    incremental's. ``zbak audit`` exits 4 with an error naming each of those keys as
    tampering and the older garbage as a version the catalog does not know, and marks no
    stream bad (zbak's versions are all there), nor does ``--deep``, which verifies both
    streams reading them back; the next ``zbak archive`` continues the chain
    (no new full, nothing marked bad) and ``@3`` restores with its guid and files."""
    bucket, client = _lock_bucket(s3_server)
    data, mount, run = _two_streams(zpool, tmp_path, s3_server, bucket, capsys)
    catalog = tmp_path / "state" / "catalog.sqlite"
    volumes = [key for key, _, _ in catalogued_versions(catalog)]
    manifests = sorted(v["Key"].removeprefix("zbak/") for v in
                       client.list_object_versions(Bucket=bucket)["Versions"]
                       if v["Key"].endswith("manifest.json"))
    assert len(volumes) >= 4 and len(manifests) == 2

    def put(key: str, body: bytes) -> str:
        return client.put_object(Bucket=bucket, Key=f"zbak/{key}", Body=body)["VersionId"]

    size = client.head_object(Bucket=bucket, Key=f"zbak/{volumes[0]}")["ContentLength"]
    older_garbage = put(volumes[0], os.urandom(size))
    put(volumes[0], os.urandom(size))
    put(volumes[1], b"junk")
    put(manifests[0], b"{}")
    for key in (volumes[2], manifests[1]):
        client.delete_object(Bucket=bucket, Key=f"zbak/{key}")  # a delete marker
    tampered = {volumes[0], volumes[1], volumes[2], *manifests}

    status, out, err = run("audit", "--json")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    doc = json.loads(out)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert {f["key"] for f in errors} == tampered, errors
    assert all(f["problem"].startswith("tampering: ") for f in errors), errors
    hidden = next(f for f in errors if f["key"] == volumes[2])
    assert "hidden by a delete marker" in hidden["problem"]
    unknown = [f for f in doc["findings"] if f["severity"] == "info" and older_garbage
               in f["problem"]]
    assert [f["key"] for f in unknown] == [volumes[0]], doc["findings"]
    assert doc["jobs"][0]["bad"] == [] and _states(catalog) == ["uploaded", "uploaded"]
    status, out, err = run("audit", "--deep", "--json")  # reads zbak's versions back
    doc = json.loads(out)
    assert status == ExitStatus.AUDIT_FINDINGS and doc["jobs"][0]["bad"] == [], out + err
    assert not [f for f in doc["findings"] if f["level"] == "deep"], doc["findings"]
    assert _states(catalog) == ["verified", "verified"]

    (mount / "c").write_bytes(os.urandom(1 * MiB))
    zfs("snapshot", f"{data}@3")
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    assert _states(catalog) == ["verified", "verified", "uploaded"]
    assert _kinds(catalog) == ["full", "incremental", "incremental"]
    status, out, err = run("restore", data, "--to", "@3", "--into", f"{zpool.name}/back",
                           "--from", "cold", "--yes")
    assert status == ExitStatus.OK, out + err
    assert prop(f"{zpool.name}/back@3", "guid") == prop(f"{data}@3", "guid")
    assert restored_content(f"{zpool.name}/back") == tree_digest(mount)


def test_archive_and_audit_extend_each_lock_once_less_than_half_the_period_is_left(
        zpool, tmp_path, s3_server, s3_bucket, capsys):
    """Period 3 days. The locks of all volumes but the last, and of both streams' manifests
    and manifest copies, are set back to 1 day left (in moto, which lets a lock be shortened,
    and in the catalog): ``zbak audit`` extends each of them to now + 3 days (moto's date and
    the catalog's move) and leaves the last volume, with more than half the period left,
    alone. Set back again, ``zbak archive`` (nothing new to write) extends them too. The
    catalog export's generation (primary and copy) is set back and extended with them, its
    date recorded in this machine's mark."""
    bucket, client = _lock_bucket(s3_server)
    _, _, run = _two_streams(zpool, tmp_path, s3_server, bucket, capsys)
    mark_path = _mark_path(tmp_path, export_key(node_name(), "data"))
    export = list(json.loads(mark_path.read_bytes())["versions"].items())
    assert len(export) == 2, export
    catalog = tmp_path / "state" / "catalog.sqlite"
    recorded = catalogued_versions(catalog)
    *aged, fresh = recorded
    assert len(aged) >= 4
    manifests = [(prefix + "manifest.json", version) for prefix, version, _, _
                 in _manifest_versions(catalog)]
    manifests += [(prefix + "manifest.json.copy", copy) for prefix, _, copy, _
                  in _manifest_versions(catalog)]
    assert len(manifests) == 4

    def lock_of(key: str, version_id: str) -> dt.datetime:
        return client.head_object(Bucket=bucket, Key=f"zbak/{key}",
                                  VersionId=version_id)["ObjectLockRetainUntilDate"]

    for command in ("audit", "archive"):
        short = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(microsecond=0)
        for key, version_id in [(k, v) for k, v, _ in aged] + manifests + export:
            client.put_object_retention(Bucket=bucket, Key=f"zbak/{key}", VersionId=version_id,
                                        Retention={"Mode": "COMPLIANCE",
                                                   "RetainUntilDate": short})
            assert lock_of(key, version_id) == short
        _set_retain_until(catalog, {version_id: short for _, version_id, _ in aged})
        _set_manifest_retain_until(catalog, short)
        mark = json.loads(mark_path.read_bytes())
        mark_path.write_text(json.dumps({**mark, "retain_until": f"{short:%Y-%m-%dT%H:%M:%SZ}"}))
        before = dt.datetime.now(dt.UTC)
        status, out, err = run(command)
        assert status == ExitStatus.OK, out + err
        after = dt.datetime.now(dt.UTC)
        now_recorded = {v: until for _, v, until in catalogued_versions(catalog)}
        for key, version_id, _ in aged:
            until = lock_of(key, version_id)
            assert (before + dt.timedelta(days=3) <= until
                    <= after + dt.timedelta(days=3, seconds=1)), (command, key)
            assert now_recorded[version_id] == until, (command, key)
        assert lock_of(fresh[0], fresh[1]) == fresh[2] == now_recorded[fresh[1]], command
        extended = {key: lock_of(key, version_id) for key, version_id in manifests + export}
        for key, until in extended.items():
            assert (before + dt.timedelta(days=3) <= until
                    <= after + dt.timedelta(days=3, seconds=1)), (command, key)
        assert json.loads(mark_path.read_bytes())["retain_until"] == (
            f"{min(extended[key] for key, _ in export):%Y-%m-%dT%H:%M:%SZ}"), command
        for prefix, _, _, until in _manifest_versions(catalog):
            assert until == min(extended[prefix + "manifest.json"],
                                extended[prefix + "manifest.json.copy"]), (command, prefix)


def test_prune_keeps_a_released_chain_until_its_locks_lapse_then_deletes_every_version_by_id(
        zpool, tmp_path, s3_server, s3_bucket, capsys):
    """Two chains in a lock store (period 3 days), ``keep_chains = 1``, the newer full
    verified: retention releases the older chain, so with every lock due ``zbak audit``
    extends the newer chain's and not the older's; its volumes are still locked for a day,
    so ``zbak prune --dry-run`` and ``zbak prune`` keep it, "expired, locked until DATE" (the
    latest retain-until the catalog records of its volumes and manifests), and delete
    nothing. With its locks
    moved into the past (moto lets a COMPLIANCE lock be shortened; the catalog is told the
    same) and the intruder, with the master's keys, having hidden an old key behind a delete
    marker, overwritten the newer chain's volume with same-size garbage and hidden its
    manifest, ``zbak prune`` deletes every version and marker of the old chain's keys by
    version id (the version listing shows none under its prefix) and its catalog row; the
    re-check of the releasing chain reads zbak's versions, so the tampering marks nothing
    bad, and the newer chain keeps all its versions (the intruder's unlocked ones go)."""
    bucket, client = _lock_bucket(s3_server)
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    (mount / "a").write_bytes(os.urandom(256 << 10))
    zfs("snapshot", f"{data}@1")
    run = _archiving(tmp_path, s3_server, bucket, data, capsys, "64MiB", True,
                     "keep_chains = 1")
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    (mount / "b").write_bytes(os.urandom(256 << 10))
    zfs("snapshot", f"{data}@2")
    status, out, err = run("archive", "--full")
    assert status == ExitStatus.OK, out + err
    catalog = tmp_path / "state" / "catalog.sqlite"
    (old_id, old_prefix), (new_id, new_prefix) = _chains(catalog)
    _verify(catalog, new_id)

    def versions(prefix: str) -> list[dict]:
        page = client.list_object_versions(Bucket=bucket, Prefix=f"zbak/{prefix}")
        return page.get("Versions", []) + page.get("DeleteMarkers", [])

    old, new = versions(old_prefix), versions(new_prefix)
    assert len(old) >= 2 and len(new) >= 2  # a volume and the manifest (and its copy)
    # Every lock due (1 day of 3 left, in moto and the catalog): `zbak audit` extends the
    # newer chain's and lets the released chain's lapse, or prune could never delete it.
    due = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(microsecond=0)
    for v in old + new:
        client.put_object_retention(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"],
                                    Retention={"Mode": "COMPLIANCE", "RetainUntilDate": due})
    _set_retain_until(catalog, {v["VersionId"]: due for v in old + new})
    _set_manifest_retain_until(catalog, due)
    status, out, err = run("audit")
    assert status == ExitStatus.OK, out + err
    for prefix, extended in ((old_prefix, False), (new_prefix, True)):
        locks = [u for k, _, u in catalogued_versions(catalog) if k.startswith(prefix)]
        locks += [u for p, _, _, u in _manifest_versions(catalog) if p == prefix]
        locks += [client.head_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"])[
            "ObjectLockRetainUntilDate"] for v in versions(prefix)]
        assert locks and all((u > due) == extended for u in locks), (prefix, locks)
    until = max([u for k, _, u in catalogued_versions(catalog) if k.startswith(old_prefix)]
                + [u for p, _, _, u in _manifest_versions(catalog) if p == old_prefix])
    for args in (("--dry-run",), ()):
        status, out, err = run("prune", "--json", *args)
        assert status == ExitStatus.OK, out + err
        (row,) = [r for r in json.loads(out)["streams"] if r["stream_id"] == old_id]
        assert row["action"] == "keep", row
        assert (f"expired, locked until {until.strftime('%Y-%m-%d %H:%M:%S')} UTC"
                in " ".join(row["reasons"])), row
        assert versions(old_prefix) == old and _states(catalog) == ["uploaded", "verified"]

    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).replace(microsecond=0)
    for v in old:
        client.put_object_retention(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"],
                                    Retention={"Mode": "COMPLIANCE", "RetainUntilDate": past})
    _set_retain_until(catalog, {v["VersionId"]: past for v in old})
    _set_manifest_retain_until(catalog, past)
    client.delete_object(Bucket=bucket, Key=old[0]["Key"])  # a delete marker
    (volume,) = [v["Key"] for v in new if v["Key"].endswith(".zst")]
    client.put_object(Bucket=bucket, Key=volume, Body=os.urandom(
        client.head_object(Bucket=bucket, Key=volume)["ContentLength"]))
    client.delete_object(Bucket=bucket, Key=f"zbak/{new_prefix}manifest.json")
    status, out, err = run("prune", "--json")
    assert status == ExitStatus.OK, out + err
    (row,) = [r for r in json.loads(out)["streams"] if r["stream_id"] == old_id]
    assert row["action"] == "delete", row
    assert versions(old_prefix) == []
    # the intruder's unlocked overwrite and delete marker went as versions the catalog does
    # not know; every version zbak wrote of the newer chain stays
    assert {v["VersionId"] for v in versions(new_prefix)} == {v["VersionId"] for v in new}
    assert sorted(r["action"] for r in json.loads(out)["versions"]) == ["deleted", "deleted"]
    assert _chains(catalog) == [(new_id, new_prefix)] and _states(catalog) == ["verified"]


def test_prune_deletes_versions_the_catalog_does_not_know_once_their_own_locks_lapse(
        zpool, tmp_path, s3_server, s3_bucket, capsys):
    """One stream in a lock store (period 3 days). The intruder, with the master's keys,
    overwrites its volume with same-size garbage locked for a day and hides its manifest
    behind a delete marker. ``zbak prune --dry-run`` shows the garbage "unknown version,
    locked until DATE" (the lock the store holds on that version) and the marker to delete,
    and deletes nothing; ``zbak prune`` deletes the marker by version id and keeps the
    garbage. With the garbage's lock and zbak's own volume's moved into the past (moto lets a
    COMPLIANCE lock be shortened), ``zbak prune`` deletes the garbage and never the volume
    the catalog records: the store holds exactly the versions zbak wrote, and ``zbak audit``
    finds no tampering."""
    bucket, client = _lock_bucket(s3_server)
    data = f"{zpool.name}/data"
    zfs("create", data)
    (Path(prop(data, "mountpoint")) / "a").write_bytes(os.urandom(256 << 10))
    zfs("snapshot", f"{data}@1")
    run = _archiving(tmp_path, s3_server, bucket, data, capsys, "64MiB", True)
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    catalog = tmp_path / "state" / "catalog.sqlite"
    ((key, own, _),) = catalogued_versions(catalog)
    volume = f"zbak/{key}"
    manifest = f"zbak/{key.rpartition('/')[0]}/manifest.json"

    def versions() -> set[tuple[str, str]]:
        page = client.list_object_versions(Bucket=bucket, Prefix="zbak/")
        return {(v["Key"], v["VersionId"]) for v in
                page.get("Versions", []) + page.get("DeleteMarkers", [])
                if not v["Key"].startswith("zbak/_zbak/")}  # the catalog export

    written = versions()
    size = client.head_object(Bucket=bucket, Key=volume)["ContentLength"]
    garbage = client.put_object(Bucket=bucket, Key=volume, Body=os.urandom(size))["VersionId"]
    day = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(microsecond=0)
    client.put_object_retention(Bucket=bucket, Key=volume, VersionId=garbage,
                                Retention={"Mode": "COMPLIANCE", "RetainUntilDate": day})
    marker = client.delete_object(Bucket=bucket, Key=manifest)["VersionId"]
    locked = f"unknown version, locked until {day.strftime('%Y-%m-%d %H:%M:%S')} UTC"

    for args, kept_marker in ((("--dry-run",), True), ((), False)):
        status, out, err = run("prune", "--json", *args)
        assert status == ExitStatus.OK, out + err
        rows = {r["version_id"]: r for r in json.loads(out)["versions"]}
        assert set(rows) == {garbage, marker}, rows
        assert rows[garbage]["action"] == "keep", rows
        assert rows[garbage]["reasons"][0].startswith(locked), rows
        assert rows[marker]["action"] == ("delete" if args else "deleted"), rows
        assert versions() == written | {(volume, garbage)} | (
            {(manifest, marker)} if kept_marker else set())

    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).replace(microsecond=0)
    for version_id in (garbage, own):
        client.put_object_retention(Bucket=bucket, Key=volume, VersionId=version_id,
                                    Retention={"Mode": "COMPLIANCE", "RetainUntilDate": past})
    status, out, err = run("prune")
    assert status == ExitStatus.OK, out + err
    assert "versions the catalog does not know" in out and garbage in out, out
    assert versions() == written and (volume, own) in written
    status, out, err = run("audit", "--json")
    assert status == ExitStatus.OK, out + err
    assert not [f for f in json.loads(out)["findings"] if f["severity"] == "error"], out


def test_each_catalog_export_is_written_once_and_rebuild_audit_and_archive_read_generations(
        zpool, tmp_path, s3_server, s3_bucket, capsys):
    """docs/decisions.md#write-once-catalog-exports. Two archives write generations 1 and 2
    of the job's export, each under a key of its own with its copy, one locked version each,
    and the mark names generation 2 with the versions S3 answered and their lock. With the
    second stream's manifests hidden by the intruder, a clean host's ``catalog rebuild``
    reads generation 2 (the newest) and so names that stream lost (generation 1 does not
    list it). The intruder then overwrites generation 2 and its copy with garbage, hides
    generation 1's copy and puts a generation 7 of this machine's export (one version):
    ``zbak audit`` names each as tampering (exit 4); with generation 7 gone, the next
    ``zbak archive`` checks the store against the versions its mark records (the newest are
    garbage) and writes generation 3."""
    bucket, client = _lock_bucket(s3_server)
    data, mount, run = _two_generations(zpool, tmp_path, s3_server, bucket, capsys)
    single = export_key(node_name(), "data")
    first, second = (f"zbak/{generation_key(single, n)}" for n in (1, 2))
    versions = _export_versions(client, bucket)
    assert sorted(versions) == sorted(
        (key, False) for key in (first, first + ".copy", second, second + ".copy")), versions
    locks = {key: client.head_object(Bucket=bucket, Key=key, VersionId=version_id)
             for (key, _), version_id in versions.items()}
    assert {head.get("ObjectLockMode") for head in locks.values()} == {"COMPLIANCE"}
    mark = json.loads(_mark_path(tmp_path, single).read_bytes())
    assert (mark["key"], mark["generation"]) == (second.removeprefix("zbak/"), 2), mark
    assert mark["versions"] == {k.removeprefix("zbak/"): versions[(k, False)]
                                for k in (second, second + ".copy")}, mark
    assert mark["retain_until"] == min(locks[k]["ObjectLockRetainUntilDate"] for k in (
        second, second + ".copy")).strftime("%Y-%m-%dT%H:%M:%SZ"), mark

    (_, older), (_, newer) = _chains(tmp_path / "state" / "catalog.sqlite")
    for key in (f"zbak/{newer}manifest.json", f"zbak/{newer}manifest.json.copy"):
        client.delete_object(Bucket=bucket, Key=key)  # the intruder's delete markers
    clean = clean_host(tmp_path / "clean", store_table(bucket, s3_server.endpoint_url,
                                                       s3_server.region), "data", data)
    status, out, err = clean("catalog", "rebuild", "cold", "--json")
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["lost"] == [newer], out  # generation 2 lists it, 1 does not

    for key in (second, second + ".copy"):
        client.put_object(Bucket=bucket, Key=key, Body=os.urandom(
            client.head_object(Bucket=bucket, Key=key)["ContentLength"]))
    client.delete_object(Bucket=bucket, Key=first + ".copy")
    forged = f"zbak/{generation_key(single, 7)}"  # one version: only its number gives it away
    client.put_object(Bucket=bucket, Key=forged, Body=b"{}")
    status, out, err = run("audit", "--json")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    named = {f["key"] for f in json.loads(out)["findings"] if f["severity"] == "error"
             and f["problem"].startswith("tampering: catalog export ")}
    assert named == {k.removeprefix("zbak/") for k in (second, second + ".copy",
                                                       first + ".copy", forged)}, out
    for version in client.list_object_versions(Bucket=bucket, Prefix=forged)["Versions"]:
        client.delete_object(Bucket=bucket, Key=forged, VersionId=version["VersionId"])

    (mount / "f3").write_bytes(os.urandom(64 << 10))
    zfs("snapshot", f"{data}@3")
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    third = generation_key(single, 3)
    assert json.loads(_mark_path(tmp_path, single).read_bytes())["key"] == third
    assert (f"zbak/{third}", False) in _export_versions(client, bucket)


def test_prune_deletes_older_export_generations_once_their_locks_lapse_never_the_newest(
        zpool, tmp_path, s3_server, s3_bucket, capsys):
    """docs/decisions.md#write-once-catalog-exports. Generations 1 and 2 of the export in a
    lock store (period 3 days), retention keeping both streams: ``zbak prune`` keeps
    generation 1 while it is locked. With the locks of both generations moved into the
    past (moto lets a COMPLIANCE lock be shortened), the intruder's delete marker on
    generation 1 and a generation 3 of his own, ``zbak prune`` deletes every version and
    marker of generation 1 by version id, and keeps generation 2, which the mark trusts
    (its lock lapsed too), and generation 3, the newest."""
    bucket, client = _lock_bucket(s3_server)
    _, _, run = _two_generations(zpool, tmp_path, s3_server, bucket, capsys, "keep_chains = 5")
    single = export_key(node_name(), "data")
    first, second = (f"zbak/{generation_key(single, n)}" for n in (1, 2))
    written = _export_versions(client, bucket)
    assert len(written) == 4, written
    status, out, err = run("prune")
    assert status == ExitStatus.OK, out + err
    assert _export_versions(client, bucket) == written, "generation 1 is still locked"

    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).replace(microsecond=0)
    for (key, _), version_id in written.items():
        client.put_object_retention(Bucket=bucket, Key=key, VersionId=version_id,
                                    Retention={"Mode": "COMPLIANCE", "RetainUntilDate": past})
    client.delete_object(Bucket=bucket, Key=first)  # a delete marker
    third = f"zbak/{generation_key(single, 3)}"
    forged = client.put_object(Bucket=bucket, Key=third, Body=b"{}")["VersionId"]
    status, out, err = run("prune")
    assert status == ExitStatus.OK, out + err
    assert _export_versions(client, bucket) == {
        (third, False): forged, **{(key, False): version_id for (key, _), version_id
                                   in written.items() if key.startswith(second)}}


def _two_generations(zpool, tmp: Path, s3_server, bucket: str, capsys,
                     archive: str = "") -> tuple[str, Path, Zbak]:
    """Dataset ``data`` archived twice to a lock store in ``bucket`` (64 KiB more and a
    snapshot before each: a full, then an incremental), so the job's export has generations
    1 and 2; ``archive`` as :func:`_archiving`'s. Returns the dataset, its mountpoint and the
    CLI runner."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    run = _archiving(tmp, s3_server, bucket, data, capsys, "64MiB", True, archive)
    for n in (1, 2):
        (mount / f"f{n}").write_bytes(os.urandom(64 << 10))
        zfs("snapshot", f"{data}@{n}")
        status, out, err = run("archive")
        assert status == ExitStatus.OK, out + err
    return data, mount, run


def _export_versions(client, bucket: str) -> dict[tuple[str, bool], str]:
    """``(key, delete marker?) -> version id`` of every version and delete marker of the
    catalog exports in ``bucket`` (store prefix ``zbak``)."""
    page = client.list_object_versions(Bucket=bucket, Prefix="zbak/_zbak/catalog/")
    return {**{(v["Key"], False): v["VersionId"] for v in page.get("Versions", [])},
            **{(v["Key"], True): v["VersionId"] for v in page.get("DeleteMarkers", [])}}


def _mark_path(tmp: Path, single: str) -> Path:
    """This machine's high-water mark of export ``single`` in store ``cold``."""
    return mark_file(tmp / "state", "cold", single)


def _chains(catalog: Path) -> list[tuple[int, str]]:
    """``(id, object prefix)`` of every catalogued stream, oldest first."""
    engine = make_engine(f"sqlite:///{catalog}")
    try:
        s = stream_table.c
        with engine.connect() as connection:
            return [(r[0], r[1]) for r in connection.execute(
                sa.select(s.id, s.object_prefix).order_by(s.id))]
    finally:
        engine.dispose()


def _verify(catalog: Path, stream_id: int) -> None:
    """Mark a stream verified now (what ``zbak audit --deep`` records)."""
    engine = make_engine(f"sqlite:///{catalog}")
    try:
        with engine.begin() as connection:
            connection.execute(sa.update(stream_table).where(stream_table.c.id == stream_id)
                               .values(state="verified", verified_at=dt.datetime.now(dt.UTC)))
    finally:
        engine.dispose()


def _set_retain_until(catalog: Path, until: dict[str, dt.datetime]) -> None:
    engine = make_engine(f"sqlite:///{catalog}")
    try:
        with engine.begin() as connection:
            for version_id, date in until.items():
                connection.execute(sa.update(volume_table)
                                   .where(volume_table.c.version_id == version_id)
                                   .values(retain_until=date))
    finally:
        engine.dispose()


def _manifest_versions(catalog: Path) -> list[tuple]:
    """``(object prefix, manifest version id, copy version id, retain_until)`` of every
    catalogued stream."""
    engine = make_engine(f"sqlite:///{catalog}")
    try:
        s = stream_table.c
        with engine.connect() as connection:
            return [tuple(r) for r in connection.execute(
                sa.select(s.object_prefix, s.manifest_version_id, s.manifest_copy_version_id,
                          s.manifest_retain_until).order_by(s.id))]
    finally:
        engine.dispose()


def _set_manifest_retain_until(catalog: Path, until: dt.datetime) -> None:
    engine = make_engine(f"sqlite:///{catalog}")
    try:
        with engine.begin() as connection:
            connection.execute(sa.update(stream_table).values(manifest_retain_until=until))
    finally:
        engine.dispose()


def _two_streams(zpool, tmp: Path, s3_server, bucket: str, capsys) -> tuple[str, Path, Zbak]:
    """Dataset ``data`` (3 MiB at @1, 1 MiB more at @2) archived to a lock store in
    ``bucket`` in 1 MiB volumes: a full of four volumes and an incremental. Returns the
    dataset, its mountpoint and the CLI runner."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    (mount / "a").write_bytes(os.urandom(3 * MiB))
    zfs("snapshot", f"{data}@1")
    (mount / "b").write_bytes(os.urandom(1 * MiB))
    zfs("snapshot", f"{data}@2")
    run = _archiving(tmp, s3_server, bucket, data, capsys, "1MiB", True)
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    return data, mount, run


def _lock_bucket(s3_server):
    """A new bucket with Object Lock, and a client holding the master's keys."""
    bucket = f"zbak-lock-{uuid.uuid4().hex[:12]}"
    client = s3_server.client()
    client.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    return bucket, client


def _archiving(tmp: Path, s3_server, bucket: str, data: str, capsys, volume_size: str,
               locked: bool, archive: str = "") -> Zbak:
    """``zbak init`` of job ``data`` archiving ``data`` to store ``cold`` in ``bucket``
    (with ``object_lock`` when ``locked``; ``archive``: more of its ``[archive]`` section);
    the CLI runner."""
    return initialised(tmp, f"""
        [stores.cold]
        url = "s3://{bucket}/zbak"
        endpoint = "{s3_server.endpoint_url}"
        region = "{s3_server.region}"
        volume_size = "{volume_size}"
        {LOCK if locked else ""}
        [jobs.data]
        dataset = "{data}"
        [jobs.data.archive]
        store = "cold"
        {archive}
    """, capsys)


def _forget_versions(catalog: Path) -> None:
    engine = make_engine(f"sqlite:///{catalog}")
    try:
        with engine.begin() as connection:
            connection.execute(sa.update(volume_table).values(version_id=None,
                                                              retain_until=None))
    finally:
        engine.dispose()


def _streams(catalog: Path, column: str) -> list[str]:
    engine = make_engine(f"sqlite:///{catalog}")
    try:
        with engine.connect() as connection:
            return [row[0] for row in connection.execute(
                sa.select(stream_table.c[column]).order_by(stream_table.c.id))]
    finally:
        engine.dispose()


def _states(catalog: Path) -> list[str]:
    return _streams(catalog, "state")


def _kinds(catalog: Path) -> list[str]:
    return _streams(catalog, "kind")

