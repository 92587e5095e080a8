#!/usr/bin/env python3
"""zbak replication against the raw pipe and syncoid, side by side in one run (by hand, not CI).

Goals (docs/decisions.md#datasets-of-a-tree-replicate-several-at-once), zbak timed as the user runs
it (``zbak replicate`` as a subprocess): the first replication of a tree of 100 datasets >= 3x
faster than ``syncoid -r``; a nightly cycle over that tree with small changes faster than ``syncoid
-r`` and than a shell loop of raw pipes; a 256 MiB incremental >= 0.97x the raw pipe; a no-op cycle
< 2 s. Earlier: a full send >= 0.97x the raw pipe.

Cases (``--cases``, default all), on the same two pools and the same data, every tool
through the same sshd on 127.0.0.1 (the ssh target path):

- ``full``: one dataset with ``--size-mb`` MiB of random (incompressible) data and one
  snapshot, sent whole to a fresh target dataset;
- ``incremental``: ``--incr-mb`` MiB of new random data between two snapshots; a fresh target
  per run is first seeded with the base snapshot by an untimed local ``send | receive -u``
  and given zbak's replica properties (so zbak repairs nothing a nightly run would not);
- ``tree`` (tree initial): a root plus ``--datasets`` children with 4 KiB each and one
  recursive snapshot, replicated to a new target by each tool every rep (raw ``zfs send -R |
  ssh zfs receive -u``, zbak, ``syncoid -r``); the last rep's replicas are kept for the next
  cases (without ``tree``, one run each makes them, shown as such);
- ``nightly``: each rep writes 16 KiB of new random data into every dataset of the tree and
  takes ``zfs snapshot -r``; each tool then brings its own replica up to it: zbak, ``syncoid
  -r`` (through the shim, and stock to show its failure) and a shell loop of raw pipes, one
  ``zfs send -I | ssh HOST zfs receive -u`` per dataset as an admin would type it (a new ssh
  connection each), on the ``send -R`` replica;
- ``noop``: each tool again against its own up-to-date replica, so there is nothing to send.

Tools: the raw pipe (``zfs send [-I BASE] SNAP | ssh -i KEY -p PORT root@127.0.0.1 zfs receive
TARGET``, as an admin types it: ssh's own cipher order, no buffer); ``raw, zbak's path``, the
same pipe with zbak's data path (its ssh argv, which puts AES-GCM first on this AES-NI CPU, and
its 64 MiB mbuffer before ``zfs receive``; ``proc.openssh``, ``transport.stages``), which
isolates zbak's fixed cost; zbak through its CLI (``python -m zrepl_py --config CFG replicate
JOB`` as a subprocess, compression "none", ``concurrency`` its default, and each run logging in
afresh: the ssh master an earlier run left, which stays 60 s, is ended first); for the
incremental also ``zbak, ssh master up``, the same run with zbak's ssh master started and
logged in beforehand, untimed, which shows how much of zbak's fixed cost is the login the raw
pipe pays too; syncoid 2.1.0 (Debian ``sanoid``) with ``--no-sync-snap --compress=none`` (same
bytes as the others, no lzop on random data; its mbuffer and pv stay as it chooses them).
Syncoid 2.1.0 on zfs-fuse can only replicate to a NEW target: it lists snapshots with ``zfs get
-Hpd 1 -t snapshot``, zfs-fuse has no ``get -t``, and its fallback for a remote host prefixes
the ssh command twice (``ssh ... ssh ... root@HOST zfs get``, syncoid
``getsnaps``/``getsnapsfallback``), so every later run fails. Stock syncoid is tried anyway and
its failure reported; ``syncoid+shim`` is syncoid with a ``zfs`` wrapper first on its PATH,
locally and on a second sshd (``SetEnv PATH=``), that turns ``get -t TYPE`` into a plain
``get`` filtered to that type: the only way to time syncoid's incremental and no-op paths here;
the wrapper costs one extra bash per zfs command, so it flatters zbak slightly.

After one untimed warm-up transfer, each case runs ``--reps`` times, tools interleaved and
their order rotated per repetition; the table gives every run, the median, the spread
(max - min), MB/s (10^6 bytes of send stream per second) and the ratio: throughput vs the
raw pipe (raw median / tool median) for the transfer cases, speed-up vs syncoid (syncoid
median / tool median) for the tree cases (stock syncoid for the first replication,
syncoid+shim for the others). The load average (1/5/15 min) is printed before each case and
at the end. ``zbak (pipe only)`` is the sum of the pipeline times zbak logs ("received ... in
X s"), to separate its fixed cost from the data path: not a figure a user sees, it gets no
ratio. Each goal is then judged: met, MISSED, MISSED with the failures when every zbak run
of its case failed, or not measured (the peer's runs failed, or the case was not run). Every received snapshot's guid is
checked against the source's; a profile of one ``zbak --debug`` no-op cycle (commands run,
by kind) is printed at the end, and with ``--timeline`` one ``zbak --debug`` run of the
incremental whose log lines carry the seconds since the interpreter started (where zbak's
time goes around the pipeline) and one of the tree initial, summed up the same way.

zbak runs as an installed package would: with compiled bytecode (``compileall`` into a
private ``PYTHONPYCACHEPREFIX`` under the work directory, since this development venv's
editable install has none and the environment may set ``PYTHONDONTWRITEBYTECODE``), so its
start-up is what a user pays. Its capability cache (``<state_dir>/capabilities``) is warm
after the first run, as it is for a scheduled job. The start-up of ``--version``,
``--help`` and ``replicate --help`` is printed with the table.

Every remote command of every tool starts a login user's shell over ssh; bash run by sshd
reads ``~/.bashrc``, and root's here runs ``pyenv init`` (+0.13 s per remote command, measured:
``ssh HOST true`` 0.35 s with it, 0.21 s without), a cost of this development machine that
would weigh on the tools in proportion to their remote command count. The test bed's sshd sets
``SHLVL=1``, so bash skips it (tests/support/sshd.py); the figures below were measured with the
file hidden by a bind mount, the same effect.

Measured 2026-11-21 (2 vCPUs; docs/performance.md), after zbak's data path took AES-GCM and
the receive buffer: full 1 GiB 1.13x, incremental 1 GiB 1.16x the raw pipe (5 reps; syncoid
0.93x and, with the shim, 0.84x); full 512 MiB 1.02x, incremental 256 MiB 0.76x (3 reps).
``raw, zbak's path`` is 1.41-1.50x the raw pipe; zbak's fixed cost against it, 1.1-1.4 s per
run, is what remains. No-op cycle over 101 datasets 9-12x faster than syncoid+shim. The tree
cases: docs/performance.md#replication. Before (plain ChaCha20-Poly1305, no buffer): 512 MiB 0.75x, 256 MiB
0.58x, 8 GiB 0.956x / 0.980x.

Runs as root on the test bed of tests/support: a private mount namespace with its own
zfs-fuse daemon (pools on sparse files in a temporary directory, about 3 x (size + incr) MiB
of real disk at most) and sshd on 127.0.0.1, all removed at the end. Usage::

    .venv/bin/python benchmarks/replication.py [--size-mb 512] [--incr-mb N] [--reps 3]
        [--datasets 100] [--cases full,incremental,tree,nightly,noop]
        [--timeline] [--quick] [--bandwidth-limit BYTES]

``--bandwidth-limit`` gives zbak's jobs a ``bandwidth_limit`` (the other tools run without
one): set high enough that the link never fills, the tree case shows what sharing one limit
among concurrent pipelines costs (``proc.ratelimit``; measured 2026-11-26 with 1 GB/s, see
docs/performance.md).
"""

from __future__ import annotations

import argparse
import ast
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from support import sshd as testbed_sshd
from support.common import free_port
from support.tree import snapshot_guids
from zfsbench import (
    destroy,
    guid,
    last_line,
    load,
    private_zfs_fuse,
    rotate,
    sh,
    target_line,
)

from zrepl_py.config.loading import load_config
from zrepl_py.config.replicate import ReplicateConfig
from zrepl_py.proc.openssh import remote_command, remote_pipeline, ssh_argv
from zrepl_py.transport.stages import Side, mbuffer_argv

MIB = 1024 * 1024
RECEIVE_BUFFER = ReplicateConfig.model_fields["receive_buffer"].default  # zbak's default
RAW_ZBAK_PATH = "raw, zbak's path"
PIPE_ONLY = "zbak (pipe only)"
"""The summed pipeline seconds zbak logs: a view inside zbak's run, not a figure a user
sees, so the table gives it no ratio."""
ZBAK_MASTER_UP = "zbak, ssh master up"
SYNCOID = "/usr/sbin/syncoid"
PYTHON = sys.executable
RECEIVED = re.compile(r"received .*: (\d+) bytes in ([0-9.]+) s")
REPLICA_PROPERTIES = ("canmount=noauto", "readonly=on")  # what zbak gives a replica
CASES = ("full", "incremental", "tree", "nightly", "noop")

SHIM = textwrap.dedent("""\
    #!/bin/bash
    # zfs-fuse has no `zfs get -t TYPE` (syncoid 2.1.0 needs it): drop -t, keep rows of TYPE.
    if [ "$1" = get ]; then
      args=(); type=
      while [ $# -gt 0 ]; do
        if [ "$1" = -t ]; then type=$2; shift 2; continue; fi
        args+=("$1"); shift
      done
      case $type in
        "") exec /usr/sbin/zfs "${args[@]}" ;;
        snapshot) /usr/sbin/zfs "${args[@]}" | awk -F'\\t' 'index($1, "@")'
                  exit ${PIPESTATUS[0]} ;;
        *) /usr/sbin/zfs "${args[@]}" | awk -F'\\t' 'index($1, "#")'
           exit ${PIPESTATUS[0]} ;;
      esac
    fi
    exec /usr/sbin/zfs "$@"
""")


class Failed(Exception):
    """A tool run that did not complete (its exit status and last stderr line)."""


class Bench:
    """Pools, data, sshds and the three tools; ``run_*`` return wall seconds of one run."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args = args
        self.work = workdir
        tag = os.getpid()
        self.src, self.dst = f"zbs{tag}", f"zbd{tag}"
        self.serial = 0
        self.servers: list = []
        self.shim_sshd: subprocess.Popen | None = None
        self.kept_tree: str | None = None  # zbak's replica of the tree, for the profile
        self.timelines: list[str] = []  # --timeline's, made during the cases

    # -- set-up ------------------------------------------------------------------

    def make_pools(self) -> None:
        size = 3 * (self.args.size_mb + self.args.incr_mb) + 1024
        for pool in (self.src, self.dst):
            image = self.work / f"{pool}.img"
            sh("truncate", "-s", f"{size}M", str(image))
            sh("zpool", "create", "-m", str(self.work / pool), pool, str(image))

    def write_random(self, dataset: str, filename: str, mib: int) -> None:
        with open(self.work / dataset / filename, "wb") as handle:
            for _ in range(mib):
                handle.write(os.urandom(MIB))

    def make_data(self) -> None:
        a = self.args
        sh("zfs", "create", f"{self.src}/full")
        self.write_random(f"{self.src}/full", "data.bin", a.size_mb)
        sh("zfs", "snapshot", f"{self.src}/full@full")
        sh("zfs", "create", f"{self.src}/inc")
        self.write_random(f"{self.src}/inc", "base.bin", 8)
        sh("zfs", "snapshot", f"{self.src}/inc@base")
        self.write_random(f"{self.src}/inc", "new.bin", a.incr_mb)
        sh("zfs", "snapshot", f"{self.src}/inc@incr")
        sh("zfs", "create", f"{self.src}/tree")
        for i in range(a.datasets):
            child = f"{self.src}/tree/d{i:03d}"
            sh("zfs", "create", child)
            with open(self.work / child / "f", "wb") as handle:
                handle.write(os.urandom(4096))
        sh("zfs", "snapshot", "-r", f"{self.src}/tree@s1")
        self.stream = {
            "full": self.stream_size(["zfs", "send", f"{self.src}/full@full"]),
            "incremental": self.stream_size(
                ["zfs", "send", "-I", f"{self.src}/inc@base", f"{self.src}/inc@incr"]),
        }

    def stream_size(self, send: list[str]) -> int:
        """Bytes of a send stream (also warms the cache the first timed run would)."""
        sender = subprocess.Popen(send, stdout=subprocess.PIPE)
        total = 0
        assert sender.stdout is not None
        while chunk := sender.stdout.read(MIB):
            total += len(chunk)
        if sender.wait() != 0:
            raise RuntimeError(f"{send} failed")
        return total

    def start_sshds(self) -> None:
        key = self.work / "id_ed25519"
        testbed_sshd._keygen(key, "zbak-bench")
        server = testbed_sshd._Sshd(self.work / "sshd", key)
        self.servers.append(server)
        self.server = server.start()
        self.host = self.server.host_config()
        self.ssh = ssh_argv(self.host, known_hosts_default=self.work / "kh")
        # A second sshd, same host key, whose sessions find the zfs shim first on PATH.
        shim_dir = self.work / "shim"
        shim_dir.mkdir()
        (shim_dir / "zfs").write_text(SHIM)
        (shim_dir / "zfs").chmod(0o755)
        self.shim_path = f"{shim_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        self.shim_port = free_port()
        config = self.work / "sshd-shim.conf"
        lines = [line for line in self.server.config_file.read_text().splitlines()
                 if not line.startswith(("Port ", "PidFile "))]
        lines += [f"Port {self.shim_port}", f'PidFile "{self.work / "sshd-shim.pid"}"',
                  f"SetEnv PATH={shim_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
                  ":/sbin:/bin"]
        config.write_text("\n".join(testbed_sshd.joined_setenv(lines)) + "\n")
        log = open(self.work / "sshd-shim.log", "ab")
        self.shim_sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        pub = self.server.host_key_pub
        self.known_hosts = self.work / "known_hosts_all"
        self.known_hosts.write_text(testbed_sshd._known_hosts_line(self.server.port, pub)
                                    + testbed_sshd._known_hosts_line(self.shim_port, pub))
        for _ in range(100):
            probe = subprocess.run(self.ssh_to(self.shim_port) + ["true"], capture_output=True)
            if probe.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("the shim sshd does not answer")

    def ssh_to(self, port: int) -> list[str]:
        return ["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-i", str(self.server.identity_file), "-p", str(port), "root@127.0.0.1"]

    def zbak_init(self) -> None:
        self.state = self.work / "zbak-state"
        self.config = self.work / "zbak.toml"
        self.write_config({"full": "unused-full", "inc": "unused-inc", "tree": "unused-tree"})
        self.zbak("init", "--no-checks")

    def write_config(self, targets: dict[str, str]) -> None:
        """A config with jobs full/inc/tree pushing to ``backup:DST/<targets[job]>``."""
        s = self.server
        text = textwrap.dedent(f"""\
            state_dir = "{self.state}"
            [hosts.backup]
            address = "{s.host}"
            port = {s.port}
            user = "{s.user}"
            identity_file = "{s.identity_file}"
            known_hosts = "{s.known_hosts}"
        """)
        for job, dataset, recursive in (("full", "full", False), ("inc", "inc", False),
                                        ("tree", "tree", True)):
            text += textwrap.dedent(f"""\
                [jobs.{job}]
                dataset = "{self.src}/{dataset}"
                recursive = {str(recursive).lower()}
                [jobs.{job}.replicate]
                targets = ["backup:{self.dst}/{targets[job]}"]
                compression = "none"
            """)
            if self.args.bandwidth_limit:
                text += f"bandwidth_limit = {self.args.bandwidth_limit}\n"
        self.config.write_text(text)

    def zbak_env(self) -> dict[str, str]:
        """The environment zbak runs in: bytecode compiled once into the work directory."""
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(self.work / "pycache")
        return env

    def compile_zbak(self) -> None:
        """``compileall`` zbak's modules into the private pycache (what an install does)."""
        subprocess.run([PYTHON, "-m", "compileall", "-q", str(REPO / "zrepl_py")],
                       env=self.zbak_env(), check=True, capture_output=True)

    def zbak(self, *args: str) -> tuple[float, str]:
        """Run ``python -m zrepl_py --config CFG ARGS``; (wall seconds, stderr)."""
        argv = [PYTHON, "-m", "zrepl_py", "--config", str(self.config), *args]
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=self.zbak_env())
        seconds = time.monotonic() - started
        if done.returncode != 0:
            raise Failed(f"zbak exit {done.returncode}: {last_line(done.stderr + done.stdout)}")
        return seconds, done.stderr

    def target(self, case: str, tool: str) -> str:
        self.serial += 1
        return f"{self.dst}/{case}-{re.sub(r'[^A-Za-z0-9]', '_', tool)}-{self.serial}"

    # -- the tools ---------------------------------------------------------------

    def raw(self, send: list[str], target: str, *, zbak_path: bool = False,
            receive_options: tuple[str, ...] = ()) -> float:
        """``send | ssh HOST zfs receive TARGET`` as an admin types it (ssh's own ciphers,
        no buffer); ``zbak_path``: with zbak's ssh argv (its ciphers) and receive buffer."""
        zfs_receive = ["zfs", "receive", *receive_options, target]
        if zbak_path:
            receive = self.ssh + [remote_pipeline(
                [mbuffer_argv(RECEIVE_BUFFER), zfs_receive], sudo=False)]
        else:
            receive = self.ssh_to(self.server.port) + [remote_command(zfs_receive, sudo=False)]
        started = time.monotonic()
        sender = subprocess.Popen(send, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        receiver = subprocess.Popen(receive, stdin=sender.stdout, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
        assert sender.stdout is not None
        sender.stdout.close()
        _, rerr = receiver.communicate()
        _, serr = sender.communicate()
        seconds = time.monotonic() - started
        if sender.returncode or receiver.returncode:
            raise Failed(f"raw pipe: {last_line((serr + rerr).decode(errors='replace'))}")
        return seconds

    def shell_loop(self, root: str, target: str, base: str, new: str) -> float:
        """One ``zfs send -I @BASE @NEW | ssh HOST zfs receive -u`` per dataset of ``root``
        into the same place under ``target``, run by one bash loop as an admin types it."""
        script = textwrap.dedent("""\
            root=$1 target=$2 base=$3 new=$4; shift 4
            for ds in $(zfs list -H -o name -r "$root"); do
              zfs send -I "$ds@$base" "$ds@$new" |
                "$@" zfs receive -u "'$target${ds#$root}'" || exit 1
            done
        """)
        argv = ["bash", "-c", script, "loop", root, target, base, new,
                *self.ssh_to(self.server.port)]
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True)
        seconds = time.monotonic() - started
        if done.returncode != 0:
            raise Failed(f"shell loop: {last_line(done.stderr)}")
        return seconds

    def seed_incremental(self, target: str) -> None:
        """``target`` made from the incremental's base, untimed, locally, with zbak's replica
        properties (a nightly run repairs nothing): every tool starts from the same state."""
        seed = subprocess.Popen(["zfs", "send", f"{self.src}/inc@base"], stdout=subprocess.PIPE)
        received = subprocess.run(["zfs", "receive", "-u", target], stdin=seed.stdout,
                                  capture_output=True, text=True)
        seed.wait()
        if received.returncode:
            raise RuntimeError(f"seeding {target}: {received.stderr}")
        for prop in REPLICA_PROPERTIES:
            sh("zfs", "set", prop, target)

    def change_tree(self, snapshot: str) -> None:
        """16 KiB of new random data in every dataset of the tree, then ``zfs snapshot -r``."""
        for mount in sorted((self.work / self.src / "tree").glob("**/")):
            with open(mount / f"{snapshot}.bin", "wb") as handle:
                handle.write(os.urandom(16 * 1024))
        sh("zfs", "snapshot", "-r", f"{self.src}/tree@{snapshot}")

    def syncoid(self, source: str, target: str, *, shim: bool, recursive: bool = False) -> float:
        port = self.shim_port if shim else self.server.port
        argv = [SYNCOID, "--no-privilege-elevation", "--no-sync-snap", "--compress=none",
                f"--sshport={port}", f"--sshkey={self.server.identity_file}",
                f"--sshoption=UserKnownHostsFile={self.known_hosts}",
                "--sshoption=StrictHostKeyChecking=yes",
                *(["--recursive"] if recursive else []), source, f"root@127.0.0.1:{target}"]
        env = dict(os.environ, PATH=self.shim_path) if shim else None
        wall = time.time()
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        seconds = time.monotonic() - started
        if done.returncode != 0:
            self.close_syncoid_masters(wall)
            raise Failed(f"syncoid exit {done.returncode}: {last_line(done.stderr + done.stdout)}")
        return seconds

    def close_syncoid_masters(self, since: float) -> None:
        """Stop the ssh master a failed syncoid left behind.

        syncoid opens ``ssh -M -S /tmp/syncoid-HOST-EPOCH -o ControlPersist=1m`` and closes it
        only on success (``-O exit`` at its end; ``die`` skips that), and the next syncoid
        started within the same second would reuse that master, and its sshd (seen: a
        syncoid+shim run talking to the unshimmed sshd). Close it, then let the second pass.
        """
        for sock in Path("/tmp").glob("syncoid-*"):
            try:
                if sock.stat().st_mtime < since - 1:
                    continue
            except FileNotFoundError:
                continue
            subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "root@127.0.0.1"],
                           capture_output=True, timeout=10)
        time.sleep(1.1)

    def close_zbak_master(self) -> None:
        """End the ssh master an earlier zbak run left behind: it stays 60 s after its last
        session (``openssh.CONTROL_PERSIST``), and a timed run that found it would skip the
        ssh login that a nightly run, hours after the last, pays. Only the sockets in this
        benchmark's own state directory (``openssh.control_dir``)."""
        sockets = self.state / "ssh"
        for sock in sockets.iterdir() if sockets.is_dir() else ():
            subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "unused"], capture_output=True,
                           timeout=10)

    def open_zbak_master(self) -> None:
        """Start zbak's ssh master to the target host as zbak itself does
        (``transport.stages.Side.connect``) and wait for its login: what a run finds when
        another used the host less than 60 s before (a second job of the same nightly
        window, a retry)."""
        config = load_config(self.config)
        wait = Side.of(config, next(iter(config.hosts))).connect()
        if wait is not None:
            wait()

    def run_zbak(self, job: str, target: str, pipe_times: list[float], *,
                 master_up: bool = False) -> float:
        """``zbak replicate --json JOB`` into ``target``; its pipeline seconds go to
        ``pipe_times``. The ssh master is ended first, or with ``master_up`` made ready."""
        targets = {"full": "unused-full", "inc": "unused-inc", "tree": "unused-tree"}
        targets[job] = target.split("/", 1)[1]
        self.write_config(targets)
        self.close_zbak_master()
        if master_up:
            self.open_zbak_master()
        seconds, stderr = self.zbak("replicate", "--json", job)
        pipe_times.append(sum(float(m.group(2)) for m in RECEIVED.finditer(stderr)))
        return seconds


class Results:
    """Samples per (case, tool), failures, and the table."""

    def __init__(self) -> None:
        self.times: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        self.failures: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        self.order: list[tuple[str, str]] = []

    def record(self, case: str, tool: str, run: Callable[[], float]) -> None:
        key = (case, tool)
        if key not in self.order:
            self.order.append(key)
        try:
            seconds = run()
        except Failed as exc:
            self.failures[key].append(str(exc))
            print(f"  {case:12} {tool:18} FAILED: {exc}", flush=True)
            return
        self.times[key].append(seconds)
        print(f"  {case:12} {tool:18} {seconds:8.2f} s", flush=True)

    def add(self, case: str, tool: str, seconds: float) -> None:
        key = (case, tool)
        if key not in self.order:
            self.order.append(key)
        self.times[key].append(seconds)

    def median(self, case: str, tool: str) -> float | None:
        values = self.times.get((case, tool))
        return statistics.median(values) if values else None

    def table(self, streams: dict[str, int], baseline: dict[str, tuple[str, str]]) -> str:
        head = (f"{'case':14} {'tool':18} {'runs (s)':26} {'median':>8} {'spread':>7} "
                f"{'MB/s':>7} {'ratio':>7}  vs")
        lines = [head, "-" * len(head)]
        for case, tool in self.order:
            values = self.times.get((case, tool), [])
            fails = self.failures.get((case, tool), [])
            if not values:
                lines.append(f"{case:14} {tool:18} FAILED {len(fails)}/{len(fails)}: "
                             f"{fails[0] if fails else ''}")
                continue
            median = statistics.median(values)
            spread = max(values) - min(values)
            runs = " ".join(f"{v:.2f}" for v in values)
            stream = streams.get(case.split()[0])
            rate = f"{stream / 1e6 / median:7.1f}" if stream else f"{'':7}"
            ratio, versus = "", ""
            base_tool, kind = baseline.get(case, ("", ""))
            base = self.median(case, base_tool) if base_tool else None
            if base and median and tool not in (base_tool, PIPE_ONLY):  # not a user figure
                ratio = f"{base / median:7.3f}"
                versus = f"{base_tool} ({kind})"
            lines.append(f"{case:14} {tool:18} {runs:26} {median:8.2f} {spread:7.2f} {rate} "
                         f"{ratio:>7}  {versus}")
            if fails:
                lines.append(f"{'':14} {'':18} also FAILED {len(fails)}x: {fails[0]}")
        return "\n".join(lines)


GOALS = (("full", 0.97, "raw pipe"), ("incremental", 0.97, "raw pipe"),
         ("tree initial", 3.0, "syncoid"), ("nightly cycle", 1.0, "syncoid+shim"),
         ("nightly cycle", 1.0, "shell loop"))
"""(case, floor, peer): zbak's speed-up over the peer (peer median / zbak median) must reach
the floor; a floor of 1.0 reads "faster than" (strictly above)."""
NOOP_LIMIT = 2.0
"""Seconds a no-op cycle must stay under."""


def goal_lines(results: Results) -> list[str]:
    """One line per goal of the module docstring (pure; ``zfsbench.target_line``): met or
    MISSED against the peer's median, MISSED with the failures when every zbak run of the
    case failed, not measured when the peer's did or the case was not run."""
    lines = []
    for case, floor, peer in GOALS:
        def verdict(ours: float, theirs: float, floor: float = floor, peer: str = peer) -> str:
            ratio = theirs / ours
            met = ratio > floor if floor == 1.0 else ratio >= floor
            return (f"zbak {ratio:.3f}x ({'>' if floor == 1.0 else '>='} {floor}):"
                    f" {'met' if met else 'MISSED'}")
        lines.append(target_line(
            f"{case} vs {peer}", results.median(case, "zbak"), results.median(case, peer),
            ours_failed=results.failures.get((case, "zbak"), []),
            reference_failed=results.failures.get((case, peer), []), peer=peer,
            verdict=verdict))
    lines.append(target_line(
        "no-op cycle", results.median("no-op cycle", "zbak"), NOOP_LIMIT,
        ours_failed=results.failures.get(("no-op cycle", "zbak"), []),
        verdict=lambda ours, limit: (f"zbak {ours:.2f} s (< {limit:g} s):"
                                     f" {'met' if ours < limit else 'MISSED'}")))
    return lines


def measure(bench: Bench, results: Results, reps: int, cases: set[str]
            ) -> dict[str, list[float]]:
    """Every case and tool of ``cases``; returns zbak's pipe-only seconds per case."""
    src = bench.src
    pipe: dict[str, list[float]] = collections.defaultdict(list)

    def full(tool: str) -> Callable[[], float]:
        def run() -> float:
            target = bench.target("full", tool)
            try:
                if tool in ("raw pipe", RAW_ZBAK_PATH):
                    seconds = bench.raw(["zfs", "send", f"{src}/full@full"], target,
                                        zbak_path=tool == RAW_ZBAK_PATH)
                elif tool == "zbak":
                    seconds = bench.run_zbak("full", target, pipe["full"])
                else:
                    seconds = bench.syncoid(f"{src}/full", target, shim=False)
                got = guid(f"{target}@full")
                if got != guid(f"{src}/full@full"):
                    raise RuntimeError(f"{target}@full has the wrong guid")
                return seconds
            finally:
                destroy(f"{target}@full", target)
        return run

    def incremental(tool: str) -> Callable[[], float]:
        def run() -> float:
            target = bench.target("inc", tool)
            bench.seed_incremental(target)
            try:
                if tool in ("raw pipe", RAW_ZBAK_PATH):
                    seconds = bench.raw(["zfs", "send", "-I", f"{src}/inc@base",
                                         f"{src}/inc@incr"], target,
                                        zbak_path=tool == RAW_ZBAK_PATH)
                elif tool in ("zbak", ZBAK_MASTER_UP):
                    seconds = bench.run_zbak("inc", target, pipe["incremental"] if tool == "zbak"
                                             else [], master_up=tool == ZBAK_MASTER_UP)
                else:
                    seconds = bench.syncoid(f"{src}/inc", target, shim=tool == "syncoid+shim")
                if guid(f"{target}@incr") != guid(f"{src}/inc@incr"):
                    raise RuntimeError(f"{target}@incr has the wrong guid")
                return seconds
            finally:
                destroy(f"{target}@incr", f"{target}@base", target)
        return run

    # One untimed transfer per case first: the first run after writing the data was seen
    # 1.7x slower than the rest (cache), whichever tool drew it.
    warm = bench.target("warm", "raw")
    bench.raw(["zfs", "send", f"{src}/full@full"], warm)
    destroy(f"{warm}@full", warm)
    warm = bench.target("warm", "raw")
    bench.raw(["zfs", "send", f"{src}/inc@incr"], warm)
    destroy(f"{warm}@incr", warm)

    if "full" in cases:
        print(f"full: {bench.stream['full']} bytes per stream, {reps} reps; load {load()}",
              flush=True)
        tools = ["raw pipe", RAW_ZBAK_PATH, "zbak", "syncoid"]
        for rep in range(reps):
            for tool in rotate(tools, rep):
                results.record("full", tool, full(tool))

    if "incremental" in cases:
        print(f"incremental: {bench.stream['incremental']} bytes per stream, {reps} reps; "
              f"load {load()}", flush=True)
        tools = ["raw pipe", RAW_ZBAK_PATH, "zbak", ZBAK_MASTER_UP, "syncoid+shim", "syncoid"]
        for rep in range(reps):
            for tool in rotate(tools, rep):
                results.record("incremental", tool, incremental(tool))

    if "tree" in cases or "nightly" in cases or "noop" in cases:
        tree_cases(bench, results, reps, cases, pipe)
    return pipe


def tree_cases(bench: Bench, results: Results, reps: int, cases: set[str],
               pipe: dict[str, list[float]]) -> None:
    """The tree of ``--datasets`` children: first replication, nightly cycles, no-op cycle.

    Tree initial: each rep replicates the whole tree to a new target with each tool (raw
    ``zfs send -R | ssh zfs receive -u``, zbak, ``syncoid -r``), interleaved; the last
    rep's replicas are kept for the next cases. Nightly: each rep writes 16 KiB of new random
    data into every dataset, takes ``zfs snapshot -r @nK``, then each tool brings its own
    replica from the previous snapshot to that one: zbak; syncoid -r through the shim and
    stock (which cannot list a zfs-fuse target's snapshots, docs/testbed.md#peers-on-zfs-fuse: its
    failure is shown); and a shell loop of raw pipes, one ``zfs send -I | ssh HOST zfs receive -u``
    per dataset as an admin would type it (a new ssh connection each), on the raw replica.
    """
    src = bench.src
    n = bench.args.datasets
    source = snapshot_guids(f"{src}/tree")
    kept: dict[str, str] = {}

    def initial(tool: str) -> Callable[[], float]:
        def run() -> float:
            target = bench.target("tree", tool)
            if tool == "raw send -R":
                seconds = bench.raw(["zfs", "send", "-R", f"{src}/tree@s1"], target,
                                    receive_options=("-u",))
            elif tool == "zbak":
                seconds = bench.run_zbak("tree", target, pipe["tree"])
            else:
                seconds = bench.syncoid(f"{src}/tree", target, shim=False, recursive=True)
            if snapshot_guids(target) != source:
                raise RuntimeError(f"{target} is not a replica of {src}/tree")
            kept[tool] = target
            return seconds
        return run

    print(f"tree initial ({n + 1} datasets), {reps} reps; load {load()}", flush=True)
    tools = ["raw send -R", "zbak", "syncoid"]
    for rep in range(reps if "tree" in cases else 1):
        for tool in rotate(tools, rep):
            results.record("tree initial", tool, initial(tool))
    if bench.args.timeline:  # now, while the tree has its one snapshot
        bench.timelines.append(timeline_tree(bench))
    replicas = {"zbak": kept.get("zbak"), "syncoid+shim": kept.get("syncoid"),
                "syncoid": kept.get("syncoid"), "shell loop": kept.get("raw send -R")}
    snapshots = ["s1"]

    def nightly(tool: str) -> Callable[[], float]:
        def run() -> float:
            target = replicas[tool]
            if target is None:
                raise Failed("its first replication failed")
            new = snapshots[-1]
            if tool == "zbak":
                seconds = bench.run_zbak("tree", target, pipe["nightly"])
            elif tool == "shell loop":
                seconds = bench.shell_loop(f"{src}/tree", target, snapshots[-2], new)
            else:
                seconds = bench.syncoid(f"{src}/tree", target, shim=tool == "syncoid+shim",
                                        recursive=True)
            if snapshot_guids(target) != snapshot_guids(f"{src}/tree"):
                raise RuntimeError(f"{target} is not a replica of {src}/tree@{new}")
            return seconds
        return run

    if "nightly" in cases:
        print(f"nightly cycle over {n + 1} datasets, 16 KiB new each, {reps} reps; "
              f"load {load()}", flush=True)
        tools = ["zbak", "syncoid+shim", "shell loop", "syncoid"]
        for rep in range(reps):
            bench.change_tree(f"nightly{rep}")
            snapshots.append(f"nightly{rep}")
            for tool in rotate(tools, rep):
                results.record("nightly cycle", tool, nightly(tool))

    def noop(tool: str) -> Callable[[], float]:
        def run() -> float:
            target = replicas[tool]
            if target is None:
                raise Failed("its first replication failed")
            before = snapshot_guids(target)
            if tool == "zbak":
                seconds = bench.run_zbak("tree", target, pipe["no-op"])
            else:
                seconds = bench.syncoid(f"{src}/tree", target, shim=tool == "syncoid+shim",
                                        recursive=True)
            if snapshot_guids(target) != before:
                raise RuntimeError(f"{target} changed in a no-op cycle")
            return seconds
        return run

    if "noop" in cases:
        print(f"no-op cycle over {n + 1} datasets, {reps} reps; load {load()}", flush=True)
        tools = ["zbak", "syncoid+shim", "syncoid"]
        for rep in range(reps):
            for tool in rotate(tools, rep):
                results.record("no-op cycle", tool, noop(tool))
    bench.kept_tree = replicas["zbak"]


COMMAND = re.compile(r"run \[([^\]]+)\]: (\[.*\])$")
"""A command in zbak's debug log: host and argv (a list repr)."""


def command_kind(bench: Bench, found: re.Match) -> str:
    """``[HOST] zfs get -Hp ...``: a command's first words, without dataset names."""
    host, command = found.groups()
    words = ast.literal_eval(command)
    kind = " ".join(w for w in words[:4] if not w.startswith((bench.src, bench.dst, "SRC", "DST")))
    return f"[{host}] {kind}"


def profile_noop(bench: Bench) -> str:
    """One ``zbak --debug`` no-op cycle of the tree job: commands run, by host and kind."""
    trees = bench.kept_tree
    if trees is None:
        return "(no zbak replica of the tree to profile a no-op cycle on)"
    bench.write_config({"full": "unused-full", "inc": "unused-inc", "tree": trees.split("/", 1)[1]})
    seconds, stderr = bench.zbak("--debug", "replicate", "tree")
    kinds = collections.Counter(command_kind(bench, found) for line in stderr.splitlines()
                                if (found := COMMAND.search(line)))
    total = sum(kinds.values())
    lines = [f"zbak --debug no-op cycle, {bench.args.datasets + 1} datasets: {seconds:.2f} s, "
             f"{total} commands ({total / (bench.args.datasets + 1):.1f} per dataset)"]
    lines += [f"  {count:5}  {kind}" for kind, count in kinds.most_common()]
    return "\n".join(lines)


TIMELINE = textwrap.dedent("""\
    import logging, sys, time
    T0 = time.time()
    # Every log line stamped with the seconds since this interpreter ran its first line.
    logging.Formatter.formatTime = lambda self, record, datefmt=None: f"{record.created - T0:6.3f}"
    from zrepl_py.cli import entry_point
    sys.argv[0] = "zbak"
    entry_point()
""")


def debug_run(bench: Bench, job: str, target: str) -> tuple[float, int, list[tuple[float, str]]]:
    """One ``zbak --debug replicate JOB`` to ``target`` (from a cold ssh master), each log
    line stamped with the seconds since the interpreter started (``TIMELINE``); returns
    (wall seconds, exit status, [(stamp, rest of the line)])."""
    targets = {"full": "unused-full", "inc": "unused-inc", "tree": "unused-tree"}
    targets[job] = target.split("/", 1)[1]
    bench.write_config(targets)
    argv = [PYTHON, "-c", TIMELINE, "--config", str(bench.config), "--debug", "replicate", job]
    bench.close_zbak_master()
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=bench.zbak_env())
    seconds = time.monotonic() - started
    lines = []
    for line in done.stderr.splitlines():
        stamp, _, rest = line.lstrip().partition(" ")
        try:
            lines.append((float(stamp), rest.replace(bench.src, "SRC").replace(bench.dst, "DST")))
        except ValueError:
            continue
    return seconds, done.returncode, lines


def timeline_incremental(bench: Bench) -> str:
    """One ``zbak --debug replicate`` of the incremental to a freshly seeded target, every
    log line with its time: where the time goes between the process start, the control
    commands, the pipeline and the exit."""
    target = bench.target("inc", "timeline")
    bench.seed_incremental(target)
    seconds, status, lines = debug_run(bench, "inc", target)
    destroy(f"{target}@incr", f"{target}@base", target)
    out = [f"zbak --debug replicate of the incremental ({bench.args.incr_mb} MiB), one run: "
           f"{seconds:.2f} s wall, exit {status}; seconds since the interpreter started, per "
           "log line:"]
    out += [f"  {stamp:6.3f}  {rest[:150]}" for stamp, rest in lines]
    out.append(f"  {seconds:6.3f}  (process ended, as the benchmark's parent saw it)")
    return "\n".join(out)


def timeline_tree(bench: Bench) -> str:
    """One ``zbak --debug replicate`` of the whole tree to a new target, summed up: the
    start-up, the control commands before the first transfer, the transfers (how many, their
    summed seconds, how many at once on average) and what follows the last one."""
    target = bench.target("tree", "timeline")
    seconds, status, lines = debug_run(bench, "tree", target)
    runs = [(stamp, m) for stamp, rest in lines if (m := COMMAND.search(rest))]
    commands = [stamp for stamp, _ in runs]
    sends = [stamp for stamp, rest in lines if " sending " in f" {rest}"]
    done = [(stamp, float(m.group(1))) for stamp, rest in lines
            if (m := re.search(r"pipeline done: \d+ bytes in ([0-9.]+) s", rest))]
    if not (commands and sends and done):
        return f"zbak --debug replicate of the tree: exit {status}, nothing to sum up"
    first, last = sends[0], done[-1][0]
    piped = sum(secs for _, secs in done)
    kinds = collections.Counter(command_kind(bench, m) for stamp, m in runs
                                if first <= stamp <= last)
    return "\n".join([
        f"zbak --debug replicate of the tree ({bench.args.datasets + 1} datasets) to a new "
        f"target, one run: {seconds:.2f} s wall, exit {status}",
        f"  {commands[0]:6.3f} s  interpreter, imports, config until the first command",
        f"  {first - commands[0]:6.3f} s  {sum(1 for c in commands if c < first)} control "
        "commands (capabilities, health, both listings) until the first transfer",
        f"  {last - first:6.3f} s  {len(done)} transfers, {piped:.2f} s of pipelines in all "
        f"({piped / max(last - first, 1e-9):.1f} at once on average, "
        f"{statistics.median(s for _, s in done):.3f} s median each); "
        f"{sum(1 for c in commands if first <= c <= last)} control commands meanwhile",
        f"  {seconds - last:6.3f} s  after the last transfer: "
        f"{sum(1 for c in commands if c > last)} control commands, the last batch, exit",
        "  control commands during the transfers, by kind:",
        *(f"  {count:8}  {kind}" for kind, count in kinds.most_common()),
    ])


def startup_seconds(bench: Bench, *args: str) -> float:
    """Median wall time of ``python -m zrepl_py ARGS`` (interpreter + imports), 5 runs."""
    times = []
    for _ in range(5):
        started = time.monotonic()
        subprocess.run([PYTHON, "-m", "zrepl_py", *args], capture_output=True, cwd=REPO,
                       env=bench.zbak_env())  # fmt: skip
        times.append(time.monotonic() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog=__doc__.split("\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=512, help="MiB of the full (default 512)")
    parser.add_argument("--incr-mb", type=int, default=None,
                        help="MiB of new data in the incremental (default: size / 2)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--datasets", type=int, default=100,
                        help="children in the tree (default 100)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of {', '.join(CASES)} (default all)")
    parser.add_argument("--timeline", action="store_true",
                        help="also one zbak --debug run of the incremental (every log line "
                             "with its time) and of the tree initial (summed up): where the "
                             "time goes")
    parser.add_argument("--bandwidth-limit", type=int, default=0, metavar="BYTES",
                        help="zbak's [replicate] bandwidth_limit in bytes/s (default none): "
                             "with one the link cannot fill, what sharing it costs a tree "
                             "(the other tools run unlimited)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 64 MiB, 10 datasets, 2 reps (unless given)")
    args = parser.parse_args()
    if args.quick:
        defaults = {"size_mb": 512, "reps": 3, "datasets": 100}
        quick = {"size_mb": 64, "reps": 2, "datasets": 10}
        for key, value in quick.items():
            if getattr(args, key) == defaults[key]:
                setattr(args, key, value)
    if args.incr_mb is None:
        args.incr_mb = max(1, args.size_mb // 2)
    if os.geteuid() != 0:
        raise SystemExit("run as root (zfs-fuse, sshd)")
    if not os.access(SYNCOID, os.X_OK):
        raise SystemExit(f"{SYNCOID} missing: apt-get install sanoid")

    workdir = Path(tempfile.mkdtemp(prefix="zbak-bench-repl-", dir="/var/tmp"))
    try:
        with private_zfs_fuse(workdir):
            return run(Bench(args, workdir), args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(bench: Bench, args: argparse.Namespace, workdir: Path) -> int:
    """Make the pools, data and sshds, time every case and print the table and the goals."""
    try:
        bench.make_pools()
        started = time.monotonic()
        bench.make_data()
        print(f"data written in {time.monotonic() - started:.0f} s; {os.cpu_count()} cpus; "
              f"pools {bench.src} {bench.dst} in {workdir}", flush=True)
        bench.start_sshds()
        bench.compile_zbak()
        bench.zbak_init()
        startup = {args: startup_seconds(bench, *args.split())
                   for args in ("--version", "--help", "replicate --help")}  # fmt: skip
        results = Results()
        cases = set(args.cases.split(","))
        if cases - set(CASES):
            raise SystemExit(f"unknown case(s): {', '.join(sorted(cases - set(CASES)))}")
        before = load()
        print(f"load before: {before}", flush=True)
        pipe = measure(bench, results, args.reps, cases)
        after = load()
        for case in ("full", "incremental"):
            if pipe.get(case):
                results.add(case, PIPE_ONLY, statistics.median(pipe[case]))
        profile = profile_noop(bench) if "noop" in cases else ""
        baseline = {"full": ("raw pipe", "throughput"),
                    "incremental": ("raw pipe", "throughput"),
                    "tree initial": ("syncoid", "speed-up"),
                    "nightly cycle": ("syncoid+shim", "speed-up"),
                    "no-op cycle": ("syncoid+shim", "speed-up")}
        print()
        print(f"full {args.size_mb} MiB, incremental {args.incr_mb} MiB, tree of "
              f"{args.datasets + 1} datasets, {args.reps} reps; load (1/5/15 min) before "
              f"{before}, after {after}; streams: "
              + ", ".join(f"{k} {v} bytes" for k, v in bench.stream.items()))
        print(results.table(bench.stream, baseline))
        print("(zbak (pipe only): median of the summed pipeline seconds zbak logs, 0.1 s "
              "resolution; start-up alone, median of 5: "
              + ", ".join(f"`zbak {args}` {secs:.2f} s" for args, secs in startup.items()) + ")")
        print()
        print("\n".join(goal_lines(results)))
        for case in ("full", "incremental"):  # what is left once both use the same data path
            ours, theirs = results.median(case, "zbak"), results.median(case, RAW_ZBAK_PATH)
            if ours and theirs:
                print(f"{case}: zbak {theirs / ours:.3f}x vs {RAW_ZBAK_PATH} "
                      f"(zbak's fixed cost: {ours - theirs:+.2f} s)")
        ours, theirs = (results.median("incremental", ZBAK_MASTER_UP),
                        results.median("incremental", "raw pipe"))
        if ours and theirs:  # the share of the gap that is the ssh login (docs/performance.md)
            print(f"incremental with the ssh master up: zbak {theirs / ours:.3f}x vs raw pipe")
        print()
        print(profile)
        if args.timeline and "incremental" in cases:
            print()
            print(timeline_incremental(bench))
        for timeline in bench.timelines:
            print()
            print(timeline)
        return 0
    finally:
        for server in bench.servers:
            server.stop()
        if bench.shim_sshd is not None:
            bench.shim_sshd.terminate()
            bench.shim_sshd.wait(10)
        for pool in (bench.src, bench.dst):
            subprocess.run(["zpool", "destroy", "-f", pool], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
