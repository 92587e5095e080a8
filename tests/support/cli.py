"""Helpers shared by tests that drive zfs and the zbak CLI: run ``zfs``, read a property,
run ``zbak`` in-process, list a dataset's snapshots and digest their files."""

from __future__ import annotations

import hashlib
import os
import subprocess
import textwrap
import time
from pathlib import Path

from zrepl_py.cli import main
from zrepl_py.errors import ExitStatus


def zfs(*args: str) -> str:
    """Run ``zfs ARGS`` (the test session's zfs-fuse); return stdout; raise on failure."""
    return subprocess.run(["zfs", *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout


def prop(name: str, what: str) -> str:
    """One property of a dataset or snapshot, parsable (``zfs get -Hp``)."""
    return zfs("get", "-Hp", "-o", "value", what, name).strip()


class Zbak:
    """Runs the real CLI in-process against one config; returns (exit status, stdout, stderr)."""

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
