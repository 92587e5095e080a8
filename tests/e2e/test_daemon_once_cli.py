"""``zbak daemon --once`` as a systemd timer runs it: the real ``zbak`` as a subprocess on
zfs-fuse pools runs every action due now, one after the other (hooks included, the restore
drill last), exits 1 when one failed, and a second call right after finds nothing due."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.cli import Zbak, file_archive_config, snapshots, zfs
from support.hookscript import HookScript

from zrepl_py.catalog import db
from zrepl_py.catalog.repository import Catalog
from zrepl_py.errors import ExitStatus

ZBAK = Path(sys.executable).with_name("zbak")
NEVER = "0 0 1 1 *"  # due only because it never ran: a second call finds nothing due


def once(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(ZBAK), "--config", str(config), "daemon", "--once"],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))


def test_once_runs_every_due_action_in_order_then_a_second_call_finds_nothing_due(
    make_pool, tmp_path, capsys
):
    src, bak = make_pool(), make_pool()
    data = f"{src.name}/data"
    zfs("create", data)
    zfs("create", f"{bak.name}/scratch")
    hook = HookScript(tmp_path)
    config, _ = file_archive_config(tmp_path, data, archive=f'schedule = "{NEVER}"', extra=f"""
        [jobs.data.snapshot]
        schedule = "{NEVER}"
        [jobs.data.replicate]
        targets = ["local:{bak.name}/replica"]
        schedule = "{NEVER}"
        [jobs.data.drill]
        schedule = "{NEVER}"
        [restore]
        scratch = "{bak.name}/scratch"
        [jobs.data.hooks.snapshot]
        post = {hook.toml()}
        [jobs.broken]
        dataset = "nosuchpool/data"
        [jobs.broken.snapshot]
        schedule = "{NEVER}"
        [daemon]
        prune_schedule = "{NEVER}"
        audit_schedule = "{NEVER}"
    """)
    assert Zbak(config, capsys)("init", "--no-checks")[0] == ExitStatus.OK

    first = once(config)
    assert first.returncode == ExitStatus.FAILED, first.stderr
    assert ("daemon --once: 9 run(s) due: snapshot data, replicate data, archive data,"
            " prune data, audit data, drill data, snapshot broken, prune broken, audit broken"
            ) in first.stderr
    assert "Traceback" not in first.stderr
    (taken,) = snapshots(data)
    assert snapshots(f"{bak.name}/replica") == [taken]
    catalog = Catalog(db.make_engine(f"sqlite:///{tmp_path / 'state' / 'catalog.sqlite'}"))
    results = {(r.job, r.action): r.result for r in catalog.last_runs()}
    assert {k: v for k, v in results.items() if k[0] == "data"} == {
        ("data", a): "ok"
        for a in ("snapshot", "replicate", "archive", "prune", "audit", "drill", "hook")}
    drilled = {(d.source, d.result, d.snapshot) for d in catalog.last_drills("data")}
    assert drilled == {("cold", "ok", taken), (f"local:{bak.name}/replica", "ok", taken)}, \
        "the daemon's drill restored the new snapshot from the store and the replica"
    assert results[("broken", "snapshot")] == "failed"
    (call,) = hook.calls()
    assert (call["env"]["ZBAK_JOB"], call["env"]["ZBAK_SNAPSHOT"]) == ("data", taken), \
        "the hooks run in the daemon's runs too"

    second = once(config)
    assert second.returncode == ExitStatus.OK, second.stderr
    assert "daemon --once: 0 run(s) due: nothing" in second.stderr
    assert snapshots(data) == [taken] and len(hook.calls()) == 1
