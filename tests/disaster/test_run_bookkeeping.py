"""Disaster: runs that fail before they start working, runs killed mid-stream, and an audit
while a long archive runs (docs/decisions.md#every-failed-action-is-a-recorded-run,
docs/decisions.md#a-killed-run-ends-interrupted, docs/decisions.md#audit-runs-beside-an-archive).

Every failure of an action is a recorded failed run and an alert; a run whose process was
killed is shown ``interrupted`` by the next ``zbak status`` (and alerted); a plain audit reads
beside a running archive instead of exiting 3.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.cli import rate_limited_zfs, start_zbak

from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs

MIB = 1024 * 1024
SEND_RATE = 8 * MIB
"""Bytes per second of the running archive's ``zfs send``: it outlasts the audit beside it."""


def _config(site, webhook, dataset: str, store: Path) -> None:
    store.mkdir(mode=0o700, exist_ok=True)
    site.write(f"""
        [alerts.webhook]
        url = "{webhook.url}"
        [stores.cold]
        url = "file://{store}"
        volume_size = "1MiB"
        [jobs.data]
        dataset = "{dataset}"
        [jobs.data.replicate]
        targets = ["local:{site.pool}/replica"]
        [jobs.data.archive]
        store = "cold"
    """)


def _runs(site) -> list[dict]:
    status, out, err = site.run("status", "--json", "--offline")
    assert status == ExitStatus.OK, out + err
    return [r for job in json.loads(out) for r in job["last_runs"]]


def test_a_missing_dataset_makes_replicate_and_archive_recorded_failed_runs_and_alerts(
        site, webhook):
    _config(site, webhook, f"{site.pool}/nope", site.tmp / "store")
    site.ok("init", "--no-checks")
    for action in ("replicate", "archive"):
        status, out, err = site.run(action)
        assert status == ExitStatus.FAILED, out + err
    runs = {r["action"]: r for r in _runs(site)}
    assert runs["replicate"]["result"] == "failed"
    assert runs["replicate"]["target"] == f"local:{site.pool}/replica"
    assert runs["archive"]["result"] == "failed"
    assert runs["archive"]["target"] == f"cold:{site.pool}/nope"
    assert f"{site.pool}/nope" in runs["archive"]["error"]
    for action in ("replicate", "archive"):
        (alert,) = webhook.failures(action)
        assert f"{site.pool}/nope" in alert["text"]


def test_a_restore_that_fails_while_planning_is_a_recorded_failed_run_and_an_alert(
        site, webhook):
    _config(site, webhook, site.data, site.tmp / "store")
    site.ok("init", "--no-checks")
    status, out, err = site.run("restore", "--to", "@never", "--into", f"{site.pool}/back",
                                "--yes")
    assert status == ExitStatus.FAILED and "no snapshot @never" in err, out + err
    (run,) = [r for r in _runs(site) if r["action"] == "restore"]
    assert run["result"] == "failed" and run["target"] == f"local:{site.pool}/back"
    (alert,) = webhook.failures("restore")
    assert "@never" in alert["text"]
    status, out, err = site.run("restore", "--to", "@never", "--dry-run")  # a dry run is not
    assert status == ExitStatus.FAILED                                      # recorded
    assert len([r for r in _runs(site) if r["action"] == "restore"]) == 1


def _start_archive(site) -> subprocess.Popen:
    """``zbak archive`` as a separate process, its ``zfs send`` at ``SEND_RATE``; returns
    once its stream is moving (its running-transfer file is there)."""
    proc = start_zbak("--config", str(site.config), "archive",
                      env=rate_limited_zfs(site.tmp / "slow-zfs", SEND_RATE))
    running = site.tmp / "state" / "running"
    deadline = time.monotonic() + 60
    while not (running.is_dir() and any(running.glob("archive-*.json"))):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the archive's stream never started"
        time.sleep(0.05)
    return proc


def test_an_audit_reads_beside_a_running_archive_and_a_killed_archive_is_interrupted(
        site, webhook):
    _config(site, webhook, site.data, site.tmp / "store")
    site.ok("init", "--no-checks")
    site.snapshot_steps(range(0, 1), 1 * MIB)
    site.ok("archive")
    # ZFS's `creation` has whole seconds: @1 taken in the second the archive started would
    # look older than that run to the audit's lag check (a warning, exit 4).
    time.sleep(1.1)
    site.snapshot_steps(range(1, 2), 64 * MIB)  # 8 s or more at SEND_RATE, however fast the host

    proc = _start_archive(site)
    try:
        status, out, err = site.run("audit")
        assert proc.poll() is None, "the archive ended before the audit did: no overlap tested"
        assert status == ExitStatus.OK, out + err  # not 3: it read beside the archive
        assert "restorable: @0 (1)" in out
        statuses = {r["action"]: r["result"] for r in _runs(site)}
        assert statuses["archive"] == "running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    (run,) = [r for r in _runs(site) if r["action"] == "archive"]
    assert run["result"] == "interrupted" and run["ended_at"] is not None
    assert f"process {proc.pid} is gone" in run["error"]
    (alert,) = webhook.failures("archive")
    assert "interrupted" in alert["text"]
    status, out, err = site.run("status")
    assert "interrupted" in out

    site.ok("archive")  # the next run resumes the upload and succeeds
    assert {r["action"]: r["result"] for r in _runs(site)}["archive"] == "ok"


def test_a_plain_audit_reads_beside_an_archive_but_not_beside_a_prune_or_a_repair(site, webhook):
    from zrepl_py.locking import dataset_lock

    _config(site, webhook, site.data, site.tmp / "store")
    site.ok("init", "--no-checks")
    site.snapshot_steps(range(0, 1), 1 * MIB)
    site.ok("archive")
    for action, expected in (("archive", ExitStatus.OK), ("prune", ExitStatus.LOCKED),
                             ("audit --repair", ExitStatus.LOCKED)):
        with dataset_lock(site.tmp / "state", f"local:{site.data}", action, heartbeat=0):
            status, out, err = site.run("audit")
        assert status == expected, f"{action}: {out}{err}"
    with dataset_lock(site.tmp / "state", f"local:{site.data}", "archive", heartbeat=0):
        status, out, err = site.run("audit", "--repair", "--yes")
    assert status == ExitStatus.LOCKED, out + err  # --repair stays exclusive
