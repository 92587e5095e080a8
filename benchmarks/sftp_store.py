#!/usr/bin/env python3
"""The ``sftp://`` store's put and get against OpenSSH's own ``sftp`` client, side by side in
one run (by hand, not CI; docs/decisions.md#sftp-store).

The server is the test bed's SFTP-only sshd (``tests/support/sftpd.py``: ``internal-sftp``,
chrooted, on 127.0.0.1). One object of ``--size`` random bytes (at least 64 MiB) is:

- ``put c=N``: stored by ``SftpBackend.put`` with an upload concurrency of N (``--concurrency``,
  default 1 and 4): 8 MiB parts, N of them written at once, each on its own channel of the one
  SSH connection; the time includes the fsync and the rename, not the connection (made once,
  before the runs, as a run of zbak makes it once per store);
- ``put sftp(1)``: ``sftp -b`` putting the same bytes from a file in /dev/shm (OpenSSH's client:
  C, 64 requests of 32 KiB in flight, the same server), with a new connection per run;
- ``put paramiko``: paramiko's own ``SFTPClient.putfo`` (one channel, pipelined, no fsync or
  rename), on the connection zbak uses;
- ``get c=1``: ``SftpBackend.get`` reading it back, against ``get sftp(1)``.

Each case runs ``--reps`` times after one untimed warm-up, cases rotated per repetition; the
table gives every run, the median, the spread, MB/s (10^6 bytes per second) and the CPU
seconds of this process (paramiko's encryption and packets are the client's cost; the
server's sftp-server is not counted). The load average is printed before and after.

Usage (as root, after scripts/setup-host.sh)::

    .venv/bin/python benchmarks/sftp_store.py [--size 256MiB] [--reps 5] [--concurrency 1 4]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from support.sftpd import sftp_server
from zfsbench import load, rotate

from zrepl_py.proc.sshconn import SshConnection
from zrepl_py.stores.sftp import SftpBackend
from zrepl_py.values.units import parse_size

MiB = 1 << 20


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def sftp_batch(server, identity: Path, commands: str) -> None:
    """Run OpenSSH's ``sftp -b -`` with ``commands`` against ``server``."""
    subprocess.run(
        ["sftp", "-q", "-b", "-", "-i", str(identity), "-P", str(server.ssh.port),
         "-o", f"UserKnownHostsFile={server.ssh.known_hosts}", "-o", "BatchMode=yes",
         f"{server.ssh.user}@{server.ssh.host}"],
        input=commands.encode(), check=True, capture_output=True, timeout=600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    size = parse_size(args.size)
    if size < 64 * MiB:
        parser.error("--size must be at least 64MiB (every part and window runs many times)")
    work = Path(tempfile.mkdtemp(prefix="zbak-sftp-bench-", dir="/var/tmp"))
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    source = Path(tempfile.mkdtemp(prefix="zbak-sftp-bench-", dir="/dev/shm")) / "object"
    data = os.urandom(size)
    source.write_bytes(data)
    print(f"load before: {load()}; object {size:,} bytes")
    with sftp_server(work / "sshd", key) as server:
        directory = server.fresh("bench")
        connection = SshConnection("box", server.host_config(),
                                   known_hosts_default=server.ssh.known_hosts)
        stores = {n: SftpBackend("box", connection, directory, concurrency=n)
                  for n in args.concurrency}
        stores[1] = stores.get(1) or SftpBackend("box", connection, directory, concurrency=1)

        def chunks():
            view = memoryview(data)
            for at in range(0, size, MiB):
                yield view[at:at + MiB]

        def put_with(n: int) -> Callable[[], None]:
            return lambda: stores[n].put("object", chunks())

        def put_paramiko() -> None:
            import paramiko

            sftp = paramiko.SFTPClient.from_transport(connection.transport())
            with open(source, "rb") as handle:
                sftp.putfo(handle, f"{directory}/paramiko", file_size=size, confirm=True)
            sftp.close()

        def get_zbak() -> None:
            total = sum(len(c) for c in stores[1].get("object"))
            assert total == size

        cases: dict[str, Callable[[], None]] = {
            **{f"put c={n}": put_with(n) for n in args.concurrency},
            "put sftp(1)": lambda: sftp_batch(server, key, f"put {source} {directory}/openssh\n"),
            "put paramiko": put_paramiko,
            "get c=1": get_zbak,
            "get sftp(1)": lambda: sftp_batch(server, key,
                                              f"get {directory}/openssh {work}/fetched\n"),
        }
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for run in cases.values():  # warm-up, and the objects the gets read
            run()
        for rep in range(args.reps):
            for name in rotate(list(cases), rep):
                began, cpu_began = time.perf_counter(), cpu()
                cases[name]()
                times[name].append((time.perf_counter() - began, cpu() - cpu_began))
        stored = server.local(directory)
        assert (stored / "object").read_bytes() == data
        for store in stores.values():
            store.close()
    print(f"load after: {load()}")
    print(f"{'case':<14} {'runs (s)':<40} {'median':>7} {'spread':>7} {'MB/s':>7} {'CPU s':>6}")
    for name, runs in times.items():
        seconds = [t for t, _ in runs]
        median = statistics.median(seconds)
        print(f"{name:<14} {' '.join(f'{t:.2f}' for t in seconds):<40} {median:7.2f}"
              f" {max(seconds) - min(seconds):7.2f} {size / median / 1e6:7.1f}"
              f" {statistics.median(c for _, c in runs):6.2f}")
    source.unlink()
    source.parent.rmdir()
    subprocess.run(["rm", "-rf", str(work)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
