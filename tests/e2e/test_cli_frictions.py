"""docs/decisions.md#cli-frictions-a-first-time-admin-met: the CLI frictions a first-time
admin meets, seen as the admin sees them: the real ``zbak`` run as a subprocess (``python -m
zrepl_py``, stdout and stderr pipes, so never a terminal), its exit codes, stderr lines and tables,
on zfs-fuse pools."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cli import Ran, run_zbak, zfs

from zrepl_py.errors import ExitStatus

BOX = set("┏┓┗┛┃━┡┩│─└┘┼╇┳┻╋")


def zbak(*args: str) -> Ran:
    return run_zbak(*args)


@dataclass
class Site:
    """A source pool with ``data``, a backup pool, a file store and a config of four jobs:
    ``j`` (snapshot, replicate, archive), ``nopool`` (a pool that does not exist), ``nods``
    (a dataset missing from the source pool) and ``badtarget`` (a target pool missing)."""

    src: str
    bak: str
    config: Path
    gone_pool: str

    @property
    def data(self) -> str:
        return f"{self.src}/data"

    def run(self, *args: str) -> Ran:
        return zbak("--config", str(self.config), *args)


@pytest.fixture
def site(make_pool, tmp_path) -> Site:
    src, bak = make_pool(), make_pool()
    gone = f"{src.name}gone"
    zfs("create", f"{src.name}/data")
    (src.mountpoint / "data" / "file").write_text("content\n")
    config = tmp_path / "zbak.toml"
    jobs = ""
    for name, dataset in (("j", f"{src.name}/data"), ("nopool", f"{gone}/data"),
                          ("nods", f"{src.name}/no-such")):
        jobs += textwrap.dedent(f"""
            [jobs.{name}]
            dataset = "{dataset}"
            [jobs.{name}.snapshot]
            retention = {{ keep_last = 10 }}
            [jobs.{name}.replicate]
            targets = ["local:{bak.name}/{name}"]
            [jobs.{name}.archive]
            store = "cold"
        """)
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [stores.cold]
        url = "file://{tmp_path / 'store'}"
        [jobs.badtarget]
        dataset = "{src.name}/data"
        [jobs.badtarget.replicate]
        targets = ["local:{gone}/replica"]
    """) + jobs)
    config.chmod(0o600)
    (tmp_path / "store").mkdir(mode=0o700)
    site = Site(src.name, bak.name, config, gone)
    assert site.run("init", "--no-checks").returncode == ExitStatus.OK
    return site


def plain(out: str) -> list[str]:
    """The lines of table output, checked to be plain: no box drawing, no trailing blanks."""
    lines = out.splitlines()
    assert not BOX & set(out), out
    assert all(line == line.rstrip() for line in lines), [l for l in lines if l != l.rstrip()]
    return lines


# --- --config, --debug, -v and -q before or after the command ----------------------------


@pytest.mark.zfs
def test_global_options_after_the_command_mean_what_they_mean_before_it(site):
    before = site.run("config", "check")
    after = zbak("config", "check", "--config", str(site.config))
    assert before.returncode == after.returncode == ExitStatus.OK, after.stderr
    assert before.stdout == after.stdout and "valid (4 job(s)" in after.stdout

    debug = zbak("replicate", "j", "--dry-run", "--config", str(site.config), "--debug")
    assert debug.returncode == ExitStatus.OK, debug.stderr
    assert "DEBUG zrepl_py.proc.local: run [local]: ['zfs'" in debug.stderr
    verbose = zbak("replicate", "--dry-run", "j", "-v", "--config", str(site.config))
    assert "DEBUG zrepl_py.proc.local" in verbose.stderr
    quiet = zbak("--config", str(site.config), "replicate", "--dry-run", "j")
    assert "DEBUG" not in quiet.stderr and quiet.stdout == verbose.stdout


@pytest.mark.zfs
def test_config_given_before_and_after_must_name_one_file_else_exit_2_before_anything_runs(
        site, tmp_path):
    spelled_twice = site.run("config", "check", "--config",
                             str(site.config.parent / ".." / site.config.parent.name / "zbak.toml"))
    assert spelled_twice.returncode == ExitStatus.OK, spelled_twice.stderr
    other = tmp_path / "other.toml"
    other.write_text(site.config.read_text())
    done = site.run("snapshot", "j", "--config", str(other))
    assert done.returncode == ExitStatus.USAGE
    assert f"--config names two files, {site.config} and {other}: give it once" in done.stderr
    assert "Traceback" not in done.stderr
    assert zfs("list", "-H", "-t", "snapshot", "-o", "name", "-r", site.data) == ""


@pytest.mark.zfs
def test_q_hides_progress_and_info_lines_qq_hides_warnings_and_errors_still_show(site):
    assert site.run("snapshot", "j").returncode == ExitStatus.OK
    quiet = site.run("replicate", "j", "-q")
    assert quiet.returncode == ExitStatus.OK and quiet.stderr == "", quiet.stderr
    assert f"{site.data}  full zbak_" in quiet.stdout  # the result table still prints
    time.sleep(1.1)  # snapshot names have whole seconds
    assert site.run("snapshot", "j").returncode == ExitStatus.OK
    normal = site.run("replicate", "j")
    assert "INFO zrepl_py.replication.zfs_target: sending" in normal.stderr
    failed = site.run("-qq", "snapshot", "nods")
    assert failed.returncode == ExitStatus.FAILED
    assert failed.stderr.splitlines() == [failed.stderr.splitlines()[0]]
    assert failed.stderr.startswith("zbak: job nods: source dataset")


# --- config check --json ------------------------------------------------------------------


def test_config_check_json_says_valid_with_what_the_config_holds(tmp_path):
    """Also: ``0 4 * * 7`` and the nicknames are crontab(5) schedules the check accepts."""
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [daemon]
        audit_schedule = "@weekly"
        [jobs.j]
        dataset = "tank/data"
        [jobs.j.snapshot]
        schedule = "0 4 * * 7"
        [jobs.k]
        dataset = "tank/more"
        [jobs.k.snapshot]
        schedule = "@daily"
    """))
    config.chmod(0o600)
    done = zbak("config", "check", "--json", "--config", str(config))
    assert done.returncode == ExitStatus.OK and done.stderr == "", done.stderr
    assert json.loads(done.stdout) == {
        "config": str(config), "valid": True, "problems": [], "warnings": [],
        "jobs": ["j", "k"], "hosts": [], "stores": [], "catalog": "sqlite"}


def test_config_check_json_lists_every_problem_by_key_and_exits_2(tmp_path):
    config = tmp_path / "zbak.toml"
    config.write_text('[jobs.j]\ndataset = "tank/data"\n[jobs.j.snapshot]\nschedule = "0 4 * * 8"\n'
                      'typo = 1\n')
    done = zbak("--config", str(config), "config", "check", "--json")
    assert done.returncode == ExitStatus.USAGE and done.stderr == "", done.stderr
    found = json.loads(done.stdout)
    assert found["valid"] is False and found["config"] == str(config)
    assert {p["key"]: p["message"] for p in found["problems"]} == {
        "jobs.j.snapshot.schedule": "invalid cron schedule '0 4 * * 8': bad day of week",
        "jobs.j.snapshot.typo": "unknown key"}


# --- tables off a terminal, rich markup, one line per failure ------------------------------


@pytest.mark.zfs
def test_off_a_terminal_tables_are_plain_unpadded_and_keep_bracketed_text(site):
    done = site.run("replicate", "badtarget")
    assert done.returncode == ExitStatus.FAILED
    lines = plain(done.stdout)
    assert lines[0] == "replication"
    assert lines[1].split() == ["job", "target", "dataset", "plan", "bytes", "problem"]
    (row,) = [line for line in lines if line.startswith("badtarget")]
    assert "FAILED  0      [local] `zpool" in row and site.gone_pool in row  # one line, unfolded

    status = site.run("status", "--offline")
    assert status.returncode == ExitStatus.OK, status.stderr
    lines = plain(status.stdout)
    # The runs table's row (the targets table names the replica "failed" too, without why).
    (failed,) = [line for line in lines if line.split()[:2] == ["badtarget", "replicate"]]
    assert " failed " in failed and "[local] `zpool" in failed
    assert max(map(len, lines)) == len(max(lines, key=len).rstrip())  # no padding to a width


@pytest.mark.zfs
def test_a_failed_run_is_one_line_on_stderr_not_a_log_line_beside_the_error(site):
    done = site.run("snapshot", "nods")
    assert done.returncode == ExitStatus.FAILED
    assert done.stderr.splitlines() == [
        f"zbak: job nods: source dataset {site.src}/no-such does not exist (job nods, file"
        f" {site.config}): create it or fix jobs.nods.dataset"]


# --- a missing source dataset or pool, said like a config error ----------------------------


COMMANDS = [("snapshot",), ("replicate",), ("archive",), ("prune",), ("holds", "list")]


@pytest.mark.zfs
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_missing_source_pool_or_dataset_is_named_with_its_job_and_file(site, command):
    for job, words in (
            ("nopool", f"source dataset {site.gone_pool}/data: pool {site.gone_pool} does not"
                       f" exist (job nopool, file {site.config}): import it"),
            ("nods", f"source dataset {site.src}/no-such does not exist (job nods, file"
                     f" {site.config}): create it or fix jobs.nods.dataset")):
        done = site.run(*command, job)
        assert done.returncode == ExitStatus.FAILED, done.stdout + done.stderr
        assert f"zbak: job {job}: {words}" in done.stderr
        assert "cannot open" not in done.stderr and "no such pool" not in done.stderr


@pytest.mark.zfs
def test_init_names_a_missing_source_pool_or_dataset_in_its_checks(site):
    done = site.run("init")
    assert done.returncode == ExitStatus.FAILED
    lines = plain(done.stdout)
    assert any(f"source dataset {site.gone_pool}/data: pool {site.gone_pool} does not exist"
               f" (job nopool, file {site.config})" in line for line in lines), done.stdout
    assert any(f"source dataset {site.src}/no-such does not exist (job nods, file"
               f" {site.config})" in line for line in lines), done.stdout
    assert not [line for line in lines if "cannot open" in line and " source " in line]


@pytest.mark.zfs
def test_the_source_pool_gone_after_a_cycle_every_command_names_it(site):
    """The realistic case: snapshots, a replica (with its hold on the source) and an archive
    exist, then the source pool is gone (destroyed here; exported or not imported at boot
    reads the same)."""
    for command in ("snapshot", "replicate", "archive"):
        assert site.run(command, "j").returncode == ExitStatus.OK
    deadline = time.monotonic() + 20
    while subprocess.run(["zpool", "destroy", "-f", site.src], capture_output=True).returncode:
        assert time.monotonic() < deadline, "zpool destroy kept failing"
        time.sleep(0.3)
    words = (f"source dataset {site.data}: pool {site.src} does not exist (job j, file"
             f" {site.config}): import it (zpool import {site.src}) or fix jobs.j.dataset")
    for command in COMMANDS:
        done = site.run(*command, "j")
        assert done.returncode == ExitStatus.FAILED, done.stdout + done.stderr
        assert done.stderr.splitlines() == [f"zbak: job j: {words}"], done.stderr
    status = site.run("status", "j")
    assert status.returncode == ExitStatus.OK and words in status.stdout, status.stdout
    audit = site.run("audit", "j")  # reads the catalog, the store and the replica only
    assert "cannot open" not in audit.stdout + audit.stderr
