"""The pools of a push through ``zbak serve``: a source pool with ``data``, and a backup pool
whose ``replicas`` a forced command serves (the replica of ``data`` lands in
``replicas/data``); and ``Backup``, the push set up through a real sshd forced command."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

from support.cli import zfs
from support.common import replication_config
from support.zfs import PoolHandle
from zrepl_py.proc.openssh import ssh_argv

ZBAK = Path(sys.executable).with_name("zbak")


@dataclasses.dataclass(frozen=True)
class ServedPools:
    """The two pools and the names the tests use; ``data`` and ``root`` exist."""

    src: PoolHandle
    bak: PoolHandle
    data: str
    root: str
    replica: str


def served_pools(make_pool) -> ServedPools:
    """Two fresh pools (``make_pool``), ``SRC/data`` and ``BAK/replicas`` created."""
    src, bak = make_pool(), make_pool()
    pools = ServedPools(src, bak, f"{src.name}/data", f"{bak.name}/replicas",
                        f"{bak.name}/replicas/data")
    zfs("create", pools.data)
    zfs("create", pools.root)
    return pools


class Backup:
    """A source pool, a backup pool whose ``replicas`` root a forced command serves with
    ``serve_options``, the master's config (job ``j`` pushing there), and the intruder's ssh
    (the master's own key)."""

    def __init__(self, make_pool, sshd_factory, tmp: Path, serve_options: str, *,
                 replicate_extra: str = ""):
        pools = served_pools(make_pool)
        self.src, self.data = pools.src, pools.data
        self.root, self.replica = pools.root, pools.replica
        self.tmp, self.log = tmp, tmp / "serve.log"
        self.journal = tmp / "journal" / "floor-journal.tsv"
        command = f"{ZBAK} serve --root {self.root} --log {self.log} {serve_options}"
        if "--keep-newer-than" in serve_options:
            command += f" --floor-journal {self.journal}"
        self.host = sshd_factory(forced_command=command).host_config()
        self.config = tmp / "zbak.toml"
        self.config.write_text(replication_config(
            tmp / "state", "backup", self.host, self.data, [f"backup:{self.replica}"],
            connect_timeout=5, extra=replicate_extra + "[jobs.j.snapshot]\nretention = "
                                                       "{ keep_last = 20 }\n"))
        assert self.zbak("init", "--no-checks").returncode == 0
        self.count = 0

    def zbak(self, *args: str) -> subprocess.CompletedProcess:
        """``zbak --config CONFIG ARGS`` as the admin types it on the master."""
        return subprocess.run([str(ZBAK), "--config", str(self.config), *args],
                              capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL)

    def replicate(self, n: int) -> list[str]:
        """Take ``n`` new zbak snapshots of the source (a file changed before each) and
        replicate; return their short names."""
        names = []
        for _ in range(n):
            self.count += 1
            (self.src.mountpoint / "data" / f"f{self.count}").write_bytes(os.urandom(50_000))
            names.append(f"zbak_202601{self.count:02d}T000000Z")
            zfs("snapshot", f"{self.data}@{names[-1]}")
        done = self.zbak("replicate")
        assert done.returncode == 0, done.stdout + done.stderr
        return names

    def intruder(self, request: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        """Send ``request`` verbatim with the master's key (no local shell involved)."""
        argv = ssh_argv(self.host, known_hosts_default=self.tmp / "known_hosts") + [request]
        return subprocess.run(argv, capture_output=True, input=stdin, timeout=120)

    def refusals(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if " REFUSED " in line]

    def age(self, days: int) -> None:
        """Move every witness of the floor journal ``days`` back: to the floor, as if that
        much time had passed on the backup host since each was recorded."""
        lines = []
        for line in self.journal.read_text().splitlines():
            at, rest = line.split("\t", 1)
            then = dt.datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ") - dt.timedelta(days=days)
            lines.append(f"{then:%Y-%m-%dT%H:%M:%SZ}\t{rest}\n")
        assert lines, "the floor journal has witnesses"
        self.journal.write_text("".join(lines))
