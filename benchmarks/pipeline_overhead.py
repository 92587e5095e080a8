#!/usr/bin/env python3
"""How much slower is ``run_pipeline`` than the same pipe run by ``bash -c``? (target: none)

Measures, side by side and interleaved, the wall time of one ``zfs send`` of a snapshot of
~200 MB of random data through

- ``run_pipeline(stages)`` (zrepl_py.proc.pipeline), and
- ``bash -c 'zfs send ... | ...'``, the same stages joined by a shell,

for three pipelines: ``send | cat > /dev/null`` (the pipe alone), ``send | zfs receive``
(local) and ``send | ssh 127.0.0.1 zfs receive`` (OpenSSH to a private sshd); ``--zstd`` adds
``send | zstd -T0 | ssh 'zstd -d | zfs receive'``. Every received snapshot's guid is checked
against the source's, then the copy is destroyed (``zfs destroy`` of our own benchmark
datasets, never ``-r``).

Runs as root on the test bed of tests/support (it reuses those helpers): a private mount
namespace with its own zfs-fuse daemon, a pool on a sparse file and an sshd on 127.0.0.1, all
removed at the end. Usage::

    .venv/bin/python benchmarks/pipeline_overhead.py [--size-mb 200] [--repeat 3] [--zstd]
        [--pipe-size BYTES]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from support import sshd as testbed_sshd
from support import zfs as testbed_zfs

from zrepl_py.proc.openssh import remote_command, remote_pipeline, ssh_argv
from zrepl_py.proc.pipeline import Meter, Stage, run_pipeline

MB = 1024 * 1024


def sh(*argv: str, timeout: float = 300) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout.strip()


def destroy(name: str) -> None:
    """``zfs destroy NAME`` (no -r), retried while zfs-fuse says the dataset is busy."""
    for _ in range(50):
        done = subprocess.run(["zfs", "destroy", name], capture_output=True, text=True)
        if done.returncode == 0 or "does not exist" in done.stderr:
            return
        time.sleep(0.2)
    raise RuntimeError(f"cannot destroy {name}: {done.stderr.strip()}")


def start_zfs(workdir: Path) -> Path:
    """A private zfs-fuse (tests/support/zfs.py recipe); returns its pid file."""
    why_not = testbed_zfs._enter_private_namespace()
    if why_not:
        raise SystemExit(f"cannot get a private zfs-fuse: {why_not}")
    pidfile = workdir / "zfs-fuse.pid"
    sh("/usr/sbin/zfs-fuse", "--no-kstat-mount", "--pidfile", str(pidfile))
    testbed_zfs._wait_for_daemon("zpool")
    return pidfile


def variants(pool: str, source: str, ssh: list[str], zstd: bool):
    """``(name, function of a target name -> [argv, ...], receives?)`` per pipeline."""
    send = ["zfs", "send", source]
    found = [
        ("send | cat >/dev/null", lambda target: [send, ["cat"]], False),
        ("send | zfs receive", lambda target: [send, ["zfs", "receive", target]], True),
        ("send | ssh zfs receive",
         lambda target: [send, ssh + [remote_command(["zfs", "receive", target], sudo=False)]],
         True),
    ]  # fmt: skip
    if zstd:
        found.append((
            "send | zstd | ssh 'zstd -d | zfs receive'",
            lambda target: [send, ["zstd", "-T0", "-q"],
                            ssh + [remote_pipeline([["zstd", "-d", "-q"],
                                                    ["zfs", "receive", target]], sudo=False)]],
            True,
        ))  # fmt: skip
    return found


def run_bash(argvs: list[list[str]]) -> float:
    # The baseline is a shell string by nature; remote_pipeline quotes it (the one join).
    script = remote_pipeline(argvs, sudo=False)
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", script], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"bash pipe failed: {done.stderr.decode(errors='replace')}")
    return seconds


def run_ours(argvs: list[list[str]], pipe_size: int | None) -> tuple[float, int]:
    stages = [Stage(f"stage{i}", tuple(argv)) for i, argv in enumerate(argvs)]
    started = time.monotonic()
    done = run_pipeline(stages, meter=Meter.READ, pipe_size=pipe_size)
    return time.monotonic() - started, done.bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--zstd", action="store_true")
    parser.add_argument("--pipe-size", type=int, default=None)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (zfs-fuse, sshd)")

    workdir = Path(tempfile.mkdtemp(prefix="zbak-bench-"))
    pidfile = start_zfs(workdir)
    pool, image, mountpoint = f"zbench{os.getpid()}", workdir / "pool.img", workdir / "mnt"
    server = None
    try:
        sh("truncate", "-s", f"{args.size_mb * 4 + 512}M", str(image))
        sh("zpool", "create", "-m", str(mountpoint), pool, str(image))
        sh("zfs", "create", f"{pool}/src")
        with open(mountpoint / "src" / "data.bin", "wb") as handle:
            for _ in range(args.size_mb):
                handle.write(os.urandom(MB))
        source = f"{pool}/src@s"
        sh("zfs", "snapshot", source)
        source_guid = sh("zfs", "get", "-Hp", "-o", "value", "guid", source)
        count = remote_pipeline([["zfs", "send", source], ["wc", "-c"]], sudo=False)
        stream = int(sh("bash", "-c", count))
        user_key = workdir / "id_ed25519"
        testbed_sshd._keygen(user_key, "zbak-bench")
        server = testbed_sshd._Sshd(workdir / "sshd", user_key)
        reached = server.start()
        ssh = ssh_argv(reached.host_config(), known_hosts_default=workdir / "kh")
        print(f"stream: {stream} bytes ({stream / MB:.1f} MiB), pool {pool}, "
              f"pipe_size={args.pipe_size or 'default'}, {os.cpu_count()} cpus")  # fmt: skip

        rows = []
        serial = 0
        for name, build, receives in variants(pool, source, ssh, args.zstd):
            times: dict[str, list[float]] = {"bash": [], "run_pipeline": []}
            counted = []
            for rep in range(args.repeat):
                order = ["bash", "run_pipeline"] if rep % 2 == 0 else ["run_pipeline", "bash"]
                for mode in order:
                    serial += 1
                    target = f"{pool}/dst{serial}"
                    argvs = build(target)
                    if mode == "bash":
                        seconds = run_bash(argvs)
                    else:
                        seconds, count = run_ours(argvs, args.pipe_size)
                        counted.append(count)
                    times[mode].append(seconds)
                    if receives:
                        got = sh("zfs", "get", "-Hp", "-o", "value", "guid", f"{target}@s")
                        assert got == source_guid, (target, got, source_guid)
                        destroy(f"{target}@s")
                        destroy(target)
            bash_median = statistics.median(times["bash"])
            ours_median = statistics.median(times["run_pipeline"])
            rows.append((name, times, bash_median / ours_median, counted))

        print()
        print(f"{'pipeline':44} {'mode':13} {'runs (s)':28} {'median':>7} {'MiB/s':>7}")
        for name, times, ratio, counted in rows:
            for mode, values in times.items():
                median = statistics.median(values)
                runs = " ".join(f"{v:.2f}" for v in values)
                print(f"{name:44} {mode:13} {runs:28} {median:7.2f} {stream / MB / median:7.1f}")
            extra = min(counted) - stream, max(counted) - stream
            print(f"{'':44} throughput ratio run_pipeline/bash = {ratio:.3f}; "
                  f"bytes counted - stream size: {extra[0]}..{extra[1]}")  # fmt: skip
        return 0
    finally:
        if server is not None:
            server.stop()
        subprocess.run(["zpool", "destroy", "-f", pool], capture_output=True)
        image.unlink(missing_ok=True)
        testbed_zfs._stop_private_daemon(pidfile)


if __name__ == "__main__":
    sys.exit(main())
