"""Helpers shared by tests that drive zfs and the zbak CLI: run ``zfs``, read a property,
run ``zbak`` as an admin types it (a real process of the venv's console script), list a
dataset's snapshots and digest their files.

``run_zbak``/``start_zbak``/``Zbak`` start the console script with a scrubbed environment;
``InProcessZbak`` calls ``main()`` in this process and is kept only for tests that need an
in-process hook (its docstring lists them and why).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from zrepl_py.cli import main
from zrepl_py.errors import ExitStatus

ZBAK = Path(sys.executable).with_name("zbak")
"""The ``zbak`` console script of the venv running the tests (``pip install -e``)."""
ZBAK_TIMEOUT = 300.0
"""Seconds a zbak process of a test may run before it is killed and the test fails."""
_PASSED_ON = ("AWS_", "ZBAK_")


def zfs(*args: str) -> str:
    """Run ``zfs ARGS`` (the test session's zfs-fuse); return stdout; raise on failure."""
    return subprocess.run(["zfs", *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout


def prop(name: str, what: str) -> str:
    """One property of a dataset or snapshot, parsable (``zfs get -Hp``)."""
    return zfs("get", "-Hp", "-o", "value", what, name).strip()


def rate_limited_zfs(directory: Path, bytes_per_second: int) -> dict[str, str]:
    """Make ``directory/zfs``, a ``zfs`` whose ``send`` streams go through ``pv -q -L
    bytes_per_second`` (Debian pv: the rate really binds, on a fast host too) and which runs
    every other subcommand as the real one; it appends ``send`` to ``directory/sends.log``
    each time it throttles one. Returns the environment (``PATH`` with ``directory`` first)
    to give ``run_zbak``/``start_zbak`` so that zbak's ``zfs send`` is slowed for real.

    Raises:
        pytest's skip or fail (``support.common.need_binary``): no pv or zfs.
    """
    from support.common import need_binary

    real, pv = need_binary("zfs", "zfs"), need_binary("pv", "pv")
    script = directory / "zfs"
    directory.mkdir(parents=True, exist_ok=True)
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        if [ "$1" = send ]; then
            echo send >> '{directory / "sends.log"}'
            set -o pipefail
            '{real}' "$@" | '{pv}' -q -L {bytes_per_second}
            exit $?
        fi
        exec '{real}' "$@"
    """))
    script.chmod(0o755)
    return {"PATH": f"{directory}:{os.environ.get('PATH', os.defpath)}"}


def wait_for_bytes(state_dir: Path, kind: str, proc: subprocess.Popen, *,
                   at_least: int = 1, timeout: float = 120.0) -> int:
    """Wait until a transfer of ``kind`` (``replicate``, ``archive``, ``restore``) that the
    running zbak ``proc`` publishes for ``zbak status`` (``STATE_DIR/running/KIND-*.json``,
    rewritten about once a second) shows ``at_least`` bytes moved; return that count. What
    a test waits for before it interrupts a transfer "mid-stream", instead of a sleep.

    Raises:
        AssertionError: ``proc`` ended, or ``timeout`` seconds passed first.
    """
    deadline = time.monotonic() + timeout
    running = state_dir / "running"
    while True:
        for path in running.glob(f"{kind}-*.json"):
            try:
                moved = json.loads(path.read_bytes()).get("bytes") or 0
            except (OSError, ValueError):
                continue  # removed as its transfer ended
            if moved >= at_least:
                return moved
        assert proc.poll() is None, f"zbak ended before {at_least} bytes moved"
        assert time.monotonic() < deadline, f"under {at_least} bytes moved in {timeout} s"
        time.sleep(0.05)


def zbak_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a zbak process: ``HOME`` and ``PATH`` of this process, the
    ``AWS_*`` and ``ZBAK_*`` variables the test set (the autouse ``_isolated_env`` fixture
    removed the ambient ones but the suite's ``ZBAK_TEST_STRICT``, which is not passed, so
    only a test or its fixtures, e.g. ``s3_bucket``, put them there), then ``env``."""
    passed = {key: value for key, value in os.environ.items()
              if key.startswith(_PASSED_ON) and key != "ZBAK_TEST_STRICT"}
    return {"HOME": os.environ["HOME"], "PATH": os.environ.get("PATH", os.defpath),
            **passed, **(env or {})}


def zbak_argv(*args: str, prefix: Sequence[str] = ()) -> list[str]:
    """``[*prefix, ZBAK, *args]``: ``prefix`` runs zbak under another program (``strace``,
    ``setpriv``)."""
    return [*prefix, str(ZBAK), *args]


def exit_status(code: int) -> ExitStatus | int:
    """``code`` as an ``ExitStatus`` when it is one, else the int (126 of ``zbak serve``,
    -9 for a process killed by SIGKILL)."""
    try:
        return ExitStatus(code)
    except ValueError:
        return code


@dataclasses.dataclass(frozen=True)
class Ran:
    """What a finished zbak process left: exit status, stdout and stderr (UTF-8 decoded,
    undecodable bytes as ``\\xNN``). Unpacks as ``status, out, err``; also answers to
    ``subprocess.CompletedProcess``'s ``returncode``, ``stdout`` and ``stderr``."""

    status: ExitStatus | int
    out: str
    err: str

    def __iter__(self) -> Iterator[object]:
        return iter((self.status, self.out, self.err))

    @property
    def returncode(self) -> int:
        """``status`` as ``subprocess.CompletedProcess`` names it."""
        return int(self.status)

    @property
    def stdout(self) -> str:
        """``out`` as ``subprocess.CompletedProcess`` names it."""
        return self.out

    @property
    def stderr(self) -> str:
        """``err`` as ``subprocess.CompletedProcess`` names it."""
        return self.err

    def __getitem__(self, index: int) -> object:
        return (self.status, self.out, self.err)[index]


def start_zbak(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None,
               prefix: Sequence[str] = (), **popen: object) -> subprocess.Popen:
    """Start ``zbak ARGS`` as a process (stdin from /dev/null, stdout and stderr piped
    unless ``popen`` says otherwise); the caller waits for it or kills it. ``env`` is added
    to ``zbak_env()``."""
    popen = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE,
             "stderr": subprocess.PIPE, **popen}
    return subprocess.Popen(zbak_argv(*args, prefix=prefix), env=zbak_env(env), cwd=cwd,
                            **popen)  # type: ignore[call-overload]


def run_zbak(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None,
             prefix: Sequence[str] = (), timeout: float = ZBAK_TIMEOUT) -> Ran:
    """Run ``zbak ARGS`` as an admin types it and wait for it (see ``start_zbak``).

    Raises:
        AssertionError: it ran longer than ``timeout`` seconds (it is killed first; the
            message holds what it printed).
    """
    return _finish(start_zbak(*args, env=env, cwd=cwd, prefix=prefix), args, timeout)


CRASH_RUNNER = Path(__file__).with_name("crash_runner.py")


def faulty_zbak(*args: str, env: Mapping[str, str] | None = None,
                timeout: float = ZBAK_TIMEOUT) -> Ran:
    """Run ``zbak ARGS`` as a process under ``support/crash_runner.py``, which wraps the
    stores and catalog writes of the real CLI: ``env`` gives its ``ZBAK_FAULT_*`` settings
    (see its docstring), added to ``zbak_env()``.

    Raises:
        AssertionError: as ``run_zbak``.
    """
    proc = subprocess.Popen([sys.executable, str(CRASH_RUNNER), *args], env=zbak_env(env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    return _finish(proc, args, timeout)


def _finish(proc: subprocess.Popen, args: Sequence[str], timeout: float) -> Ran:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"zbak {' '.join(args)} ran over {timeout} s: "
                             f"{_text(out)[-2000:]}{_text(err)[-2000:]}") from None
    return Ran(exit_status(proc.returncode), _text(out), _text(err))


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


class Zbak:
    """Runs ``zbak --config CONFIG ARGS`` as a process (``run_zbak``); ``run(*args)``
    returns a ``Ran`` (``status, out, err``).

    Args:
        config: the config file.
        capsys: unused (processes write to pipes); taken so runners built for the
            in-process ``InProcessZbak`` keep their call.
        env: variables added to the process's environment (``zbak_env``).
    """

    def __init__(self, config: Path, capsys: object = None, *,
                 env: Mapping[str, str] | None = None):
        self.config, self.env = config, dict(env or {})

    def __call__(self, *args: str) -> Ran:
        return run_zbak("--config", str(self.config), *args, env=self.env)


class InProcessZbak:
    """Runs the CLI's ``main()`` in this process against one config; returns (exit status,
    stdout, stderr) as captured by ``capsys``.

    Only for a test that needs an in-process hook around a real command, each saying why
    beside its use: a fault injected at an exact point inside a run, or an in-process
    observer (docs/reliability.md lists them under their cases). Everything else runs
    ``zbak`` as a process (``Zbak``, ``run_zbak``).
    """

    def __init__(self, config: Path, capsys):
        self.config, self.capsys = config, capsys

    def __call__(self, *args: str) -> tuple[ExitStatus, str, str]:
        self.capsys.readouterr()
        status = main(["--config", str(self.config), *args], env={})
        out, err = self.capsys.readouterr()
        return status, out, err


def initialised(tmp: Path, body: str, capsys, *, checks: bool = False) -> Zbak:
    """Write ``tmp/zbak.toml`` (state dir ``tmp/state``, then the TOML ``body``, dedented),
    run ``zbak init`` (with ``checks``: dialling every host and store; they must pass) and
    return the CLI runner for it."""
    config = tmp / "zbak.toml"
    config.write_text(f'state_dir = "{tmp / "state"}"\n' + textwrap.dedent(body))
    run = Zbak(config, capsys)
    status, out, err = run("init", *([] if checks else ["--no-checks"]))
    assert status == ExitStatus.OK, out + err
    return run


def snapshots(dataset: str) -> list[str]:
    """Short names of ``dataset``'s snapshots, oldest first (by createtxg)."""
    out = zfs("get", "-Hp", "-r", "-o", "name,property,value", "createtxg", dataset)
    rows = [line.split("\t") for line in out.splitlines()]
    return [n.split("@")[1] for v, n in sorted((int(v), n) for n, _, v in rows
                                              if n.startswith(dataset + "@"))]


def exists(dataset: str) -> bool:
    """True when ``zfs list DATASET`` finds it."""
    return subprocess.run(["zfs", "list", dataset], capture_output=True).returncode == 0


def gone(name: str, seconds: float = 10) -> bool:
    """``name`` does not exist, or stops existing within ``seconds``: zfs-fuse's daemon
    cleans up a cancelled receive after the killed ``zfs receive`` process is gone (seen
    0.22 s later under load), where OpenZFS does it inside the receive's ioctl. A receive
    that completed never goes."""
    deadline = time.monotonic() + seconds
    while exists(name):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def settled_snapshots(dataset: str, *, quiet: float = 2.0, limit: float = 30.0) -> list[str]:
    """The snapshots of ``dataset`` once they stopped changing for ``quiet`` seconds: zfs-fuse
    receives in its daemon, which may still commit the snapshot in flight after a killed
    zbak's ``zfs receive`` got its SIGTERM (the rerun must then go on from that one)."""
    deadline = time.monotonic() + limit
    seen, since = snapshots(dataset), time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, f"{dataset} kept changing: {seen}"
        time.sleep(0.2)
        now = snapshots(dataset)
        if now != seen:
            seen, since = now, time.monotonic()
    return seen


def write_synced(path: Path, data: bytes) -> None:
    """Write ``path`` (its directory made) and fsync it: zfs-fuse sees page-cached FUSE
    writes only once they are flushed, so a snapshot taken next holds them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
        os.fsync(handle.fileno())


def tree_digest(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file below ``root``."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def content_of(snapshot: str, pool: str, tag: str) -> dict[str, str]:
    """The files of a snapshot, read through a temporary clone (zfs-fuse has no .zfs)."""
    clone = f"{pool}/cmp-{tag}"
    zfs("clone", snapshot, clone)
    try:
        return tree_digest(Path(prop(clone, "mountpoint")))
    finally:
        for _ in range(20):
            if subprocess.run(["zfs", "destroy", clone], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)


def restored_content(dataset: str) -> dict[str, str]:
    """The files of a restored dataset (mounted first: restores receive with ``-u``)."""
    subprocess.run(["zfs", "mount", dataset], capture_output=True)
    return tree_digest(Path(prop(dataset, "mountpoint")))


def file_archive_config(tmp: Path, data: str, *, volume_size: str | None = None,
                        archive: str = "", extra: str = "") -> tuple[Path, Path]:
    """The archive set-up most archive, crash and disaster tests share: write ``tmp/zbak.toml``
    with state dir ``tmp/state``, a ``file://`` store ``cold`` in a new directory
    ``tmp/store`` (``volume_size`` when given) and job ``data`` archiving dataset ``data`` to
    it. ``archive``: more lines of ``[jobs.data.archive]``; ``extra``: more TOML at the end.

    Returns:
        ``(config, store)``.
    """
    store = tmp / "store"
    store.mkdir(mode=0o700)
    size = f'volume_size = "{volume_size}"' if volume_size else ""
    config = tmp / "zbak.toml"
    config.write_text(f'state_dir = "{tmp / "state"}"\n' + textwrap.dedent(f"""
        [stores.cold]
        url = "file://{store}"
        {size}
        [jobs.data]
        dataset = "{data}"
        [jobs.data.archive]
        store = "cold"
        {archive}
    """) + textwrap.dedent(extra))
    return config, store
