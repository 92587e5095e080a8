"""``zbak archive`` and ``zbak restore`` end to end: real zfs-fuse pools, a file:// store and
moto's S3 server over HTTP. The seed's example: snapshots @0..@9 archived as a full of @0 and
incrementals, restored to the first, a middle and the last snapshot."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from support.cli import (
    Zbak,
    content_of,
    prop,
    rate_limited_zfs,
    restored_content,
    snapshots,
    start_zbak,
    zfs,
)

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs






def write_config(path: Path, state: Path, dataset: str, store_toml: str, extra: str = "") -> Path:
    path.write_text(textwrap.dedent(f"""
        state_dir = "{state}"
        [stores.cold]
        {store_toml}
        [jobs.data]
        dataset = "{dataset}"
        [jobs.data.archive]
        store = "cold"
        {extra}
    """))
    return path


def fill(mount: Path, step: int) -> None:
    """Change the dataset between snapshots: a new file, a rewritten one, a deleted one."""
    (mount / f"file{step}.bin").write_bytes(os.urandom(200_000) + bytes(step) * 300_000)
    (mount / "notes.txt").write_text(f"step {step}\n" * (step + 1) * 1000)
    if step >= 3:
        (mount / f"file{step - 3}.bin").unlink(missing_ok=True)


def snapshot_steps(dataset: str, mount: Path, steps: range) -> None:
    for step in steps:
        fill(mount, step)
        zfs("snapshot", f"{dataset}@{step}")


@pytest.fixture
def seeded(zpool, tmp_path, capsys):
    """Pool dataset DATA with @0..@4, a file:// store, a config and an initialised catalog."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    snapshot_steps(data, mount, range(5))
    store = tmp_path / "store"
    config = write_config(tmp_path / "zbak.toml", tmp_path / "state", data,
                          f'url = "file://{store}"\nvolume_size = "1MiB"')
    run = Zbak(config, capsys)
    status, out, err = run("init")
    assert status == ExitStatus.OK, out + err
    return run, data, mount, store, zpool






def test_a_chain_of_full_and_incrementals_restores_to_the_first_a_middle_and_the_last_snapshot(seeded):
    run, data, mount, store, pool = seeded
    status, out, err = run("archive", "--json")
    assert status == ExitStatus.OK, out + err
    rows = json.loads(out)["rows"]
    assert [r["stream"] for r in rows] == ["full @0", "incremental -I @0 -> @4"]
    snapshot_steps(data, mount, range(5, 10))
    status, out, err = run("archive", "--json")
    assert status == ExitStatus.OK, out + err
    assert [r["stream"] for r in json.loads(out)["rows"]] == ["incremental -I @4 -> @9"]
    status, out, _ = run("archive", "--json")
    assert "up to date" in json.loads(out)["rows"][0]["reason"]

    for target, expect in (("0", ["0"]), ("6", [str(i) for i in range(7)]),
                           ("9", [str(i) for i in range(10)])):
        into = f"{pool.name}/restored{target}"
        status, out, err = run("restore", data, "--to", f"@{target}", "--into", into,
                               "--from", "cold", "--yes")
        assert status == ExitStatus.OK, out + err
        assert snapshots(into) == expect
        assert prop(f"{into}@{target}", "guid") == prop(f"{data}@{target}", "guid")
        assert restored_content(into) == content_of(f"{data}@{target}", pool.name, target)


def test_the_catalog_and_the_manifests_agree_on_every_stream_and_volume(seeded):
    run, data, mount, store, pool = seeded
    assert run("archive")[0] == ExitStatus.OK
    status, out, _ = run("list", "streams", "--json")
    assert status == ExitStatus.OK
    manifests = sorted(store.rglob("manifest.json"))
    assert len(manifests) == 2
    from zrepl_py.catalog.db import make_engine
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.config.loading import load_config
    from zrepl_py.objects.manifest import Manifest
    catalog = Catalog(make_engine(load_config(run.config).catalog_url))
    streams = {s.object_prefix: s for s in catalog.streams(dataset=data)}
    for path in manifests:
        m = Manifest.from_json(path.read_bytes(), str(path))
        prefix = str(path.parent.relative_to(store)) + "/"
        row = streams[prefix]
        assert (row.kind, row.to_guid, row.to_name, row.raw_bytes, row.stored_bytes) == \
            (m.kind, m.to_snap.guid, m.to_snap.name, m.raw_bytes, m.stored_bytes)
        vols = catalog.volumes(row.id)
        assert [(v.key, v.sha256, v.stored_bytes) for v in vols] == \
            [(v.key, v.sha256, v.stored_bytes) for v in m.volumes]
        assert {c.guid for c in catalog.carried([row.id])[row.id]} == {s.guid for s in m.snapshots}
        assert not (path.parent / "progress.json").exists()
        for v in m.volumes:
            assert hashlib.sha256((store / v.key).read_bytes()).hexdigest() == v.sha256


@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped"])
def test_restore_refuses_a_missing_truncated_or_altered_volume_and_receives_nothing(seeded, damage):
    """docs/reliability.md#r8-truncated-stream-object,
    docs/reliability.md#r9-bit-flip-in-an-object."""
    run, data, mount, store, pool = seeded
    assert run("archive")[0] == ExitStatus.OK
    volumes = sorted(store.rglob("vol-*.zst"))
    victim = volumes[-1]  # in the last stream: earlier streams must not be received either
    body = victim.read_bytes()
    if damage == "missing":
        victim.unlink()
    elif damage == "truncated":
        victim.write_bytes(body[:-100])
    else:
        flipped = bytearray(body)
        flipped[len(body) // 2] ^= 0x01
        victim.write_bytes(bytes(flipped))
    into = f"{pool.name}/restored"
    status, out, err = run("restore", data, "--to", "@4", "--into", into, "--from", "cold", "--yes")
    assert status == ExitStatus.FAILED
    assert victim.name in err and "nothing was received" in err
    assert subprocess.run(["zfs", "list", into], capture_output=True).returncode != 0


def test_restore_prints_the_plan_and_refuses_an_existing_dataset(seeded):
    run, data, mount, store, pool = seeded
    assert run("archive")[0] == ExitStatus.OK
    status, out, err = run("restore", data, "--to", "@2", "--dry-run")
    assert status == ExitStatus.FAILED and "exists" in err and "never overwrites" in err
    status, out, err = run("restore", data, "--to", "@2", "--into", f"{pool.name}/new", "--dry-run")
    assert status == ExitStatus.OK, out + err
    assert "local" in out and "cold" in out and "full @0" in out
    status, out, err = run("restore", data, "--to", "@nope", "--into", f"{pool.name}/x", "--dry-run")
    assert status == ExitStatus.FAILED and "no snapshot @nope" in err


def test_an_archive_killed_mid_upload_resumes_without_re_uploading_stored_volumes(seeded, tmp_path):
    run, data, mount, store, pool = seeded
    # One big full: 12 MiB in 1 MiB volumes, its zfs send through pv at 2 MiB/s (6 s or
    # more on any host), so the kill after the third volume lands mid-stream.
    (mount / "big.bin").write_bytes(os.urandom(12 * 1024 * 1024))
    zfs("snapshot", f"{data}@big")
    zfs("destroy", f"{data}@0")
    for step in range(1, 5):
        zfs("destroy", f"{data}@{step}")
    slow = rate_limited_zfs(tmp_path / "slow-zfs", 2 * 1024 * 1024)
    proc = start_zbak("--config", str(run.config), "archive",
                      env={**slow, "ZBAK_LOG_LEVEL": "WARNING"})
    deadline = time.monotonic() + 120
    progress = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(store.rglob("progress.json"))
        if found and len(json.loads(found[0].read_bytes())["volumes"]) >= 3:
            progress = found[0]
            break
        time.sleep(0.02)
    assert progress is not None, "the archive finished before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert (tmp_path / "slow-zfs" / "sends.log").read_text(), "zfs send was not rate-limited"
    assert not list(store.rglob("manifest.json"))
    before = {p: p.stat().st_mtime_ns for p in progress.parent.glob("vol-*.zst")}
    status, out, err = run("archive", "--json")
    assert status == ExitStatus.OK, out + err
    row = json.loads(out)["rows"][0]
    assert "resumed" in row["volumes"]
    resumed = int(row["volumes"].split(", ")[1].split()[0])
    assert resumed >= 3
    unchanged = [p for p, t in before.items() if p.stat().st_mtime_ns == t]
    assert len(unchanged) >= resumed
    into = f"{pool.name}/back"
    status, out, err = run("restore", data, "--to", "@big", "--into", into, "--from", "cold", "--yes")
    assert status == ExitStatus.OK, out + err
    assert restored_content(into)["big.bin"] == hashlib.sha256((mount / "big.bin").read_bytes()).hexdigest()


def test_glacier_chains_in_s3_are_thawed_in_one_batch_then_restored(zpool, tmp_path, capsys, s3_server, s3_bucket):
    """docs/reliability.md#r17-glacier."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    snapshot_steps(data, mount, range(3))
    config = write_config(
        tmp_path / "zbak.toml", tmp_path / "state", data,
        f'url = "s3://{s3_bucket}/zbak"\nendpoint = "{s3_server.endpoint_url}"\n'
        f'region = "us-east-1"\nvolume_size = "1MiB"\n'
        'storage_class = { full = "DEEP_ARCHIVE", incremental = "GLACIER" }')
    run = Zbak(config, capsys)
    assert run("init")[0] == ExitStatus.OK
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    client = s3_server.client()
    objects = client.list_objects_v2(Bucket=s3_bucket)["Contents"]
    classes = {o["Key"].rsplit("/", 1)[-1].split("-")[0]: set() for o in objects}
    for o in objects:
        classes[o["Key"].rsplit("/", 1)[-1].split("-")[0]].add(o.get("StorageClass", "STANDARD"))
    assert classes["manifest.json"] == {"STANDARD"}
    assert classes["vol"] == {"DEEP_ARCHIVE", "GLACIER"}
    into = f"{zpool.name}/thawed"
    status, out, err = run("restore", data, "--to", "@2", "--into", into, "--from", "cold",
                           "--dry-run")
    assert status == ExitStatus.OK and "thaw 3 object(s)" in out and "$" in out
    status, out, err = run("restore", data, "--to", "@2", "--into", into, "--from", "cold", "--yes")
    assert status == ExitStatus.THAW_PENDING, out + err
    assert "run the same restore again" in err
    status, out, err = run("restore", data, "--to", "@2", "--into", into, "--from", "cold", "--yes")
    assert status == ExitStatus.OK, out + err
    assert snapshots(into) == ["0", "1", "2"]
    assert restored_content(into) == content_of(f"{data}@2", zpool.name, "s3")
