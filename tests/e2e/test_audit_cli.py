"""``zbak audit`` end to end: real zfs-fuse pools, chains archived by ``zbak archive`` into a
file:// store and moto's S3 server, then damaged behind zbak's back."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
import support.cli
from support.cli import prop, zfs

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs


class Zbak(support.cli.Zbak):
    def catalog(self):
        from zrepl_py.catalog.db import make_engine
        from zrepl_py.catalog.repository import Catalog
        from zrepl_py.config.loading import load_config

        return Catalog(make_engine(load_config(self.config).catalog_url))

    def engine(self):
        from zrepl_py.catalog.db import make_engine
        from zrepl_py.config.loading import load_config

        return make_engine(load_config(self.config).catalog_url)


def write_config(path: Path, state: Path, dataset: str, store_toml: str) -> Path:
    path.write_text(textwrap.dedent(f"""
        state_dir = "{state}"
        [stores.cold]
        {store_toml}
        [jobs.data]
        dataset = "{dataset}"
        [jobs.data.archive]
        store = "cold"
    """))
    return path


def snapshot_steps(dataset: str, mount: Path, steps: range) -> None:
    for step in steps:
        (mount / f"file{step}.bin").write_bytes(os.urandom(150_000))
        (mount / "notes.txt").write_text(f"step {step}\n" * (step + 1) * 500)
        zfs("snapshot", f"{dataset}@{step}")


def audit_json(run, *args):
    status, out, err = run("audit", "--json", *args)
    return status, json.loads(out) if out.strip() else None, err


@pytest.fixture
def archived(zpool, tmp_path, capsys):
    """DATA with @0..@4 archived to a file:// store as a full of @0 and an -I incremental
    @0 -> @4 (each one volume), and @5..@6 as a second incremental."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    snapshot_steps(data, mount, range(5))
    store = tmp_path / "store"
    config = write_config(tmp_path / "zbak.toml", tmp_path / "state", data,
                          f'url = "file://{store}"\nvolume_size = "64MiB"')
    run = Zbak(config, capsys)
    assert run("init")[0] == ExitStatus.OK
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    snapshot_steps(data, mount, range(5, 7))
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    return run, data, store, zpool


def streams_of(run, data):
    return run.catalog().streams(dataset=data)


def test_a_freshly_archived_chain_audits_clean_and_deep_marks_every_stream_verified(archived):
    run, data, store, pool = archived
    status, doc, err = audit_json(run)
    assert status == ExitStatus.OK, (doc, err)
    assert doc["findings"] == [] and doc["jobs"][0]["streams"] == 3
    status, doc, err = audit_json(run, "--deep")
    assert status == ExitStatus.OK, (doc, err)
    streams = streams_of(run, data)
    assert sorted(doc["jobs"][0]["verified"]) == sorted(s.id for s in streams)
    assert all(s.state == "verified" and s.verified_at is not None for s in streams)
    runs = [r for r in run.catalog().last_runs("data") if r.action == "audit"]
    assert runs and runs[0].result == "ok"


def test_deleting_an_incremental_volume_behind_zbaks_back_makes_audit_exit_4_naming_it(archived):
    run, data, store, pool = archived
    incremental = next(s for s in streams_of(run, data) if s.kind == "incremental")
    victim = run.catalog().volumes(incremental.id)[0].key
    (store / victim).unlink()
    status, out, err = run("audit")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    assert victim in out and "missing" in out
    status, doc, _ = audit_json(run)
    error = next(f for f in doc["findings"] if f["key"] == victim)
    assert error["severity"] == "error" and error["level"] == "objects"
    assert error["stream"] == incremental.id and error["dataset"] == data
    assert "zbak archive --full" in error["action"]
    runs = [r for r in run.catalog().last_runs("data") if r.action == "audit"]
    assert runs[0].result == "failed" and "error" in runs[0].error


def test_a_flipped_byte_is_found_by_deep_and_the_stream_is_marked_bad(archived):
    """docs/reliability.md#r9-bit-flip-in-an-object."""
    run, data, store, pool = archived
    incremental = next(s for s in streams_of(run, data) if s.kind == "incremental")
    path = store / run.catalog().volumes(incremental.id)[0].key
    body = bytearray(path.read_bytes())
    body[len(body) // 2] ^= 0x10
    path.write_bytes(bytes(body))
    status, doc, err = audit_json(run)  # same size: the object level cannot see it
    assert status == ExitStatus.OK, (doc, err)
    status, doc, err = audit_json(run, "--deep")
    assert status == ExitStatus.AUDIT_FINDINGS
    deep = [f for f in doc["findings"] if f["level"] == "deep"]
    assert [f["stream"] for f in deep] == [incremental.id]
    assert doc["jobs"][0]["bad"] == [incremental.id]
    assert run.catalog().stream(incremental.id).state == "bad"
    # the graph now reports the break and what it cuts off
    status, doc, _ = audit_json(run)
    graph = [f for f in doc["findings"] if f["level"] == "graph"]
    assert graph[0]["stream"] == incremental.id and "it is bad" in graph[0]["problem"]


def test_a_stream_whose_begin_record_carries_another_guid_is_found_by_deep(archived):
    """The first incremental's volume is replaced by the full's, with the catalog and the
    manifest updated to match its bytes: only the stream's own BEGIN record tells."""
    run, data, store, pool = archived
    from zrepl_py.objects.manifest import Manifest

    streams = streams_of(run, data)
    full = next(s for s in streams if s.kind == "full")
    incremental = next(s for s in streams if s.parent_id == full.id)
    catalog = run.catalog()
    source = catalog.volumes(full.id)[0]
    target = catalog.volumes(incremental.id)[0]
    (store / target.key).write_bytes((store / source.key).read_bytes())
    with run.engine().begin() as conn:
        conn.execute(sa.text('UPDATE volumes SET sha256 = :sha, raw_bytes = :raw, stored_bytes ='
                             ' :stored WHERE id = :id'),
                     {"sha": source.sha256, "raw": source.raw_bytes, "stored": source.stored_bytes,
                      "id": target.id})
        conn.execute(sa.text("UPDATE streams SET raw_bytes = :raw, stored_bytes = :stored"
                             " WHERE id = :id"),
                     {"raw": source.raw_bytes, "stored": source.stored_bytes, "id": incremental.id})
    manifest_path = store / incremental.object_prefix / "manifest.json"
    manifest = Manifest.from_json(manifest_path.read_bytes(), "test")
    vol = dataclasses.replace(manifest.volumes[0], raw_bytes=source.raw_bytes,
                              stored_bytes=source.stored_bytes, sha256=source.sha256)
    manifest_path.write_bytes(dataclasses.replace(manifest, volumes=(vol,)).to_json())
    status, doc, err = audit_json(run)
    assert status == ExitStatus.OK, (doc, err)
    status, doc, err = audit_json(run, "--deep")
    assert status == ExitStatus.AUDIT_FINDINGS
    finding, = [f for f in doc["findings"] if f["level"] == "deep"]
    assert finding["stream"] == incremental.id and finding["chain"] == full.id
    assert "BEGIN record starts at guid 0" in finding["problem"]
    assert str(incremental.from_guid) in finding["problem"]
    row = catalog.stream(incremental.id)
    assert row.state == "bad"
    assert "BEGIN record starts at guid 0" in row.bad_reason, row
    assert f"stream {row.object_prefix} (found by zbak audit at " in row.bad_reason, row


def test_a_sampled_deep_audit_reads_the_least_recently_verified_streams_and_resumes(archived):
    run, data, store, pool = archived
    every = {s.id for s in streams_of(run, data)}
    status, doc, err = audit_json(run, "--sample", "34")  # ceil(34% of 3) = 2 streams
    assert status == ExitStatus.OK, (doc, err)
    first = doc["jobs"][0]["verified"]
    assert len(first) == 2
    status, doc, err = audit_json(run, "--sample", "34")
    second = doc["jobs"][0]["verified"]
    # the stream never verified comes first, then the one verified longest ago
    assert second == [(every - set(first)).pop(), first[0]]


def test_receive_into_proves_the_chain_restores_and_leaves_no_scratch_dataset(archived):
    run, data, store, pool = archived
    status, doc, err = audit_json(run, "--receive-into", pool.name)
    assert status == ExitStatus.OK, (doc, err)
    full = next(s for s in streams_of(run, data) if s.kind == "full")
    assert doc["jobs"][0]["received"] == [full.id]
    names = zfs("list", "-H", "-o", "name", "-r", "-t", "all", pool.name).split()
    assert not [n for n in names if "zbak-audit-" in n]


def test_leftover_objects_are_information_only(archived):
    run, data, store, pool = archived
    stray = store / "local" / data / f"{7:020d}-full-{1:016x}"
    stray.mkdir(parents=True)
    (stray / "progress.json").write_text("{}")
    (stray / "vol-000000.zst").write_bytes(b"x")
    status, doc, err = audit_json(run)
    assert status == ExitStatus.OK, (doc, err)
    info, = doc["findings"]
    assert info["severity"] == "info" and "partial upload" in info["problem"]


def test_s3_objects_with_a_class_changed_or_deleted_behind_zbaks_back_are_found(
        zpool, tmp_path, capsys, s3_server, s3_bucket):
    data = f"{zpool.name}/data"
    zfs("create", data)
    snapshot_steps(data, Path(prop(data, "mountpoint")), range(3))
    config = write_config(
        tmp_path / "zbak.toml", tmp_path / "state", data,
        f'url = "s3://{s3_bucket}/zbak"\nendpoint = "{s3_server.endpoint_url}"\n'
        'region = "us-east-1"\nstorage_class = { full = "STANDARD", incremental = "GLACIER" }')
    run = Zbak(config, capsys)
    assert run("init")[0] == ExitStatus.OK
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    status, doc, err = audit_json(run)
    assert status == ExitStatus.OK, (doc, err)
    client = s3_server.client()
    streams = streams_of(run, data)
    full = next(s for s in streams if s.kind == "full")
    incremental = next(s for s in streams if s.kind == "incremental")
    assert incremental.storage_class == "GLACIER"
    full_key = run.catalog().volumes(full.id)[0].key
    client.copy_object(Bucket=s3_bucket, Key=f"zbak/{full_key}", StorageClass="STANDARD_IA",
                       CopySource={"Bucket": s3_bucket, "Key": f"zbak/{full_key}"})
    status, doc, err = audit_json(run)
    assert status == ExitStatus.AUDIT_FINDINGS
    warning, = doc["findings"]
    assert warning["severity"] == "warning" and warning["key"] == full_key
    assert "STANDARD_IA" in warning["problem"]
    incr_key = run.catalog().volumes(incremental.id)[0].key
    client.delete_object(Bucket=s3_bucket, Key=f"zbak/{incr_key}")
    status, doc, err = audit_json(run)
    assert status == ExitStatus.AUDIT_FINDINGS
    assert any(f["key"] == incr_key and f["severity"] == "error" for f in doc["findings"])


def test_deep_audit_of_glacier_streams_requests_a_thaw_and_exits_75_then_verifies(
        zpool, tmp_path, capsys, s3_server, s3_bucket):
    """docs/reliability.md#r17-glacier."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    snapshot_steps(data, Path(prop(data, "mountpoint")), range(2))
    config = write_config(
        tmp_path / "zbak.toml", tmp_path / "state", data,
        f'url = "s3://{s3_bucket}/zbak"\nendpoint = "{s3_server.endpoint_url}"\n'
        'region = "us-east-1"\nstorage_class = { full = "DEEP_ARCHIVE", incremental = "GLACIER" }')
    run = Zbak(config, capsys)
    assert run("init")[0] == ExitStatus.OK
    assert run("archive")[0] == ExitStatus.OK
    status, doc, err = audit_json(run, "--deep")
    assert status == ExitStatus.THAW_PENDING, (doc, err)
    assert doc["jobs"][0]["thawing"] == 2 and doc["jobs"][0]["verified"] == []
    catalog = run.catalog()
    ids = [s.id for s in streams_of(run, data)]
    assert set(catalog.thaws(ids)) == set(ids)
    status, doc, err = audit_json(run, "--deep")  # moto finishes a restore at once
    assert status == ExitStatus.OK, (doc, err)
    assert sorted(doc["jobs"][0]["verified"]) == sorted(ids)


def test_the_human_output_names_dataset_stream_object_and_what_to_do(archived):
    run, data, store, pool = archived
    incremental = next(s for s in streams_of(run, data) if s.kind == "incremental")
    victim = run.catalog().volumes(incremental.id)[0].key
    (store / victim).unlink()
    status, out, err = run("audit")
    assert status == ExitStatus.AUDIT_FINDINGS
    for word in ("ERROR [objects]", f"local:{data}", f"stream {incremental.id}",
                 f"object:     {victim}", "what to do: ", "zbak archive --full"):
        assert word in out


def test_a_manifest_that_disagrees_with_the_catalog_or_is_missing_is_found(archived):
    run, data, store, pool = archived
    from zrepl_py.objects.manifest import CarriedSnapshot, Manifest

    first, second = sorted((s for s in streams_of(run, data) if s.kind == "incremental"),
                           key=lambda s: s.to_createtxg)
    path = store / first.object_prefix / "manifest.json"
    manifest = Manifest.from_json(path.read_bytes(), "test")
    path.write_bytes(dataclasses.replace(
        manifest, to_snap=CarriedSnapshot(manifest.to_snap.name, 12345, manifest.to_snap.createtxg)).to_json())
    (store / second.object_prefix / "manifest.json").unlink()
    status, doc, err = audit_json(run)
    assert status == ExitStatus.AUDIT_FINDINGS
    by_stream = {f["stream"]: f for f in doc["findings"]}
    assert by_stream[first.id]["severity"] == "error"
    assert "to guid: manifest 12345" in by_stream[first.id]["problem"]
    assert by_stream[second.id]["severity"] == "warning"
    assert "manifest" in by_stream[second.id]["problem"] and "missing" in by_stream[second.id]["problem"]


def test_a_replica_cursor_whose_snapshot_is_gone_from_the_target_is_an_error(zpool, tmp_path, capsys):
    data = f"{zpool.name}/data"
    zfs("create", data)
    snapshot_steps(data, Path(prop(data, "mountpoint")), range(3))
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [jobs.data]
        dataset = "{data}"
        [jobs.data.replicate]
        targets = ["local:{zpool.name}/bak"]
    """))
    run = Zbak(config, capsys)
    assert run("init")[0] == ExitStatus.OK
    status, out, err = run("replicate")
    assert status == ExitStatus.OK, out + err
    status, doc, err = audit_json(run)
    assert status == ExitStatus.OK, (doc, err)
    target = f"{zpool.name}/bak"
    cursor, = run.catalog().cursors()
    assert cursor.snapshot_name == "2"
    zfs("destroy", f"{cursor.target_location}@2")
    status, doc, err = audit_json(run)
    assert status == ExitStatus.AUDIT_FINDINGS
    error, = doc["findings"]
    assert error["severity"] == "error" and error["target"] == f"local:{target}"
    assert "has no such snapshot" in error["problem"] and "@2" in error["problem"]
