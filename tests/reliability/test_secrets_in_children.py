"""docs/reliability.md#r39-no-secrets-in-argv: no child process (zfs, ssh, rsync, zstd) inherits a
secret environment variable, and a secret-looking command-line option is refused with a hint."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zrepl_py import errors
from zrepl_py.cli import main
from zrepl_py.config.loading import load_config
from zrepl_py.errors import ExitStatus
from zrepl_py.proc.childenv import child_env, is_secret_name
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.proc.pipeline import Stage, run_pipeline

REPO = Path(__file__).resolve().parents[2]


SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "zbakTestSecretKey0123456789",
    "AWS_SESSION_TOKEN": "zbakTestSessionToken0123456789",
    "AWS_ACCESS_KEY_ID": "AKIAZBAKTEST0000",
    "PGPASSWORD": "zbakTestPgPassword",
    "ZBAK_HOOK": "zbakTestHookValueNamedInTheConfig",  # no secret-like word in the name
    "GITHUB_TOKEN": "zbakTestGithubToken",
    "BORG_PASSPHRASE": "zbakTestPassphrase",
}
KEPT = {"SSH_AUTH_SOCK": "/tmp/agent.sock", "LANG": "C.UTF-8", "ZBAK_TEST_MARK": "kept"}


def _environ(text: bytes) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.decode().split("\0") if "=" in item)


@pytest.fixture
def secret_environment(monkeypatch, tmp_path):
    """SECRETS and KEPT in this process's environment; ZBAK_HOOK named by a config secret."""
    for key, value in {**SECRETS, **KEPT}.items():
        monkeypatch.setenv(key, value)
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [alerts.webhook]
        url = "https://hooks.example.org/zbak"
        headers = {{ Authorization = {{ env = "ZBAK_HOOK" }} }}
    """))
    load_config(config)  # validating the config registers ZBAK_HOOK as a secret's variable
    return config


def test_local_commands_run_without_any_secret_environment_variable(secret_environment):
    """docs/reliability.md#r39-no-secrets-in-argv: ``LocalExecutor`` (every zfs, zpool, rsync, mkdir
    zbak runs locally) starts its child with AWS_*, password/token variables and the config's secret
    variables removed, and everything else (PATH, SSH_AUTH_SOCK, locale) kept."""
    seen = _environ(LocalExecutor().run(["env", "-0"]).stdout)
    assert not set(SECRETS) & set(seen), sorted(set(SECRETS) & set(seen))
    for key, value in KEPT.items():
        assert seen[key] == value
    assert seen["PATH"] == os.environ["PATH"]
    assert os.environ["AWS_SECRET_ACCESS_KEY"]  # zbak itself (boto3) still has them


def test_pipeline_stages_run_without_any_secret_environment_variable(secret_environment, tmp_path):
    """docs/reliability.md#r39-no-secrets-in-argv: every stage of ``run_pipeline`` (zfs send, zstd,
    pv, ssh and the ssh connection master it may leave running) starts without the secret
    variables."""
    out = tmp_path / "env.out"
    with open(out, "wb") as sink:
        run_pipeline([Stage("first", ("env", "-0")), Stage("second", ("cat",))], stdout=sink)
    seen = _environ(out.read_bytes())
    assert not set(SECRETS) & set(seen)
    assert seen["SSH_AUTH_SOCK"] == KEPT["SSH_AUTH_SOCK"]


@pytest.mark.parametrize("name, secret", [
    ("AWS_PROFILE", True), ("aws_secret_access_key", True), ("PGPASSWORD", True),
    ("SMTP_PASS_WORD", False), ("MY_API_KEY", True), ("HTTP_AUTHORIZATION", True),
    ("SSH_AUTH_SOCK", False), ("PATH", False), ("HOME", False), ("ZBAK_LOG_LEVEL", False),
    ("LC_ALL", False), ("VAULT_TOKEN", True), ("GOOGLE_APPLICATION_CREDENTIALS", True),
])
def test_secret_variable_names_are_recognised_by_prefix_and_word(name, secret):
    """docs/reliability.md#r39-no-secrets-in-argv (U): the name rule of ``child_env``."""
    assert is_secret_name(name) is secret
    assert (name in child_env({name: "x"})) is not secret


@pytest.mark.parametrize("argv", [
    ["archive", "--s3-secret-key", "VALUE42"], ["--aws-secret-access-key=VALUE42", "archive"],
    ["init", "--password", "VALUE42"], ["status", "--session-token", "VALUE42"],
    ["-passphrase", "VALUE42"], ["archive", "--access-key", "VALUE42"],
    ["restore", "--api-key=VALUE42"],
])
def test_secret_looking_options_are_refused_with_a_hint_and_without_their_value(argv):
    """docs/reliability.md#r39-no-secrets-in-argv (U): ``refuse_secret_options`` raises UsageError
    (exit 2) naming the option and where secrets go instead, never echoing the value."""
    from zrepl_py.cli.common import refuse_secret_options

    with pytest.raises(errors.UsageError) as caught:
        refuse_secret_options(argv)
    assert caught.value.exit_status == ExitStatus.USAGE
    assert "AWS chain" in str(caught.value) and "{ env" in str(caught.value)
    assert "VALUE42" not in str(caught.value)


def test_zbak_refuses_a_secret_option_with_exit_2_in_process_and_as_a_subprocess(capsys):
    """docs/reliability.md#r39-no-secrets-in-argv (E): the refusal is wired into ``main``, before
    click parses anything, and the value never reaches the terminal."""
    assert main(["archive", "--s3-secret-key", "VALUE42"], env={}) == ExitStatus.USAGE
    err = capsys.readouterr().err
    assert "--s3-secret-key" in err and "AWS chain" in err and "VALUE42" not in err
    done = subprocess.run([sys.executable, "-m", "zrepl_py", "archive", "--password=VALUE42"],
                          capture_output=True, text=True)
    assert done.returncode == ExitStatus.USAGE
    assert "--password" in done.stderr and "VALUE42" not in done.stderr + done.stdout


@pytest.mark.parametrize("argv", [
    ["archive", "--json"], ["restore", "tank/d", "--to", "@token-1"],
    ["restore", "--", "--password-like-operand"], ["serve", "--allow-force-receive"],
])
def test_ordinary_options_and_operands_pass(argv):
    """docs/reliability.md#r39-no-secrets-in-argv (U): no false alarm on zbak's own options or on
    operands."""
    from zrepl_py.cli.common import refuse_secret_options

    refuse_secret_options(argv)
