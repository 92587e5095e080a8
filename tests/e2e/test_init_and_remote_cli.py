"""``zbak init`` preflight against real stores (directory, moto S3) and a job whose source is
a remote host reached over a real sshd."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time

import pytest
from support.cli import run_zbak
from support.common import hosts_table

from zrepl_py.errors import ExitStatus


def run(config, capsys, *args):
    return run_zbak("--config", str(config), *args)


def test_init_checks_a_directory_store_and_an_s3_bucket(tmp_path, s3_server, s3_bucket, capsys):
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [stores.dir]
        url = "file://{tmp_path / 'archive'}"
        [stores.s3]
        url = "s3://{s3_bucket}/zbak"
        endpoint = "{s3_server.endpoint_url}"
        region = "us-east-1"
    """))
    status, out, err = run(config, capsys, "init", "--json")
    assert status == ExitStatus.OK, out + err
    checks = {c["subject"]: c for c in json.loads(out)["checks"]}
    assert checks["store dir"]["ok"] and checks["store s3"]["ok"]
    assert (tmp_path / "archive").stat().st_mode & 0o777 == 0o700


def test_init_fails_naming_a_bucket_that_does_not_answer(tmp_path, s3_server, s3_bucket, capsys):
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [stores.s3]
        url = "s3://no-such-bucket-zbak/x"
        endpoint = "{s3_server.endpoint_url}"
        region = "us-east-1"
    """))
    status, out, err = run(config, capsys, "init")
    assert status == ExitStatus.FAILED
    assert "no-such-bucket-zbak" in out


def test_init_is_idempotent_and_reports_the_catalog_up_to_date(tmp_path, capsys):
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    assert run(config, capsys, "init")[0] == ExitStatus.OK
    status, out, _ = run(config, capsys, "init")
    assert status == ExitStatus.OK and "up to date" in out
    assert (tmp_path / "state" / "catalog.sqlite").stat().st_mode & 0o777 == 0o600


def test_commands_other_than_init_refuse_an_unmigrated_catalog(tmp_path, capsys):
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[jobs.a]\ndataset = "tank/a"\n')
    status, _, err = run(config, capsys, "status")
    assert status == ExitStatus.FAILED and "zbak init" in err


@pytest.mark.zfs
def test_a_job_on_a_remote_source_snapshots_and_prunes_over_ssh(zpool, sshd, tmp_path, capsys):
    data = f"{zpool.name}/remote data"  # a space: the name must survive the ssh hop
    subprocess.run(["zfs", "create", data], check=True)
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
    """) + hosts_table("src", sshd.host_config()) + textwrap.dedent(f"""
        [jobs.r]
        dataset = "src:{data}"
        [jobs.r.snapshot]
        retention = {{ keep_last = 1 }}
    """))
    status, out, err = run(config, capsys, "init", "--json")
    assert status == ExitStatus.OK, out + err
    assert run(config, capsys, "snapshot")[0] == ExitStatus.OK
    time.sleep(1.1)  # snapshot names have one-second resolution
    assert run(config, capsys, "snapshot")[0] == ExitStatus.OK
    status, out, err = run(config, capsys, "prune")
    assert status == ExitStatus.OK, err
    names = subprocess.run(["zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-r", data],
                           capture_output=True, text=True, check=True).stdout.split("\n")
    assert len([n for n in names if n]) == 1
    status, out, _ = run(config, capsys, "list", "snapshots", "--json", "--all")
    rows = json.loads(out)
    assert {r["host"] for r in rows} == {"src"} and len(rows) == 2
    assert sum(1 for r in rows if r["destroyed_at"]) == 1


@pytest.mark.zfs
@pytest.mark.ssh
@pytest.mark.parametrize("target", ["dataset", "directory"])
def test_init_checks_an_rsync_host_for_rsync_and_never_probes_a_pool_there(
        zpool, sshd, tmp_path, capsys, target):
    """docs/decisions.md#preflight-follows-the-method-the-job-will-use: a host without zfs that the
    job replicates to with rsync (method auto falling back for a dataset target, or a directory
    target) passes ``zbak init``."""
    data = f"{zpool.name}/data"
    subprocess.run(["zfs", "create", data], check=True)
    where = "pool/replica" if target == "dataset" else str(tmp_path / "nas")
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
    """) + hosts_table("nas", sshd.host_config(), zfs="/nonexistent/zfs",
                       zpool="/nonexistent/zpool") + textwrap.dedent(f"""
        [jobs.j]
        dataset = "{data}"
        [jobs.j.replicate]
        targets = ["nas:{where}"]
        method = "{'auto' if target == 'dataset' else 'rsync'}"
    """))
    status, out, err = run(config, capsys, "init", "--json")
    assert status == ExitStatus.OK, out + err
    (check,) = [c for c in json.loads(out)["checks"] if "target" in c["subject"]]
    assert check["detail"].startswith("rsync") and "zpool" not in check["detail"]
    if target == "dataset":
        assert "method auto copies with rsync into /pool/replica" in check["detail"]
