"""Disasters a restore must survive (docs/decisions.md#restore-needs-nothing-of-the-original-pool):
the source pool destroyed, then the dataset brought back from a ``file://`` store, from S3 GLACIER
/ DEEP_ARCHIVE (thaw first) and from a replica pool, into another pool; the pool and the whole
state dir lost, the catalog rebuilt from the store; and two stores holding the same snapshot, where
the cheaper one is chosen and the plan says why. A restore needs only the catalog, the source it
reads and the ``--into`` parent: nothing of the original pool.

Streams are a few MiB: what is tested here is which source is used and that the bytes come
back, not how large streams move.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from disaster.conftest import MIB, Site, content_of, new_site, restored_content, snapshots
from support.cli import (
    exists,
    file_archive_config,
    prop,
    run_zbak,
    settled_snapshots,
    start_zbak,
    zfs,
)
from support.common import hosts_table

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs


def destroy_pool(site: Site) -> None:
    """The disaster: ``zpool destroy -f`` of the source pool (the test's own pool), retried
    while zfs-fuse still calls it busy (a clone just destroyed by ``content_of``)."""
    deadline = time.monotonic() + 20
    while True:
        done = subprocess.run(["zpool", "destroy", "-f", site.pool], capture_output=True,
                              text=True, timeout=60)
        if done.returncode == 0:
            break
        assert time.monotonic() < deadline, f"zpool destroy {site.pool}: {done.stderr}"
        time.sleep(0.3)
    assert subprocess.run(["zpool", "list", site.pool], capture_output=True).returncode != 0


def archived_site(site: Site, store_toml: str, steps: int = 4) -> dict[str, str]:
    """Snapshots @0..@steps-1 (2 MiB each), archived to store ``cold``; return @last's
    file digests, read before any disaster."""
    site.snapshot_steps(range(steps), 2 * MIB)
    site.write(f"""
        [stores.cold]
        {store_toml}
        [jobs.data]
        dataset = "{site.data}"
        [jobs.data.archive]
        store = "cold"
    """)
    site.ok("init")
    site.ok("archive")
    return content_of(f"{site.data}@{steps - 1}", site.pool, "before")


def plan_json(site: Site, *args: str) -> dict:
    return json.loads(site.ok("restore", site.data, *args, "--dry-run", "--json"))


def chosen(plan: dict) -> dict:
    (row,) = [r for r in plan["options"] if r["chosen"]]
    return row


def test_the_source_pool_destroyed_the_dataset_comes_back_from_a_file_store(site, make_pool):
    before = archived_site(site, f'url = "file://{site.tmp / "store"}"\nvolume_size = "1MiB"')
    middle = content_of(f"{site.data}@1", site.pool, "middle")
    destroy_pool(site)
    other = make_pool("256M")
    into = f"{other.name}/data"

    plan = plan_json(site, "--to", "@3", "--into", into)
    assert chosen(plan)["from"] == "cold" and "cheapest store: cold" in plan["reason"]
    local = next(r for r in plan["options"] if r["source"] == "local")
    assert "not available" in local["problem"] and site.pool in local["problem"]
    out = site.ok("restore", site.data, "--to", "@3", "--into", into, "--dry-run")
    assert "cheapest store: cold" in out and "not available" in out

    out = site.ok("restore", site.data, "--to", "@3", "--into", into, "--yes")
    assert f"{into} is not mounted (received with zfs receive -u)" in out
    assert f"zfs mount {into}" in out
    assert snapshots(into) == ["0", "1", "2", "3"]
    assert restored_content(into) == before

    # A snapshot inside the last -I stream: received, then the later ones trimmed.
    site.ok("restore", site.data, "--to", "@1", "--into", f"{other.name}/middle", "--yes")
    assert snapshots(f"{other.name}/middle") == ["0", "1"]
    assert restored_content(f"{other.name}/middle") == middle

    # Without --into the destination is the lost pool: refused, naming it.
    status, out, err = site.run("restore", site.data, "--to", "@3", "--dry-run")
    assert status == ExitStatus.FAILED and f"the pool {site.pool} of local:{site.data}" in err
    status, out, err = site.run("restore", site.data, "--to", "@9", "--into", f"{other.name}/x",
                                "--dry-run")
    assert status == ExitStatus.FAILED, out + err
    assert "the newest snapshot that can be restored is @3 (from cold)" in err


@pytest.mark.parametrize("cold_class", ["GLACIER", "DEEP_ARCHIVE"])
def test_the_source_pool_destroyed_the_dataset_is_thawed_from_s3_then_restored(
        site, make_pool, s3_server, s3_bucket, cold_class):
    before = archived_site(site, (
        f'url = "s3://{s3_bucket}/zbak"\nendpoint = "{s3_server.endpoint_url}"\n'
        f'region = "us-east-1"\nvolume_size = "1MiB"\n'
        f'storage_class = {{ full = "{cold_class}", incremental = "{cold_class}" }}'), steps=3)
    destroy_pool(site)
    other = make_pool("256M")
    into = f"{other.name}/data"

    plan = plan_json(site, "--to", "@2", "--into", into)
    assert chosen(plan)["from"] == "cold" and plan["thaw"]["objects"] > 0
    assert "thaw" in plan["reason"]
    status, out, err = site.run("restore", site.data, "--to", "@2", "--into", into, "--yes")
    assert status == ExitStatus.THAW_PENDING, out + err
    assert "run the same restore again" in err
    out = site.ok("restore", site.data, "--to", "@2", "--into", into, "--yes")
    assert snapshots(into) == ["0", "1", "2"]
    assert restored_content(into) == before


def test_the_source_pool_destroyed_the_dataset_comes_back_from_its_replica_before_the_archive(
        site, make_pool):
    bak = make_pool("256M")
    site.snapshot_steps(range(3), 2 * MIB)
    site.write(f"""
        [stores.cold]
        url = "file://{site.tmp / 'store'}"
        [jobs.data]
        dataset = "{site.data}"
        [jobs.data.replicate]
        targets = ["local:{bak.name}/replica"]
        [jobs.data.archive]
        store = "cold"
    """)
    site.ok("init")
    site.ok("replicate")
    site.ok("archive")
    before = content_of(f"{site.data}@2", site.pool, "before")
    destroy_pool(site)
    into = f"{bak.name}/restored"

    plan = plan_json(site, "--to", "@2", "--into", into)
    assert chosen(plan)["from"] == f"local:{bak.name}/replica"
    assert f"the replica local:{bak.name}/replica has @2" in plan["reason"]
    assert "the local dataset cannot be used" in plan["reason"]
    assert [r["source"] for r in plan["options"]][:2] == ["replica", "archive"]

    site.ok("restore", site.data, "--to", "@2", "--into", into, "--yes")
    assert snapshots(into) == ["0", "1", "2"]
    assert prop(f"{into}@2", "guid") == prop(f"{bak.name}/replica@2", "guid")
    assert restored_content(into) == before


def test_of_two_stores_holding_the_snapshot_the_one_with_fewer_bytes_is_used_and_the_plan_says_why(
        site, make_pool):
    # Store "long": a full of @0 and -I @0 -> @5 carry every file ever written (6 x 1 MiB).
    # Store "short": a full of @5 alone carries the files @5 still has (3 MiB: change()
    # deletes the file of step - 3).
    site.snapshot_steps(range(6), 1 * MIB)
    config = """
        [stores.long]
        url = "file://{tmp}/long"
        [stores.short]
        url = "file://{tmp}/short"
        [jobs.data]
        dataset = "{data}"
        [jobs.data.archive]
        store = "{store}"
    """
    site.write(config.format(tmp=site.tmp, data=site.data, store="long"))
    site.ok("init")
    site.ok("archive")
    for step in range(5):
        subprocess.run(["zfs", "destroy", f"{site.data}@{step}"], check=True)
    site.write(config.format(tmp=site.tmp, data=site.data, store="short"))
    site.ok("archive")
    before = content_of(f"{site.data}@5", site.pool, "before")
    other = make_pool("256M")
    into = f"{other.name}/data"

    plan = plan_json(site, "--to", "@5", "--into", into)
    assert chosen(plan)["source"] == "local"  # the snapshot itself: no store is read
    destroy_pool(site)

    plan = plan_json(site, "--to", "@5", "--into", into)
    stores = {r["from"]: r for r in plan["options"] if r["source"] == "archive"}
    assert stores["short"]["chosen"] and not stores["long"]["chosen"]
    assert stores["short"]["bytes"] < stores["long"]["bytes"]
    assert plan["reason"].startswith("cheapest store: short (no thaw, ")
    assert "over long (no thaw, " in plan["reason"]
    out = site.ok("restore", site.data, "--to", "@5", "--into", into, "--yes")
    assert "1 stream(s)" in out
    assert snapshots(into) == ["5"]
    assert restored_content(into) == before


def test_the_source_pool_and_the_state_dir_lost_the_catalog_is_rebuilt_from_the_store_then_restored(
        site, make_pool):
    """The whole machine lost (pool, catalog, state dir): a new catalog rebuilt from the
    store's manifests is all a restore needs."""
    before = archived_site(site, f'url = "file://{site.tmp / "store"}"\nvolume_size = "1MiB"')
    destroy_pool(site)
    shutil.rmtree(site.tmp / "state")
    other = make_pool("256M")
    into = f"{other.name}/data"
    status, out, err = site.run("restore", site.data, "--to", "@3", "--into", into, "--dry-run")
    assert status == ExitStatus.FAILED and "zbak init" in err  # no catalog: nothing is guessed

    site.ok("init", "--no-checks")
    site.ok("catalog", "rebuild", "cold")
    plan = plan_json(site, "--to", "@3", "--into", into)
    assert chosen(plan)["from"] == "cold"
    site.ok("restore", site.data, "--to", "@3", "--into", into, "--yes")
    assert snapshots(into) == ["0", "1", "2", "3"]
    assert restored_content(into) == before


def test_the_source_host_unreachable_and_its_pool_destroyed_a_pull_job_restores_onto_this_machine(
        site, make_pool, sshd):
    """A pull job (the source is ``master:POOL/data`` over ssh): the master's pool is
    destroyed and the master no longer answers; the archive brings the dataset back onto
    this machine with ``--into local:POOL/NAME``."""
    site.snapshot_steps(range(3), 2 * MIB)
    config = """
        {hosts}
        [stores.cold]
        url = "file://{tmp}/store"
        [jobs.data]
        dataset = "master:{data}"
        [jobs.data.archive]
        store = "cold"
    """
    host = sshd.host_config()
    site.write(config.format(hosts=hosts_table("master", host, connect_timeout=3),
                             tmp=site.tmp, data=site.data))
    site.ok("init")
    site.ok("archive")
    before = content_of(f"{site.data}@2", site.pool, "before")
    destroy_pool(site)
    # The master is gone: nothing listens on its port any more.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    gone = sshd.host_config(port=dead_port)
    site.write(config.format(hosts=hosts_table("master", gone, connect_timeout=3),
                             tmp=site.tmp, data=site.data))
    other = make_pool("256M")
    into = f"local:{other.name}/data"

    plan = plan_json(site, "--to", "@2", "--into", into)
    assert chosen(plan)["from"] == "cold"
    local = next(r for r in plan["options"] if r["source"] == "local")
    assert local["problem"].startswith(f"not available: cannot list master:{site.data}")
    status, out, err = site.run("restore", f"master:{site.data}", "--to", "@2", "--dry-run")
    assert status == ExitStatus.FAILED and "restore --into a dataset of a pool that exists" in err

    site.ok("restore", f"master:{site.data}", "--to", "@2", "--into", into, "--yes")
    assert snapshots(f"{other.name}/data") == ["0", "1", "2"]
    assert restored_content(f"{other.name}/data") == before


_MAXRSS = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]);"
           " print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)")
"""Run a command as this fresh interpreter's only child; print its peak RSS (KiB)."""


def test_a_dataset_of_zeros_is_restored_in_bounded_memory(make_pool, tmp_path, capsys):
    """A zero-filled image on a dataset without compression (a VM disk, a preallocated
    file) is sent as data and stored as RLE blocks: 384 MiB of zeros are a few KiB in one
    volume, and the restore decoded the whole volume in one piece (and held it twice). The
    restore, run as the command an admin types, now peaks well under the stream's size."""
    site = new_site(make_pool, tmp_path, capsys, "2G")
    zfs("set", "compression=off", site.data)
    with open(site.mount / "disk.img", "wb") as image:
        for _ in range(384):
            image.write(bytes(MIB))
    (site.mount / "notes.txt").write_text("not only zeros\n")
    zfs("snapshot", f"{site.data}@0")
    before = content_of(f"{site.data}@0", site.pool, "before")
    file_archive_config(site.tmp, site.data)
    site.ok("init")
    site.ok("archive")
    (stream,) = json.loads(site.ok("list", "streams", "--json"))
    assert stream["stored_bytes"] < 4 * MIB
    done = run_zbak("--config", str(site.config), "restore", site.data, "--to", "@0", "--into",
                    f"{site.pool}/back", "--from", "cold", "--yes",
                    prefix=[sys.executable, "-c", _MAXRSS], timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    peak_kib = int(done.stdout.strip().splitlines()[-1])
    print(f"restore of 384 MiB of zeros peaked at {peak_kib // 1024} MiB")
    assert peak_kib < 200 * 1024, f"restore peaked at {peak_kib // 1024} MiB for 384 MiB of zeros"
    assert restored_content(f"{site.pool}/back") == before


def test_a_restore_killed_mid_chain_is_continued_by_the_same_command(make_pool, tmp_path, capsys):
    """A restore of a long chain killed after some streams arrived (the host rebooted, an
    admin's ^C): the same command run again receives only the streams still missing onto
    what arrived, instead of refusing the dataset it left (an admin had to destroy it and
    read the whole chain again). A dataset zbak did not leave that way is still refused."""
    site = new_site(make_pool, tmp_path, capsys, "2G")
    file_archive_config(site.tmp, site.data)
    site.ok("init")
    for step in range(6):
        site.snapshot_steps(range(step, step + 1), 24 * MIB)
        site.ok("archive")
    want = content_of(f"{site.data}@5", site.pool, "want")
    back = f"{site.pool}/back"
    cmd = ("--config", str(site.config), "restore", site.data, "--to", "@5", "--into", back,
           "--from", "cold", "--yes")
    proc = start_zbak(*cmd)
    deadline = time.monotonic() + 120
    while not (exists(back) and "2" in snapshots(back)):
        assert proc.poll() is None and time.monotonic() < deadline, "the restore ended first"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = settled_snapshots(back)
    assert 3 <= len(left) < 6 and prop(back, "zbak:restoring") == f"local:{site.data}"

    done = run_zbak(*cmd, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"holds the first {len(left)} stream(s) from an interrupted restore" in done.stdout
    assert f"into {back}: {6 - len(left)} stream(s), " in done.stdout
    assert restored_content(back) == want
    assert prop(back, "zbak:restoring") == "-", "the mark goes once the restore finished"

    again = run_zbak(*cmd, timeout=600)
    assert again.returncode == ExitStatus.FAILED and "never overwrites" in again.stderr


def test_a_local_restore_killed_in_its_incremental_keeps_the_full(make_pool, tmp_path, capsys):
    """From the dataset's own snapshots a restore is a full of the first and one -I to the
    target: killed during the -I, the rerun sends -I from the newest snapshot the target
    holds (what the full brought, or one zfs-fuse's daemon committed after the kill)."""
    site = new_site(make_pool, tmp_path, capsys, "2G")
    file_archive_config(site.tmp, site.data)
    site.ok("init")
    site.snapshot_steps(range(0, 6), 24 * MIB)
    want = content_of(f"{site.data}@5", site.pool, "want")
    back = f"{site.pool}/back"
    cmd = ("--config", str(site.config), "restore", site.data, "--to", "@5", "--into", back,
           "--yes")
    proc = start_zbak(*cmd)
    deadline = time.monotonic() + 120
    while not (exists(back) and prop(back, "zbak:restoring") != "-"):
        assert proc.poll() is None and time.monotonic() < deadline, "the restore ended first"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    held = settled_snapshots(back)
    assert held == [str(i) for i in range(len(held))] and 1 <= len(held) < 6, held
    newest = held[-1]

    done = run_zbak(*cmd, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"holds @{newest} from an interrupted restore: continuing with -I @{newest} @5"
            in done.stdout)
    # Counted on a relay: zfs-fuse's zfs send and zfs receive both leave the stream to the
    # daemon, so neither's I/O counter sees it (52 KB of 16 MiB were reported before).
    received = int(re.search(r"(\d+) bytes received", done.stdout)[1])
    assert received >= (5 - int(newest)) * 24 * MIB, done.stdout
    assert restored_content(back) == want and prop(back, "zbak:restoring") == "-"
