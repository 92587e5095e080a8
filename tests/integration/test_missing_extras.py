"""boto3, psycopg, apprise and pyrage are extras (``zbak[s3]``, ``zbak[postgresql]``,
``zbak[apprise]``, ``zbak[age]`` for sealed stores): a config that needs a missing one is refused with one line naming the extra, exit 2, no traceback, at
``config check``, ``init``, ``daemon`` and the first command that opens the store or catalog.

The real ``zbak`` runs as a subprocess with the module hidden by a ``sitecustomize`` that
sets ``sys.modules[NAME] = None``: ``import NAME`` then fails as for a package that is not
installed (``ModuleNotFoundError`` naming it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import Ran, run_zbak

from zrepl_py.errors import ExitStatus

S3_LINE = "zbak: store cold needs boto3: pip install 'zbak[s3]'"
PG_LINE = ("zbak: the PostgreSQL catalog ([catalog] url) needs psycopg:"
           " pip install 'zbak[postgresql]'")
AGE_LINE = "zbak: store cold needs pyrage: pip install 'zbak[age]'"
APPRISE_LINE = ("zbak: the apprise alerts ([alerts.apprise]) needs apprise:"
                " pip install 'zbak[apprise]'")


def _config(tmp_path: Path, *, catalog: str | None = None, s3: bool = False,
            apprise: bool = False, job: bool = False, sealed: bool = False) -> Path:
    lines = [f'state_dir = "{tmp_path / "state"}"']
    # `zbak status` opens the catalog only when it has a job
    # (docs/decisions.md#commands-start-in-under-300-ms)
    if job:
        lines += ["[jobs.data]", 'dataset = "tank/data"']
    if apprise:
        lines += ["[alerts.apprise]", 'urls = [{ env = "HOME" }]']
    if catalog:
        lines += ["[catalog]", f'url = "{catalog}"']
    if s3:  # nothing listens on port 9 (discard): no command may get as far as dialling it
        lines += ["[stores.cold]", 'url = "s3://zbak-archive/tank"',
                  'endpoint = "http://127.0.0.1:9"']
    if sealed:
        lines += ["[stores.cold]", f'url = "file://{tmp_path}"', "[stores.cold.age]",
                  'recipients = ["age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"]']
    path = tmp_path / "zbak.toml"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def _zbak(config: Path, *args: str, hide: tuple[str, ...] = ()) -> Ran:
    env = {}
    if hide:
        site = config.parent / "hide"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(
            "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in hide))
        env["PYTHONPATH"] = str(site)
    return run_zbak("--config", str(config), *args, env=env, timeout=120)


def _refused(done: Ran, line: str) -> None:
    assert done.returncode == ExitStatus.USAGE, done.stderr
    assert done.stderr.splitlines() == [line]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [["config", "check"], ["init", "--no-checks"], ["daemon"]])
def test_an_s3_store_without_boto3_is_refused_naming_the_s3_extra(tmp_path, args):
    _refused(_zbak(_config(tmp_path, s3=True), *args, hide=("boto3",)), S3_LINE)


@pytest.mark.parametrize("args", [["config", "check"], ["init", "--no-checks"], ["daemon"]])
def test_a_sealed_store_without_pyrage_is_refused_naming_the_age_extra(tmp_path, args):
    _refused(_zbak(_config(tmp_path, sealed=True), *args, hide=("pyrage",)), AGE_LINE)


@pytest.mark.parametrize("args", [["config", "check"], ["init", "--no-checks"], ["daemon"],
                                  ["list", "snapshots"], ["status", "--offline"]])
def test_a_postgresql_catalog_without_psycopg_is_refused_naming_the_postgresql_extra(
        tmp_path, args):
    config = _config(tmp_path, catalog="postgresql://zbak@127.0.0.1:9/zbak", job=True)
    _refused(_zbak(config, *args, hide=("psycopg",)), PG_LINE)


@pytest.mark.parametrize("args", [["config", "check"], ["daemon"], ["status"]])
def test_apprise_alerts_without_apprise_are_refused_naming_the_apprise_extra(tmp_path, args):
    _refused(_zbak(_config(tmp_path, apprise=True), *args, hide=("apprise",)), APPRISE_LINE)


def test_the_first_command_that_opens_an_s3_store_without_boto3_names_the_extra(tmp_path):
    config = _config(tmp_path, s3=True)
    assert _zbak(config, "init", "--no-checks").returncode == 0
    _refused(_zbak(config, "catalog", "rebuild", "cold", hide=("boto3",)), S3_LINE)


def test_config_check_names_every_missing_extra_in_its_one_line(tmp_path):
    config = _config(tmp_path, catalog="postgresql+psycopg://zbak@db/zbak", s3=True)
    done = _zbak(config, "config", "check", hide=("boto3", "psycopg"))
    _refused(done, PG_LINE + "; " + S3_LINE.removeprefix("zbak: "))


def test_a_config_with_a_file_store_and_sqlite_catalog_needs_neither_extra(tmp_path):
    config = _config(tmp_path)
    config.write_text(config.read_text() + f'[stores.local]\nurl = "file://{tmp_path}/a"\n')
    done = _zbak(config, "config", "check", hide=("boto3", "psycopg"))
    assert done.returncode == 0, done.stderr
    assert _zbak(config, "init", "--no-checks", hide=("boto3", "psycopg")).returncode == 0


def test_a_half_installed_boto3_is_refused_quoting_its_import_error(tmp_path):
    shadow = tmp_path / "shadow" / "boto3"
    shadow.mkdir(parents=True)  # a boto3 whose botocore is gone, found before the real one
    (shadow / "__init__.py").write_text("import botocore_gone\n")
    done = run_zbak("--config", str(_config(tmp_path, s3=True)), "config", "check",
                    env={"PYTHONPATH": str(shadow.parent)}, timeout=120)
    _refused(done, "zbak: store cold needs boto3 (No module named 'botocore_gone'):"
                   " pip install 'zbak[s3]'")
