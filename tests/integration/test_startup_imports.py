"""What each kind of ``zbak`` command loads (docs/decisions.md#commands-start-in-under-300-ms: every
cron run, hook, monitoring probe and forced command pays its imports, so a command imports only
what it uses).

Each test runs the command in a fresh interpreter and reads ``sys.modules`` when it is done;
it asserts what the command does NOT load, never how long anything takes.

* ``--version`` and ``--help`` (which lists every command): click only;
* ``serve``, the SSH forced command paid per remote command: no config, no catalog, no
  table output, no SSH or S3 library, not even the ZFS client (only the naming rules);
* neither those nor ``serve`` loads what only a replication run uses (its planner, the
  threads of several datasets at once, the shared bandwidth limit);
* commands that need the config but no catalog (``config check``, ``status`` of a config
  without jobs): pydantic, but no SQLAlchemy;
* commands that read or write the catalog (``status``, ``list snapshots``, ``snapshot``,
  ``archive`` to a ``file://`` store): SQLAlchemy Core, but not its ORM, not Alembic (only
  ``zbak init`` migrates), and no SSH or S3 library for a local job and store;
* ``replicate`` before its prefetch thread starts: no SQLAlchemy yet (below);
* an SSH control connection: paramiko without invoke.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zrepl_py.errors import ExitStatus

_RUN = textwrap.dedent("""
    import json, sys
    from zrepl_py.cli import main
    try:
        status = int(main(sys.argv[2:]))
    except SystemExit as exc:  # zbak serve leaves through exit_now
        status = exc.code
    with open(sys.argv[1], "w") as out:
        json.dump({"status": status, "modules": sorted(sys.modules)}, out)
""")

HEAVY = {"sqlalchemy", "alembic", "pydantic", "rich", "paramiko", "boto3", "botocore",
         "apscheduler", "psycopg", "prometheus_client", "zstandard"}
"""Libraries some command needs and most do not."""

CONFIG_TABLES = ("zrepl_py.config.schema", "zrepl_py.config.jobs", "zrepl_py.config.hosts",
                 "zrepl_py.stores.registry", "zrepl_py.stores.schemes")
"""Modules of the config's tables (every one loads pydantic, which HEAVY names too)."""

REPLICATION_RUN = ("zrepl_py.replication", "zrepl_py.runtime.fanout", "zrepl_py.proc.ratelimit")
"""What only a replication run uses: the planner, the worker threads of several datasets at
once, the shared bandwidth limit."""


def _loaded(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
            expect: int = ExitStatus.OK) -> set[str]:
    """Run ``zbak ARGS`` in a new interpreter; return every module loaded by its end (top
    packages and full names)."""
    out = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", _RUN, str(out), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})
    assert out.exists(), done.stderr
    result = json.loads(out.read_text())
    assert result["status"] == expect, done.stdout + done.stderr
    return set(result["modules"]) | {name.split(".")[0] for name in result["modules"]}


def _config(tmp_path: Path, body: str = "") -> Path:
    path = tmp_path / "zbak.toml"
    path.write_text(f'state_dir = "{tmp_path / "state"}"\n' + textwrap.dedent(body))
    path.chmod(0o600)
    return path


def _init(config: Path) -> None:
    done = subprocess.run([str(Path(sys.executable).with_name("zbak")), "--config", str(config),
                           "init", "--no-checks"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["snapshot", "--help"],
                                  ["status", "--help"]])
def test_version_and_help_load_click_and_none_of_the_libraries_the_commands_use(
        tmp_path, args):
    loaded = _loaded(tmp_path, *args)
    assert loaded & HEAVY == set()
    assert not {m for m in loaded if m.startswith((*CONFIG_TABLES, "zrepl_py.catalog"))}
    assert not {m for m in loaded if m.startswith(REPLICATION_RUN)}


def test_the_forced_command_loads_no_config_schema_catalog_table_output_or_ssh(tmp_path):
    loaded = _loaded(tmp_path, "serve", "--root", "tank/replicas", "--log",
                     str(tmp_path / "serve.log"), env={"SSH_ORIGINAL_COMMAND": "rm -rf /"},
                     expect=126)
    assert loaded & HEAVY == set()
    assert not {m for m in loaded if m.startswith((*CONFIG_TABLES, "zrepl_py.zfs.client"))}
    assert not {m for m in loaded if m.startswith(REPLICATION_RUN)}


@pytest.mark.parametrize("args", [["config", "check"], ["config", "check", "--json"],
                                  ["status"], ["status", "--json"]])
def test_commands_without_a_catalog_to_read_load_no_sqlalchemy(tmp_path, args):
    config = _config(tmp_path)
    loaded = _loaded(tmp_path, "--config", str(config), *args)
    assert "pydantic" in loaded  # the config is validated all the same
    assert loaded & {"sqlalchemy", "alembic", "paramiko", "boto3", "apscheduler"} == set()
    assert not {m for m in loaded if m.startswith("zrepl_py.catalog.")} - {
        "zrepl_py.catalog.rows", "zrepl_py.catalog.chains"}


CATALOG_READERS = {"alembic", "sqlalchemy.orm", "paramiko", "boto3", "botocore", "psycopg",
                   "rich"}
"""What a local job's catalog command does not load: the ORM (the catalog is SQLAlchemy
Core), Alembic (only ``zbak init`` migrates), SSH and S3 libraries, psycopg (SQLite), rich
(its output goes to a pipe here, where tables are plain lines, ``cli.common.emit_table``)."""


@pytest.mark.parametrize("args", [["status", "--offline"], ["status", "--check"],
                                  ["list", "snapshots"], ["list", "streams"]])
def test_commands_reading_the_catalog_load_sqlalchemy_core_only(tmp_path, args):
    config = _config(tmp_path, """
        [jobs.data]
        dataset = "tank/data"
        [jobs.data.snapshot]
        schedule = "0 * * * *"
    """)
    _init(config)
    loaded = _loaded(tmp_path, "--config", str(config), *args)
    assert "sqlalchemy" in loaded
    assert loaded & CATALOG_READERS == set()
    assert "apscheduler.triggers.interval" not in loaded  # a crontab schedule needs none


@pytest.mark.zfs
def test_snapshot_and_archive_of_a_local_job_load_no_orm_migrations_ssh_or_s3(tmp_path, zpool):
    subprocess.run(["zfs", "create", f"{zpool.name}/data"], check=True, timeout=60)
    config = _config(tmp_path, f"""
        stores.local = {{ url = "file://{tmp_path / 'store'}" }}
        [jobs.data]
        dataset = "{zpool.name}/data"
        snapshot = {{ prefix = "zbak" }}
        archive = {{ store = "local" }}
    """)
    _init(config)
    loaded = _loaded(tmp_path, "--config", str(config), "snapshot")
    assert loaded & (CATALOG_READERS | {"apscheduler", "zstandard"}) == set()
    loaded = _loaded(tmp_path, "--config", str(config), "archive", "--dry-run")
    assert loaded & CATALOG_READERS == set()


def test_the_modules_a_run_loads_before_its_prefetch_import_no_sqlalchemy():
    """What ``zbak replicate`` loads before its prefetch thread starts
    (zrepl_py.runtime.prefetch): the command, the config, the alerts and the Context, but
    not SQLAlchemy, whose import is the CPU the main thread spends while the prefetch waits
    on the hosts."""
    script = textwrap.dedent("""
        import sys
        import zrepl_py.alerts, zrepl_py.cli, zrepl_py.cli.common, zrepl_py.cli.replicate_cmd
        import zrepl_py.config.loading, zrepl_py.invocation.context, zrepl_py.locking
        import zrepl_py.replication.job
        print(sorted({m.split(".")[0] for m in sys.modules} & {"sqlalchemy", "alembic"}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_a_command_that_opens_the_catalog_does_its_work_with_the_collector_on(tmp_path):
    """The console entry point starts with the cyclic collector off
    (``runtime.gcpause``); opening the catalog, the last big import, turns it back on."""
    config = _config(tmp_path, """
        [jobs.data]
        dataset = "tank/data"
    """)
    _init(config)
    script = textwrap.dedent(f"""
        import gc
        from zrepl_py.runtime.gcpause import begin_startup
        from zrepl_py.config.loading import load_config
        from zrepl_py.invocation.context import Context

        begin_startup()
        ctx = Context(config=load_config("{config}"), config_path="{config}")
        print(gc.isenabled(), end=" ")
        ctx.catalog()
        print(gc.isenabled(), gc.get_freeze_count() > 0)
        ctx.close()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"]


def test_the_daemon_runs_with_the_collector_on_though_it_opened_no_catalog(tmp_path):
    """A long-lived process must collect its cycles: the daemon ends the start-up itself
    (here before ``--once`` finds the catalog never initialised and exits 1)."""
    config = _config(tmp_path)
    script = textwrap.dedent(f"""
        import gc
        from zrepl_py.cli import main
        from zrepl_py.runtime.gcpause import begin_startup

        begin_startup()
        status = main(["--config", "{config}", "daemon", "--once"])
        print(int(status), gc.isenabled())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert "run `zbak init`" in done.stderr
    assert done.stdout.split() == ["1", "True"], done.stderr


def test_the_control_connection_loads_paramiko_without_invoke():
    """paramiko 3 imports invoke (about 0.04 s here) only to run an ssh_config "Match exec",
    which zbak never reads with paramiko; ``proc.ssh`` keeps it out, and paramiko still
    builds its client pieces."""
    script = textwrap.dedent("""
        import sys
        import zrepl_py.proc.ssh
        import paramiko
        paramiko.Transport, paramiko.Ed25519Key, paramiko.RejectPolicy
        print(sys.modules.get("invoke", "absent"))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() in ("None", "absent")
