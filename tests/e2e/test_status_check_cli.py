"""``zbak status --check`` as a monitoring system runs it: the real ``zbak`` as a subprocess,
one Nagios exit code and status line per condition (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN):
good runs, a failed run, a partial run, a stale target, an audit that found errors, a failed
hook, an unreadable config or catalog. The runs behind them are real CLI runs on zfs-fuse
where a run can be made to fail for real; a partial run and a success 30 hours ago are
written into the real catalog."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.cli import Zbak, file_archive_config, zfs

from zrepl_py.catalog import db
from zrepl_py.catalog.repository import Catalog
from zrepl_py.errors import ExitStatus

ZBAK = Path(sys.executable).with_name("zbak")
UTC = dt.UTC


def check(config: Path, *args: str) -> tuple[int, list[str]]:
    """``zbak --config CONFIG status --check ARGS`` as a subprocess: exit code, stdout lines."""
    done = subprocess.run([str(ZBAK), "--config", str(config), "status", "--check", *args],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout.splitlines()


@pytest.fixture
def rig(make_pool, tmp_path, capsys):
    """Job ``data`` (a real dataset, replicated to a local pool and archived to a file
    store) and job ``broken`` (its pool does not exist); the catalog initialised."""
    src, bak = make_pool(), make_pool()
    data = f"{src.name}/data"
    zfs("create", data)
    config, store = file_archive_config(tmp_path, data, extra=f"""
        [jobs.data.replicate]
        targets = ["local:{bak.name}/replica"]
        [jobs.broken]
        dataset = "nosuchpool/data"
    """)
    run = Zbak(config, capsys)
    assert run("init", "--no-checks")[0] == ExitStatus.OK
    run.config, run.store, run.dataset, run.tmp = config, store, data, tmp_path
    return run


def catalog_of(config_dir: Path) -> Catalog:
    return Catalog(db.make_engine(f"sqlite:///{config_dir / 'state' / 'catalog.sqlite'}"))


def test_good_runs_are_ok_and_a_failed_newest_run_is_critical_until_a_good_one(rig):
    for action in ("snapshot", "replicate", "archive"):
        assert rig(action, "data")[0] == ExitStatus.OK
    assert check(rig.config) == (0, ["ZBAK OK - 2 job(s), no problem"])

    assert rig("snapshot", "broken")[0] == ExitStatus.FAILED
    code, lines = check(rig.config)
    assert code == 2 and lines[0].startswith("ZBAK CRITICAL - 1 critical: snapshot of job broken"
                                             " failed at ")
    assert "nosuchpool" in lines[0] and lines[1].startswith("CRITICAL: snapshot of job broken")
    assert check(rig.config, "data") == (0, ["ZBAK OK - 1 job(s), no problem"]), \
        "JOB... narrows the check"

    code, out = check(rig.config, "--json")
    report = json.loads("\n".join(out))
    assert (code, report["status"], report["code"]) == (2, "CRITICAL", 2)
    assert [(p["job"], p["action"], p["status"]) for p in report["problems"]] == [
        ("broken", "snapshot", "CRITICAL")]


def test_an_audit_that_found_errors_is_critical(rig):
    assert rig("snapshot", "data")[0] == ExitStatus.OK
    assert rig("archive", "data")[0] == ExitStatus.OK
    (volume,) = list(rig.store.rglob("vol-000000.zst"))
    volume.unlink()
    assert rig("audit", "data")[0] == ExitStatus.AUDIT_FINDINGS
    code, lines = check(rig.config, "data")
    assert code == 2 and lines[0].startswith("ZBAK CRITICAL - ")
    assert any(line.startswith("CRITICAL: audit of job data failed at ") and "error(s)" in line
               for line in lines)


def test_a_failed_hook_is_critical(rig, tmp_path):
    config = rig.config
    config.write_text(config.read_text() + textwrap.dedent("""
        [jobs.data.hooks.snapshot]
        post = ["/bin/false"]
    """))
    assert rig("snapshot", "data")[0] == ExitStatus.FAILED
    code, lines = check(config, "data")
    assert code == 2 and lines[0] == ("ZBAK CRITICAL - 1 critical: hook of job data"
                                      " (post-snapshot) failed at " + lines[0].split(" at ")[1])
    assert "exited 1" in lines[0]


@pytest.fixture
def catalog_only(tmp_path, capsys):
    """A config whose job's dataset is never touched: the catalog alone is judged."""
    config, _ = file_archive_config(tmp_path, "tank/data", extra="""
        [jobs.data.replicate]
        targets = ["local:bak/replica"]
    """)
    assert Zbak(config, capsys)("init", "--no-checks")[0] == ExitStatus.OK
    return config


def test_a_partial_newest_run_is_a_warning(catalog_only, tmp_path):
    catalog = catalog_of(tmp_path)
    now = dt.datetime.now(UTC)
    run = catalog.start_run("data", "replicate", "local:bak/replica", now)
    catalog.finish_run(run, result="partial", now=now, error="1 of 2 datasets diverged")
    code, lines = check(catalog_only)
    assert code == 1 and lines[0].startswith(
        "ZBAK WARNING - 1 warning: replicate of job data to local:bak/replica partial at ")
    assert lines[0].endswith(": 1 of 2 datasets diverged")


def test_a_target_without_a_success_for_longer_than_stale_after_is_critical(catalog_only,
                                                                             tmp_path):
    catalog = catalog_of(tmp_path)
    then = dt.datetime.now(UTC) - dt.timedelta(hours=30)
    run = catalog.start_run("data", "replicate", "local:bak/replica", then)
    catalog.finish_run(run, result="ok", now=then)
    code, lines = check(catalog_only)
    assert code == 2 and lines[0].startswith(
        "ZBAK CRITICAL - 1 critical: stale: no successful replicate of job data to"
        " local:bak/replica since ")
    assert "(30h ago; stale_after 26h)" in lines[0]


def test_a_check_that_cannot_read_the_config_or_the_catalog_is_unknown(tmp_path):
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[jobs.data]\ndatset = "tank/x"\n')
    code, lines = check(config)
    assert code == 3 and lines[0].startswith(f"ZBAK UNKNOWN - invalid config {config}")
    assert "jobs.data" in lines[0] and len(lines) == 1

    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[jobs.data]\ndataset = "tank/x"\n')
    code, lines = check(config)
    assert code == 3 and "zbak init" in lines[0]
    code, out = check(config, "--json")
    assert (code, json.loads("\n".join(out))["status"]) == (3, "UNKNOWN")
