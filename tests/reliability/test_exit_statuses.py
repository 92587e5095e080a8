"""docs/reliability.md#r45-exit-code-table: every ZbakError class gives its ExitStatus through
``main`` in process, and through ``sys.exit`` in a real ``python`` subprocess; each ExitStatus is
also reached by a real command run as ``python -m zrepl_py``."""

from __future__ import annotations

import fcntl
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.cli import zfs

from zrepl_py import errors
from zrepl_py.cli import main
from zrepl_py.errors import ExitStatus

REPO = Path(__file__).resolve().parents[2]


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
    if issubclass(cls, errors.ExtraMissing):
        return cls([("store cold", "boto3", "s3", None)])
    if issubclass(cls, errors.FailedOver):
        return cls("boom", {"tank/replicas/data": "boom"})
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
    """docs/reliability.md#r45-exit-code-table (U): the classes reach every ExitStatus but OK and
    AUDIT_FINDINGS (a result ``zbak audit`` returns, not an error), and each class's ``exit_status``
    is a member of ExitStatus, which ``--help`` lists."""
    statuses = {c.exit_status for c in _error_classes()}
    assert statuses == set(ExitStatus) - {ExitStatus.OK, ExitStatus.AUDIT_FINDINGS}
    assert all(isinstance(c.exit_status, ExitStatus) for c in _error_classes())


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_each_error_class_raised_by_a_command_gives_its_exit_status_in_process(
        cls, monkeypatch, capsys):
    """docs/reliability.md#r45-exit-code-table: ``main`` turns each ZbakError class raised inside a
    command into the class's ExitStatus and prints ``zbak: MESSAGE`` on stderr."""
    from zrepl_py.cli import common

    exc = _build(cls.__name__)

    def context(self):
        raise exc

    # In-process (docs/reliability.md#in-process-hooks-kept): no input raises every class.
    monkeypatch.setattr(common.Invocation, "context", context)
    assert main(["--config", "/nonexistent/zbak.toml", "status"], env={}) == cls.exit_status
    assert capsys.readouterr().err.startswith("zbak: ")


@pytest.mark.slow  # ~50 interpreter start-ups: 40 s of CPU
def test_each_error_class_gives_its_exit_status_as_a_real_subprocess(tmp_path):
    """docs/reliability.md#r45-exit-code-table: the same through ``entry_point`` (``sys.exit``) in a
    real ``python`` process per class, four at a time."""
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
    """docs/reliability.md#r45-exit-code-table without any patching: ``python -m zrepl_py`` exits 0
    (config check), 2 (an invalid config), 3 (the dataset's lock is held by another process), 1
    (snapshot of a dataset that does not exist), 4 (audit of a catalog whose replica vanished) and
    75 is covered by the restore thaw tests (tests/e2e/test_archive_restore_cli.py)."""
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
    from zrepl_py.locking import lock_path

    path = lock_path(tmp_path / "state", f"local:{data}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = zbak("snapshot", "j")
    assert done.returncode == ExitStatus.LOCKED, done.stdout + done.stderr
