"""docs/decisions.md#every-child-process-starts-through-spawn,
docs/reliability.md#r39-no-secrets-in-argv, docs/reliability.md#r40-no-secrets-in-logs: a whole zbak
cycle leaks no secret.

The cycle runs on real components: zfs-fuse pools, ``zbak init`` (which dials the sshd host and
the S3 store), ``snapshot``, ``replicate`` to the test sshd, ``archive`` to moto's S3 over HTTP
(twice: a full and an incremental), ``list``, ``status``, ``audit``, ``restore --from`` the
store, and failing commands (a store whose bucket does not exist, an unknown snapshot), with
AWS credentials in the environment: an access key, a SECRET key and a SESSION token, plus an
SMTP password the ``[alerts.email]`` section reads from the environment.

Searched for the secret key, the session token and the SMTP password (whole, and a 16-character
piece of each, in case of truncation):

* every log record (a handler added to the root logger after zbak's own set-up, at DEBUG,
  formatted with its traceback) and everything zbak wrote on stdout and stderr (tables, JSON,
  progress lines, ``zbak: ...`` error texts);
* the argv of every process on the machine while the cycle ran (``/proc/*/cmdline`` sampled
  every few ms: the zfs, ssh and zstd children, the remote side of ssh too, since sshd runs
  here), and the argv zbak logged for each command it ran;
* every row of every table of the catalog, and every object the archive wrote to S3;
and botocore/urllib3 never log at DEBUG: their loggers stay at WARNING or above, and no record
of theirs below WARNING is ever created.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import secrets
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from support.cli import zfs
from support.common import hosts_table

from zrepl_py import cli
from zrepl_py.errors import ExitStatus
from zrepl_py.runtime import logsetup

pytestmark = [pytest.mark.zfs, pytest.mark.ssh, pytest.mark.s3, pytest.mark.slow]

WIRE_LOGGERS = ("botocore", "boto3", "urllib3", "s3transfer", "botocore.endpoint",
                "botocore.auth", "botocore.credentials", "botocore.hooks",
                "urllib3.connectionpool", "botocore.httpsession", "botocore.parsers")


class Records(logging.Handler):
    """Keeps every record that reaches the root logger, formatted with its traceback."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.texts: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.texts.append(self.format(record) + " " + repr(record.args))


class CmdlineSampler(threading.Thread):
    """Reads ``/proc/*/cmdline`` of every process until stopped; keeps what it saw."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.seen: set[bytes] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                with contextlib.suppress(OSError):
                    with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                        self.seen.add(f.read())
            time.sleep(0.003)


@pytest.fixture
def secret_env(monkeypatch):
    """AWS credentials with a secret key and a session token, and an SMTP password, in the
    environment (what the standard AWS chain and ``{ env = ... }`` secrets read)."""
    values = {
        "secret key": "zbakSecretKey" + secrets.token_hex(16),
        "session token": "zbakSessionToken" + secrets.token_hex(24),
        "smtp password": "zbakSmtpPassword" + secrets.token_hex(8),
    }
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAZBAKTEST0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", values["secret key"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", values["session token"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("ZBAK_TEST_SMTP_PASSWORD", values["smtp password"])
    return values


def needles(values: dict[str, str]) -> dict[str, bytes]:
    """What must never appear: each secret, and a 16-character piece of its random part."""
    found = {}
    for what, value in values.items():
        found[what] = value.encode()
        found[what + " (piece)"] = value[-20:-4].encode()
    return found


def leaks(blob: bytes | str, values: dict[str, str]) -> list[str]:
    data = blob.encode(errors="surrogateescape") if isinstance(blob, str) else blob
    return [what for what, needle in needles(values).items() if needle in data]


def cycle_config(tmp_path: Path, sshd, s3_server, bucket: str, data: str, replica: str,
                 extra: str = "") -> str:
    """The cycle's config: a replicate target on the test sshd, an S3 store on moto, an
    SMTP alert whose password comes from ``ZBAK_TEST_SMTP_PASSWORD``, and ``extra`` TOML."""
    return textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
    """) + hosts_table("backup", sshd.host_config(), connect_timeout=5) + textwrap.dedent(f"""
        [stores.cold]
        url = "s3://{bucket}/zbak"
        endpoint = "{s3_server.endpoint_url}"
        region = "us-east-1"
        volume_size = "1MiB"
        [alerts.email]
        host = "127.0.0.1"
        port = 9
        starttls = false
        from = "zbak@example.org"
        to = ["ops@example.org"]
        username = "zbak"
        password = {{ env = "ZBAK_TEST_SMTP_PASSWORD" }}
        [jobs.j]
        dataset = "{data}"
        [jobs.j.replicate]
        targets = ["backup:{replica}"]
        [jobs.j.archive]
        store = "cold"
    """) + textwrap.dedent(extra)


def test_a_debug_cycle_with_aws_session_credentials_leaks_no_secret_anywhere(
        make_pool, sshd, s3_server, secret_env, tmp_path, monkeypatch):
    """docs/reliability.md#r39-no-secrets-in-argv."""
    src, bak = make_pool(), make_pool()
    data, replica = f"{src.name}/data", f"{bak.name}/replica"
    zfs("create", data)
    mount = Path(zfs("get", "-Hp", "-o", "value", "mountpoint", data).strip())
    bucket = f"zbak-secrets-{uuid.uuid4().hex[:10]}"
    s3_server.client().create_bucket(Bucket=bucket)


    config = tmp_path / "zbak.toml"
    config.write_text(cycle_config(tmp_path, sshd, s3_server, bucket, data, replica))
    broken = tmp_path / "broken.toml"
    broken.write_text(cycle_config(tmp_path, sshd, s3_server, "zbak-no-such-bucket", data,
                                  replica))

    records = Records()
    real_setup = logsetup.setup_logging

    def setup_logging(level: str) -> None:  # zbak's own set-up, then our recorder on root
        real_setup(level)
        logging.getLogger().addHandler(records)

    # In-process (docs/reliability.md#in-process-hooks-kept): every record and the wire loggers'
    # levels are read inside the process; test_no_child_... runs the cycle as processes.
    monkeypatch.setattr(logsetup, "setup_logging", setup_logging)
    output: list[str] = []
    levels: dict[str, int] = {}

    def zbak(*args: str, cfg: Path = config) -> tuple[ExitStatus, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli.main(["--debug", "--config", str(cfg), *args], env=dict(os.environ))
        levels.update({name: logging.getLogger(name).getEffectiveLevel() for name in WIRE_LOGGERS})
        output.append(out.getvalue() + err.getvalue())
        return status, out.getvalue() + err.getvalue()

    sampler = CmdlineSampler()
    sampler.start()
    try:
        assert zbak("config", "check")[0] == ExitStatus.OK, output[-1]
        assert zbak("init")[0] == ExitStatus.OK, output[-1]
        for step in range(2):
            (mount / f"f{step}.bin").write_bytes(os.urandom(400_000))
            assert zbak("snapshot")[0] == ExitStatus.OK, output[-1]
            assert zbak("replicate")[0] == ExitStatus.OK, output[-1]
            assert zbak("archive", "--json")[0] == ExitStatus.OK, output[-1]
            time.sleep(1.1)  # snapshot names have a one-second resolution
        newest = zfs("list", "-H", "-t", "snapshot", "-o", "name", "-s", "createtxg",
                     "-r", data).split()[-1].split("@")[1]
        status, text = zbak("restore", data, "--to", f"@{newest}", "--into",
                            f"{src.name}/restored", "--from", "cold", "--yes")
        assert status == ExitStatus.OK, text
        assert zbak("list", "streams", "--json")[0] == ExitStatus.OK, output[-1]
        assert zbak("status", "--json")[0] == ExitStatus.OK, output[-1]
        if "audit" in cli.LazyGroup().list_commands(None):
            zbak("audit")
        # Failures: their messages and tracebacks are searched too.
        assert zbak("snapshot")[0] == ExitStatus.OK, output[-1]
        assert zbak("archive", cfg=broken)[0] != ExitStatus.OK
        assert "zbak-no-such-bucket" in output[-1]
        assert zbak("restore", data, "--to", "@nope", "--into", f"{src.name}/x", "--from",
                    "cold", "--yes")[0] != ExitStatus.OK
    finally:
        sampler.stop.set()
        sampler.join(5)
        logging.getLogger().removeHandler(records)

    # The cycle really ran: children were seen, streams archived, commands logged.
    assert any(b"zfs\0send" in c or b"zfs\0receive" in c for c in sampler.seen)
    assert any(b"ssh" in c for c in sampler.seen)
    assert any("run [local]" in t or "pipeline stage" in t for t in records.texts)
    assert zfs("get", "-Hp", "-o", "value", "guid", f"{src.name}/restored@{newest}") == \
        zfs("get", "-Hp", "-o", "value", "guid", f"{data}@{newest}")

    assert leaks("\n".join(output), secret_env) == [], "stdout/stderr"
    assert leaks("\n".join(records.texts), secret_env) == [], "log records"
    for cmdline in sampler.seen:
        assert leaks(cmdline, secret_env) == [], f"argv {cmdline[:200]!r}"

    db = sqlite3.connect(tmp_path / "state" / "catalog.sqlite")
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        dump = "\n".join(repr(row) for t in tables for row in db.execute(f'SELECT * FROM "{t}"'))
    finally:
        db.close()
    assert "streams" in tables and dump
    assert leaks(dump, secret_env) == [], "catalog"
    client = s3_server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert any(k.endswith("manifest.json") for k in keys)
    for key in keys:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert leaks(body, secret_env) == [], f"object {key}"
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            assert leaks(path.read_bytes(), secret_env) == [], f"state file {path}"

    assert all(level >= logging.WARNING for level in levels.values()), levels
    wire = [r for r in records.records
            if r.name.split(".")[0] in ("botocore", "boto3", "urllib3", "s3transfer")
            and r.levelno < logging.WARNING]
    assert wire == [], [f"{r.name}: {r.getMessage()[:80]}" for r in wire]
    assert any(r.levelno == logging.DEBUG and r.name.startswith("zrepl_py")
               for r in records.records), "--debug produced no debug records"


# docs/decisions.md#every-child-process-starts-through-spawn: no child process of a whole cycle sees
# a secret, traced by the kernel. Every command an admin types runs as a subprocess under ``strace
# -f -e trace=execve -v``, which prints the whole environment of every program any process of the
# tree executes. zbak itself starts with AWS session credentials, an SMTP password and a webhook URL
# in its environment; every execve after zbak's own (setpriv and its probe, zfs, zpool, ssh, zstd,
# mbuffer, ...) must carry none of those variables nor their values.
_EXECVE = re.compile(r'^(?P<pid>\d+)\s+execve\("(?P<path>[^"]*)", \[(?P<argv>.*?)\], '
                     r'\[(?P<env>.*)\]\) = 0', re.MULTILINE)


def _secrets() -> dict[str, str]:
    return {
        "AWS_SECRET_ACCESS_KEY": "zbakTraceSecret" + secrets.token_hex(12),
        "AWS_SESSION_TOKEN": "zbakTraceToken" + secrets.token_hex(12),
        "ZBAK_TEST_SMTP_PASSWORD": "zbakTraceSmtp" + secrets.token_hex(8),
        "ZBAK_TEST_HOOK_URL": "http://127.0.0.1:9/hook/zbakTraceHook" + secrets.token_hex(8),
    }


def test_no_child_of_a_whole_cycle_is_started_with_a_secret_variable(
        make_pool, sshd, s3_server, tmp_path):
    """docs/reliability.md#r39-no-secrets-in-argv."""
    strace = shutil.which("strace")
    assert strace, "strace is installed by scripts/setup-host.sh"
    src, bak = make_pool(), make_pool()
    data, replica = f"{src.name}/data", f"{bak.name}/replica"
    zfs("create", data)
    mount = Path(zfs("get", "-Hp", "-o", "value", "mountpoint", data).strip())
    bucket = f"zbak-trace-{uuid.uuid4().hex[:10]}"
    s3_server.client().create_bucket(Bucket=bucket)
    config = tmp_path / "zbak.toml"
    config.write_text(cycle_config(tmp_path, sshd, s3_server, bucket, data, replica, extra="""
        keep_chains = 1
        [alerts.webhook]
        url = { env = "ZBAK_TEST_HOOK_URL" }
    """))
    values = _secrets()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ZBAK_"))}
    env.update(values, AWS_ACCESS_KEY_ID="AKIAZBAKTRACE000", AWS_DEFAULT_REGION="us-east-1")
    trace_dir = tmp_path / "trace"
    trace_dir.mkdir()
    commands: list[list[str]] = []

    def zbak(*args: str, ok: bool = True) -> None:
        out = trace_dir / f"{len(commands):02d}-{args[0]}"
        argv = [strace, "-f", "-qq", "-v", "-s", "4096", "-e", "trace=execve", "-o", str(out),
                sys.executable, "-m", "zrepl_py", "--config", str(config), *args]
        commands.append(list(args))
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        if ok:
            assert done.returncode == 0, f"zbak {' '.join(args)}: {done.stdout}{done.stderr}"

    zbak("config", "check")
    zbak("init")
    for step in range(2):
        (mount / f"f{step}.bin").write_bytes(os.urandom(300_000))
        zbak("snapshot")
        zbak("replicate")
        zbak("archive")
        time.sleep(1.1)  # snapshot names have a one-second resolution
    newest = zfs("list", "-H", "-t", "snapshot", "-o", "name", "-s", "createtxg", "-r",
                 data).split()[-1].split("@")[1]
    zbak("restore", data, "--to", f"@{newest}", "--into", f"{src.name}/restored",
         "--from", "cold", "--yes")
    zbak("prune")
    zbak("audit", "--deep")
    zbak("status")
    zbak("restore", data, "--to", "@nope", "--into", f"{src.name}/x", ok=False)  # a failure

    children = 0
    programs: set[str] = set()
    leaks = []
    for trace in sorted(trace_dir.iterdir()):
        calls = list(_EXECVE.finditer(trace.read_text(errors="replace")))
        assert calls, f"{trace.name}: strace saw no execve"
        for call in calls[1:]:  # the first is zbak itself, which reads the secrets
            children += 1
            programs.add(os.path.basename(call["path"]))
            for name, value in values.items():
                if f'"{name}=' in call["env"] or value in call["env"] or value in call["argv"]:
                    leaks.append(f"{trace.name}: {call['path']} [{call['argv'][:120]}] got {name}")
            for name in ("AWS_ACCESS_KEY_ID", "AWS_DEFAULT_REGION"):
                if f'"{name}=' in call["env"]:
                    leaks.append(f"{trace.name}: {call['path']} got {name}")
    assert leaks == []
    # The trace really covered the cycle's children, the setpriv probe among them.
    assert {"zfs", "ssh", "setpriv", "true"} <= programs, programs
    assert children > 30
