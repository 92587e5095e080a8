"""``zbak drill`` end to end (docs/drills.md): real zfs-fuse pools, a ``file://`` store, moto's S3
server over HTTP with a GLACIER chain, and a local replica; driven through the CLI.

A drill restores the newest snapshot each source can restore into a scratch dataset, checks
its guid and every file against the source, destroys the scratch and records the source's
result, recovery time and bytes; a failed drill alerts and exits 1. The replica over the real
sshd (through ``zbak serve``) and a damaged replica are in ``test_drill_replica_cli.py``.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import exists, file_archive_config, initialised, write_synced, zbak_argv, zfs
from support.receiver import Receiver

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs
MIB = 1024 * 1024


def fill(mount: Path, step: int, size: int) -> None:
    """A new file, a rewritten one, a link, a directory: what a restore must bring back."""
    write_synced(mount / f"file{step}.bin", os.urandom(size))
    write_synced(mount / "notes" / "log.txt", f"step {step}\n".encode() * 2000)
    if not (mount / "latest").is_symlink():
        os.symlink(f"file{step}.bin", mount / "latest")
    os.chmod(mount / "notes" / "log.txt", 0o600 + step % 2 * 0o40)


def scratch_children(parent: str) -> list[str]:
    """Datasets below the scratch parent (its own name left out)."""
    out = zfs("list", "-H", "-o", "name", "-r", parent)
    return [n for n in out.split() if n != parent]


def drills(run) -> dict[str, dict]:
    """``zbak status --json``'s last drill per source of job ``data``."""
    status, out, err = run("status", "--json", "--offline")
    assert status == ExitStatus.OK, out + err
    (job,) = json.loads(out)
    return {d["source"]: d for d in job["drills"]}


@pytest.fixture
def site(make_pool, tmp_path, capsys, monkeypatch):
    """Pool SRC with dataset ``data`` (@0..@2, 6 MiB of files), pool BAK with ``scratch`` and
    a local replica, a ``file://`` store, a webhook receiver for alerts; archived and
    replicated."""
    src, bak = make_pool(), make_pool()
    data, replica, scratch = f"{src.name}/data", f"{bak.name}/replica", f"{bak.name}/scratch"
    zfs("create", data)
    zfs("create", scratch)
    receiver = Receiver("/alerts")
    monkeypatch.setenv("ZBAK_TEST_ALERTS_AT", receiver.url)
    mount = src.mountpoint / "data"
    for step in range(3):
        fill(mount, step, 2 * MIB)
        zfs("snapshot", f"{data}@{step}")
    config, store = file_archive_config(tmp_path, data, volume_size="1MiB", extra=f"""
        [restore]
        scratch = "{scratch}"
        [jobs.data.replicate]
        targets = ["local:{replica}"]
        [jobs.data.drill]
        [alerts.webhook]
        url = {{ env = "ZBAK_TEST_ALERTS_AT" }}
    """)
    run = initialised(tmp_path, config.read_text().split("\n", 1)[1], capsys)
    for action in ("archive", "replicate"):
        status, out, err = run(action)
        assert status == ExitStatus.OK, out + err

    class Site:
        pass

    site = Site()
    site.run, site.data, site.replica, site.scratch = run, data, replica, scratch
    site.store, site.config, site.receiver, site.mount = store, tmp_path / "zbak.toml", receiver, mount
    yield site
    receiver.close()


def test_a_drill_restores_each_source_checks_every_file_and_records_the_recovery_time(site):
    status, out, err = site.run("drill", "--json")
    assert status == ExitStatus.OK, out + err
    rows = {r["source"]: r for r in json.loads(out)["drills"]}
    assert sorted(rows) == ["cold", f"local:{site.replica}"]
    for row in rows.values():
        assert (row["result"], row["snapshot"], row["datasets"]) == ("ok", "2", 1), row
        assert row["files"] == 4  # file0..2.bin and notes/log.txt, each compared
        assert row["seconds"] > 0 and row["bytes"] >= 6 * MIB
        (item,) = row["datasets_restored"]
        assert item["into"].startswith(f"{site.scratch}/zbak-drill-") and item["into"].endswith("/d0")
    assert scratch_children(site.scratch) == [], "every scratch was destroyed"
    assert not [n for n in zfs("list", "-H", "-o", "name").split() if "zbak-view-" in n]

    recorded = drills(site.run)
    assert {s: d["result"] for s, d in recorded.items()} == {"cold": "ok",
                                                               f"local:{site.replica}": "ok"}
    status, out, _ = site.run("status")
    assert "drills" in out and "never" not in out.split("drills", 1)[1]
    status, out, _ = site.run("status", "--check")
    assert status == 0, out
    assert site.receiver.posts == [], "a good drill raises no alert"


def test_a_tampered_volume_fails_the_store_drill_alerts_and_records_it_and_the_replica_still_passes(
        site):
    """A byte of an archived volume changed in the store: the restore's verification refuses
    it before anything is received (nothing restored), the drill of that store fails, exit 1,
    a failure alert names the volume, ``status`` and ``--check`` show it; the replica's drill
    is unaffected."""
    volume = sorted(site.store.rglob("vol-000001.zst"))[0]
    good = volume.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0x01
    volume.write_bytes(bytes(data))

    status, out, err = site.run("drill", "--json")
    assert status == ExitStatus.FAILED, out + err
    rows = {r["source"]: r for r in json.loads(out)["drills"]}
    assert rows[f"local:{site.replica}"]["result"] == "ok"
    cold = rows["cold"]
    assert cold["result"] == "failed" and "SHA-256 or size differs" in cold["detail"]
    assert volume.name in cold["detail"] and cold["seconds"] is None
    assert scratch_children(site.scratch) == []

    (alert,) = [b for _, _, b in site.receiver.posts if b["kind"] == "failure"]
    assert (alert["action"], alert["target"]) == ("drill", "cold")
    assert "SHA-256 or size differs" in alert["message"]
    assert drills(site.run)["cold"]["result"] == "failed"
    status, out, _ = site.run("status", "--check")
    assert status == 2 and "drill of job data (cold) failed" in out

    volume.write_bytes(good)
    status, out, err = site.run("drill", "--from", "cold")
    assert status == ExitStatus.OK, out + err
    assert [b["kind"] for _, _, b in site.receiver.posts] == ["failure", "recovery"]


def killed_when(config: Path, seen: Callable[[], str | None]) -> tuple[int, str]:
    """Start ``zbak drill --from cold`` and SIGKILL it (its process group) as soon as
    ``seen()`` names something; return the killed pid and what was seen."""
    process = subprocess.Popen(zbak_argv("--config", str(config), "drill", "--from", "cold"),
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline and process.poll() is None, "the drill got going"
        found = seen()
        if found is not None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            locks_released(config.parent / "state" / "locks")
            return process.pid, found
        time.sleep(0.05)


def locks_released(locks: Path) -> None:
    """Wait until no process holds a lock file under ``locks`` (the next drill would exit 3):
    a child of the killed drill outside its process group may hold one for a moment."""
    deadline = time.monotonic() + 60
    for path in locks.glob("*.lock"):
        with path.open("rb") as held:
            while True:
                try:
                    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    assert time.monotonic() < deadline, f"{path} still held: {path.read_text()}"
                    time.sleep(0.05)
                else:
                    fcntl.flock(held, fcntl.LOCK_UN)
                    break


def views(pool: str) -> list[str]:
    """The temporary view clones (``POOL/zbak-view-<hex>``) in ``pool``."""
    return [n for n in zfs("list", "-H", "-o", "name", "-r", pool).split() if "/zbak-view-" in n]


def test_a_drill_killed_mid_restore_or_mid_comparison_leaves_a_scratch_the_next_drill_destroys(
        site):
    """SIGKILL while the store's copy is received: its scratch stays; the next drill destroys
    it (its mark names this host and a dead process), leaves another host's scratch and an
    unmarked one alone, and drills as usual. SIGKILL while the copy's files are read: the
    view clone of the scratch's snapshot stays too; the next drill removes it, then the
    scratch. SIGKILL while the source's files are read: the next drill removes that view."""
    for step in range(3, 6):  # 48 MiB more, so the restore and the reading take seconds
        fill(site.mount, step, 16 * MIB)
        zfs("snapshot", f"{site.data}@{step}")
    status, out, err = site.run("archive")
    assert status == ExitStatus.OK, out + err
    other = f"{site.scratch}/zbak-drill-0123abcd"
    zfs("create", "-o", "zbak:drill=elsewhere:4242:77", other)
    unmarked = f"{site.scratch}/zbak-drill-feedbeef"
    zfs("create", unmarked)

    def receiving() -> str | None:
        found = [n.rsplit("/", 1)[0] for n in scratch_children(site.scratch)
                 if n.endswith("/d0")]
        return found[0] if found else None

    pid, killed = killed_when(site.config, receiving)
    mark = zfs("get", "-H", "-o", "value", "zbak:drill", killed).strip()
    assert mark.startswith(f"{socket.gethostname()}:{pid}:")

    status, out, err = site.run("drill", "--from", "cold")
    assert status == ExitStatus.OK, out + err
    assert f"destroyed {killed}: the scratch of a drill that was killed" in out
    assert not exists(killed)
    assert exists(other) and exists(unmarked)
    assert f"left {other} (made by elsewhere:4242:77" in out
    assert f"left {unmarked} (no zbak:drill mark" in out
    assert drills(site.run)["cold"]["snapshot"] == "5"

    pool = site.scratch.split("/")[0]
    _, view = killed_when(site.config, lambda: (views(pool) or [None])[0])
    assert exists(view), "a killed drill leaves its view"
    (reading,) = [n for n in scratch_children(site.scratch) if n not in (other, unmarked)
                  and "/d0" not in n]
    status, out, err = site.run("drill", "--from", "cold")
    assert status == ExitStatus.OK, out + err
    assert f"destroyed {reading}: the scratch of a drill that was killed" in out
    assert views(pool) == [] and not exists(view)

    source_pool = site.data.split("/")[0]
    _, view = killed_when(site.config, lambda: (views(source_pool) or [None])[0])
    assert exists(view), "a killed drill leaves its view"
    status, out, err = site.run("drill", "--from", "cold")
    assert status == ExitStatus.OK, out + err
    assert views(source_pool) == [], "the source's view is removed before it is read again"


def test_a_glacier_chain_is_skipped_with_its_thaw_cost_and_with_thaw_drilled_after_the_thaw(
        zpool, tmp_path, capsys, s3_server, s3_bucket):
    """docs/reliability.md#r17-glacier. A chain in GLACIER on moto's S3: without
    ``thaw`` the drill touches no object and records ``skipped`` with what thawing would take
    and cost; with ``thaw = true`` it requests every frozen volume in one pass and exits 75
    (pending, no alert), and the next drill restores and compares."""
    data, scratch = f"{zpool.name}/data", f"{zpool.name}/scratch"
    zfs("create", data)
    zfs("create", scratch)
    mount = zpool.mountpoint / "data"
    for step in range(3):
        fill(mount, step, 1 * MIB)
        zfs("snapshot", f"{data}@{step}")
    store = (f'url = "s3://{s3_bucket}/zbak"\nendpoint = "{s3_server.endpoint_url}"\n'
             'region = "us-east-1"\nvolume_size = "1MiB"\n'
             'storage_class = { full = "GLACIER", incremental = "GLACIER" }')

    def configure(thaw: str):
        return initialised(tmp_path, f"""
            [restore]
            scratch = "{scratch}"
            thaw_tier = "Bulk"
            [stores.cold]
            {store}
            [jobs.data]
            dataset = "{data}"
            [jobs.data.archive]
            store = "cold"
            [jobs.data.drill]
            thaw = {thaw}
        """, capsys)

    run = configure("false")
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    client = s3_server.client()
    volumes = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]
               if "/vol-" in o["Key"]]
    assert len(volumes) >= 4

    status, out, err = run("drill", "--json")
    assert status == ExitStatus.OK, out + err
    (row,) = json.loads(out)["drills"]
    assert row["result"] == "skipped" and row["snapshot"] == "2"
    assert row["thaw"].startswith(f"thaw {len(volumes)} object(s)")
    assert "tier Bulk: about 12 h and $" in row["thaw"]
    assert "set [jobs.data.drill] thaw = true to drill it" in row["detail"]
    assert not any("Restore" in client.head_object(Bucket=s3_bucket, Key=k) for k in volumes), \
        "nothing was asked back"

    run = configure("true")
    status, out, err = run("drill", "--json")
    assert status == ExitStatus.THAW_PENDING, out + err
    (row,) = json.loads(out)["drills"]
    assert row["result"] == "pending" and f"{len(volumes)} volume(s)" in row["detail"]
    assert all("Restore" in client.head_object(Bucket=s3_bucket, Key=k) for k in volumes), \
        "every frozen volume was asked back in one pass"
    assert scratch_children(scratch) == [], "nothing was restored while waiting"

    status, out, err = run("drill", "--json")
    assert status == ExitStatus.OK, out + err
    (row,) = json.loads(out)["drills"]
    assert (row["result"], row["snapshot"], row["files"]) == ("ok", "2", 4)
    assert row["thaw"].startswith(f"thaw {len(volumes)} object(s)")
    assert scratch_children(scratch) == []
