"""A master and a backup host on zfs-fuse pools for the failover tests: a source pool with
``data`` (and ``data/kid``), a backup pool whose ``rep`` receives it, a config in push mode
(the target over the real sshd, a plain root login or a ``zbak serve`` forced command) or
pull mode (the source over the sshd), and ``zbak`` run as the admin types it, as a real
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.cli import prop, snapshots, zfs
from support.common import hosts_table
from support.zfs import PoolHandle

ZBAK = Path(sys.executable).with_name("zbak")
TIMEOUT = 600


class Site:
    """The two pools and the config (see the module doc).

    Args:
        make_pool: the fixture.
        sshd: an ``SshServer`` (the session's, or a factory's with a forced command).
        tmp: the test's tmp_path.
        mode: ``push`` (target ``backup:BAK/rep/data``) or ``pull`` (source
            ``master:SRC/data``, target ``local:BAK/rep/data``).
        recursive: a tree ``data`` + ``data/kid``.
        extra: more TOML, appended to ``[jobs.j.replicate]``.
    """

    def __init__(self, make_pool, sshd, tmp: Path, *, mode: str = "push",
                 recursive: bool = True, extra: str = ""):
        self.src: PoolHandle = make_pool()
        self.bak: PoolHandle = make_pool()
        self.tmp, self.mode = tmp, mode
        self.data = f"{self.src.name}/data"
        self.replica = f"{self.bak.name}/rep/data"
        self.live = tmp / "live"
        """Where a failover mounts the replica (``failover_mountpoint``)."""
        zfs("create", self.data)
        if recursive:
            zfs("create", f"{self.data}/kid")
        zfs("create", f"{self.bak.name}/rep")
        host = "master" if mode == "pull" else "backup"
        source = f"master:{self.data}" if mode == "pull" else self.data
        target = f"local:{self.replica}" if mode == "pull" else f"backup:{self.replica}"
        self.target = target
        self.config = tmp / "zbak.toml"
        self.config.write_text(
            f'state_dir = "{tmp / "state"}"\n'
            + hosts_table(host, sshd.host_config(), connect_timeout=5)
            + textwrap.dedent(f"""
                [jobs.j]
                dataset = "{source}"
                recursive = {str(recursive).lower()}
                [jobs.j.snapshot]
                retention = {{ keep_last = 20 }}
                [jobs.j.replicate]
                targets = ["{target}"]
                failover_mountpoint = "{self.live}"
            """) + textwrap.dedent(extra))
        self.count = 0
        done = self.zbak("init", "--no-checks")
        assert done.returncode == 0, done.stdout + done.stderr

    def zbak(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``zbak --config CONFIG ARGS`` as a real process (stdin not a terminal)."""
        return subprocess.run([str(ZBAK), "--config", str(self.config), *args],
                              capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)

    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``zbak ARGS`` that must succeed."""
        done = self.zbak(*args)
        assert done.returncode == 0, f"zbak {' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    def write(self, where: Path, name: str, size: int) -> None:
        """Write ``size`` random bytes to ``where/name``."""
        (where / name).write_bytes(os.urandom(size))

    @property
    def source_dir(self) -> Path:
        """The source dataset's mountpoint."""
        return Path(prop(self.data, "mountpoint"))

    def nightly(self, size: int = 1 << 20) -> int:
        """A change on the source, ``zbak snapshot``, ``zbak replicate``; return the bytes
        replication sent."""
        self.count += 1
        self.write(self.source_dir, f"n{self.count}", size)
        self.ok("snapshot")
        done = self.ok("replicate", "--json")
        return sum(row["bytes"] or 0 for row in json.loads(done.stdout)["rows"])

    def export(self) -> None:
        """The master dies: its pool goes away (exported, as a dead master's disks)."""
        zfs_pool("export", self.src.name)

    def import_(self) -> None:
        """The master's disks come back (imported)."""
        zfs_pool("import", "-d", str(self.src.image.parent), self.src.name)

    def new_disk(self) -> None:
        """The exported master's pool comes back on a new, empty disk (same pool name)."""
        self.src.image.unlink()
        with open(self.src.image, "wb") as image:
            image.truncate(512 << 20)
        zfs_pool("create", "-m", str(self.src.mountpoint), self.src.name, str(self.src.image))

    def run_bytes(self, action: str) -> int:
        """Bytes of the newest ``action`` run (``zbak status --json``)."""
        done = self.ok("status", "--json", "--offline")
        runs = [r for s in json.loads(done.stdout) for r in s["last_runs"]
                if r["action"] == action]
        assert runs, f"no {action} run"
        return int(runs[0]["bytes"])

    def marks(self, dataset: str) -> dict[str, str]:
        """``{dataset: zbak:failover}`` set on ``dataset`` and below."""
        out = zfs("get", "-H", "-r", "-s", "local", "-o", "name,value", "zbak:failover",
                  dataset)
        return dict(line.split("\t") for line in out.splitlines() if "@" not in line)

    def snaps(self, dataset: str) -> list[str]:
        """Short names of ``dataset``'s snapshots, oldest first."""
        return snapshots(dataset)


def zfs_pool(*args: str) -> None:
    """``zpool ARGS`` that must succeed."""
    subprocess.run(["zpool", *args], check=True, capture_output=True, text=True, timeout=120)
