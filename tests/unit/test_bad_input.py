"""docs/decisions.md#bad-input-is-one-line-and-its-exit-code: bad input gets one clear line and the
documented exit code, never a traceback, and never a hang or an unbounded read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from zrepl_py.cli import main
from zrepl_py.errors import ExitStatus
from zrepl_py.runtime.logsetup import printable
from zrepl_py.runtime.reading import CONFIG_LIMIT


def run(argv, capsys):
    capsys.readouterr()
    status = main(argv, env={})
    out, err = capsys.readouterr()
    return status, out, err


def test_a_config_path_that_is_a_fifo_is_refused_at_once_without_waiting_for_a_writer(tmp_path, capsys):
    fifo = tmp_path / "zbak.toml"
    os.mkfifo(fifo)
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=run(["--config", str(fifo),
                                                                 "config", "check"], capsys)))
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the reader so the test run does not hang
        with open(fifo, "w"):
            pass
        worker.join(10)
        pytest.fail("reading a FIFO config blocked")
    status, _, err = result["r"]
    assert status == ExitStatus.USAGE
    assert "not a regular file" in err and str(fifo) in err


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "/"])
def test_a_device_or_directory_as_config_is_one_line_exit_2(path, capsys):
    status, _, err = run(["--config", path, "config", "check"], capsys)
    assert status == ExitStatus.USAGE
    assert "Traceback" not in err and "cannot read config" in err


def test_a_config_larger_than_the_limit_is_refused(tmp_path, capsys):
    big = tmp_path / "zbak.toml"
    big.write_bytes(b"# padding\n" * (CONFIG_LIMIT // 10 + 1))
    status, _, err = run(["--config", str(big), "config", "check"], capsys)
    assert status == ExitStatus.USAGE and f"larger than {CONFIG_LIMIT} bytes" in err


def test_a_secret_file_that_is_a_fifo_is_a_secret_error_not_a_hang(tmp_path):
    from zrepl_py.config.alerts import SecretRef
    from zrepl_py.errors import SecretUnavailable

    fifo = tmp_path / "password"
    os.mkfifo(fifo)
    with pytest.raises(SecretUnavailable, match="not a regular file"):
        SecretRef(file=str(fifo)).load()


def test_a_password_inside_the_catalog_url_is_refused_and_never_echoed(tmp_path, capsys):
    config = tmp_path / "zbak.toml"
    config.write_text('[catalog]\nurl = "postgresql+psycopg://zbak:hunter2@db/zbak"\n')
    status, out, err = run(["--config", str(config), "config", "check"], capsys)
    assert status == ExitStatus.USAGE
    assert "catalog.url" in err and "~/.pgpass" in err
    assert "hunter2" not in out + err


@pytest.mark.parametrize("option", ["--max-duration", "--stale-uploads-days", "--sample"])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400"])
def test_audit_refuses_a_number_that_is_not_finite(option, value, tmp_path, capsys):
    status, _, err = run(["--config", str(tmp_path / "none.toml"), "audit", option, value], capsys)
    assert status == ExitStatus.USAGE
    assert option in err and "Traceback" not in err


def test_an_unexpected_exception_is_one_line_pointing_at_debug(monkeypatch, tmp_path, capsys):
    def broken(*_args, **_kwargs):
        raise TypeError("'Progress' object is not callable")

    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n')
    # A stand-in for a defect: no input makes zbak raise one
    # (docs/reliability.md#in-process-hooks-kept); likewise below.
    monkeypatch.setattr("zrepl_py.cli.common.Invocation.context", broken)
    status, _, err = run(["--config", str(config), "config", "check"], capsys)
    assert status == ExitStatus.FAILED
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("zbak: internal error: TypeError") and "--debug" in lines[0]


@pytest.mark.parametrize("raised, expected", [
    (EOFError("Server connection dropped"), "zbak: internal error: EOFError: Server connection"),
    (KeyboardInterrupt("signal 15"), "zbak: interrupted"),
], ids=["stray EOFError", "Ctrl-C or SIGTERM"])
def test_what_click_turns_into_abort_is_named_for_what_it_was(raised, expected, monkeypatch,
                                                               tmp_path, capsys):
    """click's Command.main turns an EOFError or KeyboardInterrupt raised in a command into
    Abort; zbak said "aborted" for both, as if the user had declined a prompt."""
    def broken(*_args, **_kwargs):
        raise raised

    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n')
    monkeypatch.setattr("zrepl_py.cli.common.Invocation.context", broken)
    status, _, err = run(["--config", str(config), "config", "check"], capsys)
    assert status == ExitStatus.FAILED
    assert err.strip().splitlines()[-1].startswith(expected), err
    assert "aborted" not in err and "Traceback" not in err


def test_sigterm_during_a_command_says_interrupted(tmp_path):
    """The real signal path: SIGTERM -> ``_terminate`` -> KeyboardInterrupt inside the
    command -> click's Abort -> "zbak: interrupted", exit 1."""
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n')
    code = ("import sys, time, zrepl_py.cli.common as c, zrepl_py.cli as cli\n"
            "def slow(*a, **k):\n"
            "    print('started', flush=True); time.sleep(60)\n"
            "c.Invocation.context = slow\n"
            f"sys.exit(int(cli.main(['--config', {str(config)!r}, 'status'])))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert err.strip() == "zbak: interrupted", err


def test_a_declined_prompt_still_says_aborted(monkeypatch, tmp_path, capsys):
    import click

    def declined(*_args, **_kwargs):
        raise click.Abort()  # what click.confirm raises on end of input (from None)

    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n')
    monkeypatch.setattr("zrepl_py.cli.common.Invocation.context", declined)
    status, _, err = run(["--config", str(config), "config", "check"], capsys)
    assert status == ExitStatus.FAILED and err.strip() == "aborted"


def test_with_debug_the_unexpected_exception_keeps_its_traceback(monkeypatch, tmp_path):
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n')
    code = ("import zrepl_py.cli.common as c, zrepl_py.cli as cli, sys\n"
            "def broken(*a, **k): raise TypeError('boom')\n"
            "c.Invocation.context = broken\n"
            f"sys.exit(int(cli.main(['--debug', '--config', {str(config)!r}, 'status'])))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "TypeError: boom" in done.stderr


def test_a_newline_in_a_job_name_cannot_forge_an_output_line(tmp_path, capsys):
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n')
    status, _, err = run(["--config", str(config), "snapshot", "evil\nzbak: all good"], capsys)
    assert status != ExitStatus.OK
    assert "\nzbak: all good" not in err and "evil\\nzbak: all good" in err


def test_printable_escapes_every_control_character_but_keeps_text():
    assert printable("tank/dätä") == "tank/dätä"
    assert printable("a\nb\r\tc\x1b[31m\x7f\x85\u2028") == "a\\nb\\r\\tc\\x1b[31m\\x7f\\x85\\u2028"


def test_prom_textfile_in_a_missing_directory_is_exit_2(tmp_path, capsys):
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n')
    assert run(["--config", str(config), "init"], capsys)[0] == ExitStatus.OK
    status, _, err = run(["--config", str(config), "status", "--prom-textfile",
                          str(tmp_path / "missing" / "x.prom")], capsys)
    assert status == ExitStatus.USAGE and "--prom-textfile" in err and "Traceback" not in err


def test_serve_log_in_a_missing_directory_is_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "zrepl_py", "serve", "--root", "tank",
                           "--log", str(tmp_path / "missing" / "serve.log")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SSH_ORIGINAL_COMMAND": "zfs list"})
    assert done.returncode == ExitStatus.USAGE
    assert "--log" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770, 0o720])
def test_init_refuses_a_shared_state_dir_and_leaves_its_mode_alone(mode, tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{shared}"\n')
    status, _, err = run(["--config", str(config), "init", "--no-checks"], capsys)
    assert status == ExitStatus.USAGE and "is shared" in err
    assert os.stat(shared).st_mode & 0o7777 == mode


def test_init_still_makes_its_own_state_dir_private(tmp_path, capsys):
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{own}"\n')
    assert run(["--config", str(config), "init", "--no-checks"], capsys)[0] == ExitStatus.OK
    assert os.stat(own).st_mode & 0o777 == 0o700


def test_config_check_warns_of_a_world_readable_config_and_secret_file(tmp_path, capsys):
    secret = tmp_path / "smtp-password"
    secret.write_text("hunter2\n")
    os.chmod(secret, 0o644)
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\n[alerts.email]\nhost = "127.0.0.1"\n'
                      f'starttls = false\nfrom = "z@example.org"\nto = ["o@example.org"]\n'
                      f'username = "z"\npassword = {{ file = "{secret}" }}\n')
    os.chmod(config, 0o644)
    status, _, err = run(["--config", str(config), "config", "check"], capsys)
    assert status == ExitStatus.OK  # loopback: a clear-text relay on this host is allowed
    assert f"{config} is readable by every user (mode 0644)" in err
    assert f"{secret} is readable by every user (mode 0644)" in err and "hunter2" not in err
    os.chmod(config, 0o600)
    os.chmod(secret, 0o600)
    assert "readable by every user" not in run(["--config", str(config), "config", "check"],
                                                capsys)[2]


def test_serve_without_log_or_syslog_records_every_request_below_home(tmp_path, monkeypatch):
    from zrepl_py.serve import execute

    # /dev/log is the host's (docs/reliability.md#in-process-hooks-kept).
    real_exists = os.path.exists
    monkeypatch.setattr(execute.os.path, "exists",
                        lambda p: False if p == "/dev/log" else real_exists(p))
    log = execute.audit_logger(None, home=str(tmp_path))
    log.warning("REFUSED from 10.0.0.1: rm -rf; request: 'x'")
    for handler in log.handlers:
        handler.flush()
    record = tmp_path / execute.FALLBACK_LOG
    assert "REFUSED from 10.0.0.1" in record.read_text()
    assert os.stat(record).st_mode & 0o777 == 0o600
    assert os.stat(record.parent).st_mode & 0o777 == 0o700


def test_a_failed_ssh_stage_is_quoted_as_host_and_remote_command_with_zfs_words():
    from zrepl_py.errors import PipelineFailed
    from zrepl_py.proc.pipeline import StageResult

    argv = ("ssh", *["-o", "ServerAliveInterval=15"] * 20, "-p", "2222", "--", "backup",
            "zfs receive -u tank/replica")
    culprit = StageResult("zfs receive", argv, 1, "cannot receive new filesystem stream:"
                          " destination tank/replica exists\n", False)
    message = str(PipelineFailed((culprit,), culprit))
    assert "`ssh backup zfs receive -u tank/replica`" in message
    assert "destination tank/replica exists" in message and "ServerAlive" not in message
