"""RELIABILITY cases 39, 41, 44 and 45 where the older test files left a level uncovered.

* 39: no child process (zfs, ssh, rsync, zstd) inherits a secret environment variable; a
  secret-looking command-line option is refused with a hint.
* 41: after a real cycle run under umask 000, every file zbak made in its state directory is
  0600 and every directory 0700.
* 44: every key of the config schema is documented in README.md or an example config.
* 45: every ZbakError class gives its ExitStatus through ``main`` in process, and through
  ``sys.exit`` in a real ``python`` subprocess; each ExitStatus is also reached by a real
  command run as ``python -m zrepl_py``.
"""

from __future__ import annotations

import fcntl
import inspect
import os
import re
import stat
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pydantic
import pytest
from support.cli import Zbak, zfs

from zrepl_py import errors
from zrepl_py.cli import main
from zrepl_py.config import schema
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
    """RELIABILITY 39: ``LocalExecutor`` (every zfs, zpool, rsync, mkdir zbak runs locally)
    starts its child with AWS_*, password/token variables and the config's secret variables
    removed, and everything else (PATH, SSH_AUTH_SOCK, locale) kept."""
    seen = _environ(LocalExecutor().run(["env", "-0"]).stdout)
    assert not set(SECRETS) & set(seen), sorted(set(SECRETS) & set(seen))
    for key, value in KEPT.items():
        assert seen[key] == value
    assert seen["PATH"] == os.environ["PATH"]
    assert os.environ["AWS_SECRET_ACCESS_KEY"]  # zbak itself (boto3) still has them


def test_pipeline_stages_run_without_any_secret_environment_variable(secret_environment, tmp_path):
    """RELIABILITY 39: every stage of ``run_pipeline`` (zfs send, zstd, pv, ssh and the ssh
    connection master it may leave running) starts without the secret variables."""
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
    """RELIABILITY 39 (U): the name rule of ``child_env``."""
    assert is_secret_name(name) is secret
    assert (name in child_env({name: "x"})) is not secret


# --- RELIABILITY 41: file modes ------------------------------------------------------------


@pytest.mark.zfs
def test_every_file_zbak_makes_in_its_state_dir_is_private_whatever_the_umask(
        make_pool, tmp_path, capsys):
    """RELIABILITY 41: under umask 000 a real cycle (init, snapshot, replicate to a local
    replica and to an rsync directory, archive to a ``file://`` store, restore, status,
    audit) leaves the state directory 0700 and every file zbak created under it (catalog,
    its journal files, locks, capability cache, spool) 0600, every directory 0700."""
    src = make_pool()
    data = f"{src.name}/data"
    zfs("create", data)
    mount = Path(zfs("get", "-Hp", "-o", "value", "mountpoint", data).strip())
    (mount / "f").write_bytes(os.urandom(100_000))
    state = tmp_path / "state"
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{state}"
        [stores.cold]
        url = "file://{tmp_path / 'store'}"
        volume_size = "1MiB"
        [jobs.j]
        dataset = "{data}"
        [jobs.j.replicate]
        targets = ["local:{src.name}/replica", "local:{tmp_path / 'tree'}"]
        [jobs.j.archive]
        store = "cold"
    """))
    zbak = Zbak(config, capsys)
    old = os.umask(0)
    try:
        for args in (["init"], ["snapshot"], ["replicate"], ["archive"], ["status", "--json"],
                     ["audit"]):
            status, out, err = zbak(*args)
            assert status == ExitStatus.OK, (args, out, err)
        snap = zfs("list", "-H", "-t", "snapshot", "-o", "name", "-r", data).split()[-1]
        status, out, err = zbak("restore", data, "--to", "@" + snap.split("@")[1], "--into",
                                f"{src.name}/restored", "--from", "cold", "--yes")
        assert status == ExitStatus.OK, out + err
    finally:
        os.umask(old)
    made = [state, *state.rglob("*")]
    assert any(p.name.startswith("catalog") for p in made) and len(made) > 3, made
    wrong = []
    for path in made:
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode) and stat.S_IMODE(mode) != 0o700:
            wrong.append((str(path), oct(stat.S_IMODE(mode))))
        elif stat.S_ISREG(mode) and stat.S_IMODE(mode) != 0o600:
            wrong.append((str(path), oct(stat.S_IMODE(mode))))
        elif stat.S_ISSOCK(mode) and stat.S_IMODE(mode) & 0o077:
            wrong.append((str(path), oct(stat.S_IMODE(mode))))
    assert wrong == []


# --- RELIABILITY 44: every config key documented -------------------------------------------


def _keys(model: type[pydantic.BaseModel], seen: set[type]) -> set[str]:
    """Every field name of ``model`` and of the models its fields hold, recursively."""
    if model in seen:
        return set()
    seen.add(model)
    found: set[str] = set()
    for name, field in model.model_fields.items():
        found.add(field.alias or name)
        stack = [field.annotation]
        while stack:
            annotation = stack.pop()
            if inspect.isclass(annotation) and issubclass(annotation, pydantic.BaseModel):
                found |= _keys(annotation, seen)
            stack.extend(typing.get_args(annotation))
    return found


def test_every_key_of_the_config_schema_is_documented_in_the_readme_or_an_example():
    """RELIABILITY 44: each key a config may hold appears in README.md (as ``key``) or in
    an examples/*.toml file (as ``key =``, possibly commented out), so no setting is hidden."""
    readme = (REPO / "README.md").read_text()
    examples = "\n".join(p.read_text() for p in sorted((REPO / "examples").glob("*.toml")))
    undocumented = sorted(
        key for key in _keys(schema.Config, set())
        if not re.search(rf"`[^`\n]*\b{key}\b[^`\n]*`", readme)
        and not re.search(rf"\b{key} =", examples)
    )
    assert undocumented == []


# --- RELIABILITY 45: the exit-code table -----------------------------------------------------


BUILD = """
import inspect
from zrepl_py import errors
from zrepl_py.proc.pipeline import StageResult


def build(name):
    cls = getattr(errors, name)
    if issubclass(cls, errors.PipelineFailed):
        culprit = StageResult(name="send", argv=("zfs", "send"), returncode=1, stderr="boom",
                              broken_pipe=False)
        return cls((culprit,), culprit)
    if issubclass(cls, errors.CommandFailed):
        return cls(["zfs", "list"], 1, "boom")
    if issubclass(cls, errors.ConfigError):
        return cls("/etc/zbak/zbak.toml", [("jobs.j.dataset", "boom")])
    if issubclass(cls, errors.StoreError):
        return cls("boom", store="cold", key="k")
    return cls("boom")
"""

DRIVER = BUILD + """
import sys
from zrepl_py.cli import common, entry_point

exc = build(sys.argv[1])


def context(self):
    raise exc


common.Invocation.context = context
sys.argv = ["zbak", "--config", "/nonexistent/zbak.toml", "status"]
entry_point()
"""


def _error_classes() -> list[type[errors.ZbakError]]:
    return sorted((c for c in vars(errors).values()
                   if inspect.isclass(c) and issubclass(c, errors.ZbakError)),
                  key=lambda c: c.__name__)


def _build(name: str) -> errors.ZbakError:
    namespace: dict = {}
    exec(BUILD, namespace)  # the same builder the subprocess runs
    return namespace["build"](name)


def test_the_error_table_covers_every_status_and_every_class_is_a_zbak_error():
    """RELIABILITY 45 (U): the classes reach every ExitStatus but OK and AUDIT_FINDINGS (a
    result ``zbak audit`` returns, not an error), and each class's ``exit_status`` is a
    member of ExitStatus, which ``--help`` lists."""
    statuses = {c.exit_status for c in _error_classes()}
    assert statuses == set(ExitStatus) - {ExitStatus.OK, ExitStatus.AUDIT_FINDINGS}
    assert all(isinstance(c.exit_status, ExitStatus) for c in _error_classes())


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_each_error_class_raised_by_a_command_gives_its_exit_status_in_process(
        cls, monkeypatch, capsys):
    """RELIABILITY 45: ``main`` turns each ZbakError class raised inside a command into the
    class's ExitStatus and prints ``zbak: MESSAGE`` on stderr."""
    from zrepl_py.cli import common

    exc = _build(cls.__name__)

    def context(self):
        raise exc

    monkeypatch.setattr(common.Invocation, "context", context)
    assert main(["--config", "/nonexistent/zbak.toml", "status"], env={}) == cls.exit_status
    assert capsys.readouterr().err.startswith("zbak: ")


@pytest.mark.slow  # ~50 interpreter start-ups: 40 s of CPU
def test_each_error_class_gives_its_exit_status_as_a_real_subprocess(tmp_path):
    """RELIABILITY 45: the same through ``entry_point`` (``sys.exit``) in a real ``python``
    process per class, four at a time."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    classes = _error_classes()
    wrong = {}
    for start in range(0, len(classes), 4):
        batch = {cls: subprocess.Popen([sys.executable, str(driver), cls.__name__],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       cwd=REPO)
                 for cls in classes[start:start + 4]}
        for cls, proc in batch.items():
            _, err = proc.communicate(timeout=300)
            if proc.returncode != cls.exit_status or not err.startswith(b"zbak: "):
                wrong[cls.__name__] = (proc.returncode, err[-300:])
    assert wrong == {}


@pytest.mark.zfs
def test_every_exit_status_is_returned_by_a_real_command_run_as_python_m_zrepl_py(
        zpool, tmp_path):
    """RELIABILITY 45 without any patching: ``python -m zrepl_py`` exits 0 (config check),
    2 (an invalid config), 3 (the dataset's lock is held by another process), 1 (snapshot of
    a dataset that does not exist), 4 (audit of a catalog whose replica vanished) and 75
    is covered by the restore thaw tests (tests/e2e/test_archive_restore_cli.py)."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [jobs.j]
        dataset = "{data}"
        [jobs.j.replicate]
        targets = ["local:{zpool.name}/replica"]
        [jobs.gone]
        dataset = "{zpool.name}/no-such-dataset"
    """))
    bad = tmp_path / "bad.toml"
    bad.write_text('[jobs.j]\ndataset = "-bad"\n')

    def zbak(*args: str, cfg: Path = config) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "zrepl_py", "--config", str(cfg), *args],
                              capture_output=True, text=True, timeout=300, cwd=REPO)

    assert zbak("config", "check").returncode == ExitStatus.OK
    assert zbak("config", "check", cfg=bad).returncode == ExitStatus.USAGE
    assert zbak("init", "--no-checks").returncode == ExitStatus.OK
    assert zbak("snapshot", "gone").returncode == ExitStatus.FAILED
    assert zbak("snapshot", "j").returncode == ExitStatus.OK
    assert zbak("replicate", "j").returncode == ExitStatus.OK
    zfs("destroy", "-r", f"{zpool.name}/replica")  # test-owned replica, gone behind zbak's back
    done = zbak("audit", "j")
    assert done.returncode == ExitStatus.AUDIT_FINDINGS, done.stdout + done.stderr
    from zrepl_py.locking import lock_path  # noqa: PLC0415

    path = lock_path(tmp_path / "state", f"local:{data}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = zbak("snapshot", "j")
    assert done.returncode == ExitStatus.LOCKED, done.stdout + done.stderr


# --- RELIABILITY 39: secret-looking options ---------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["archive", "--s3-secret-key", "VALUE42"], ["--aws-secret-access-key=VALUE42", "archive"],
    ["init", "--password", "VALUE42"], ["status", "--session-token", "VALUE42"],
    ["-passphrase", "VALUE42"], ["archive", "--access-key", "VALUE42"],
    ["restore", "--api-key=VALUE42"],
])
def test_secret_looking_options_are_refused_with_a_hint_and_without_their_value(argv):
    """RELIABILITY 39 (U): ``refuse_secret_options`` raises UsageError (exit 2) naming the
    option and where secrets go instead, never echoing the value."""
    from zrepl_py.cli.common import refuse_secret_options

    with pytest.raises(errors.UsageError) as caught:
        refuse_secret_options(argv)
    assert caught.value.exit_status == ExitStatus.USAGE
    assert "AWS chain" in str(caught.value) and "{ env" in str(caught.value)
    assert "VALUE42" not in str(caught.value)


def test_zbak_refuses_a_secret_option_with_exit_2_in_process_and_as_a_subprocess(capsys):
    """RELIABILITY 39 (E): the refusal is wired into ``main``, before click parses anything,
    and the value never reaches the terminal."""
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
    """RELIABILITY 39 (U): no false alarm on zbak's own options or on operands."""
    from zrepl_py.cli.common import refuse_secret_options

    refuse_secret_options(argv)
