#!/usr/bin/env python3
"""zbak archive and restore against the plain zstd pipe, side by side in one run (by hand, not CI).

Targets (issue 4, "Done when"): archive and restore throughput >= 0.9x the plain pipe, and
<= 200 MiB peak RSS of the zbak process for a stream of several GB.

Cases, all on the same snapshot of one zfs-fuse dataset holding ``--size`` bytes of mixed
data (each MiB alternately random, i.e. incompressible, and word text that zstd -3 shrinks
about 4x):

- ``archive file``: ``zbak archive`` (a fresh catalog and store directory per run, so every
  run writes a full) against the "single upload" into the same directory,
  ``zfs send DS@s | zstd -3 > FILE`` followed by an fsync of FILE (zbak's file store fsyncs
  each volume before it counts as stored; the fsync share of the baseline is printed);
- ``archive s3`` (``--s3``): the same to moto's S3 server run out of process
  (``python -m moto.server``), against ``zfs send | zstd -3 | python -c 'boto3
  upload_fileobj(stdin)'`` (boto3's managed multipart upload, its defaults: 8 MiB parts,
  10 threads); both upload the same bytes to the same server;
- ``restore file``: ``zbak restore DS --to @s --into NEW --from STORE --yes`` from the store of
  the last zbak archive run (every volume verified, then decompressed into ``zfs receive -u``),
  against ``zstd -dc FILE | zfs receive -u NEW2`` from the baseline's file;
- ``rss`` (``--rss-size``, one run each, skipped with ``--rss-size 0``): archive and restore of
  a second dataset of that size through both tools, for zbak's peak RSS on a stream of
  several GB (and its throughput at that size); with ``--s3`` also the archive to S3, where
  memory is bounded by the multipart part size x (upload concurrency + 1).

zbak runs as its CLI (``python -m zrepl_py --config CFG ...``), so its times include the
interpreter start and imports (printed, ~1 s here). Peak RSS is ``ru_maxrss`` from wait4(2)
of each process run (for zbak: the Python process and the zfs/ssh children it waited for;
for the pipe: the largest of its processes). After one untimed warm-up of each case, each
case runs ``--reps`` times, tools alternated and their order rotated per repetition; the table
gives every run, the median, the spread (max - min), MB/s (10^6 bytes of the raw send stream
per second), the ratio (pipe median / zbak median: >= 1 means zbak is as fast) and the peak
RSS. Every received snapshot's guid is checked against the source's.

Runs as root on the test bed of tests/testbed: a private mount namespace with its own
zfs-fuse daemon, two pools on sparse files and a store directory in a temporary directory
under /var/tmp (about 2 x (size + rss-size) of real disk at most), all removed at the end.
The machine's other work shares the CPUs: the load average is printed with the table.
Usage::

    .venv/bin/python benchmarks/archive.py [--size 512MiB] [--rss-size 3GiB] [--reps 3]
        [--volume-size SIZE] [--s3] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from testbed import zfs as testbed_zfs  # noqa: E402
from testbed.common import free_port  # noqa: E402
from zfsbench import destroy, guid, last_line, rotate, sh  # noqa: E402 (script-local import)

MIB = 1024 * 1024
PYTHON = sys.executable
S3_KEYS = {"AWS_ACCESS_KEY_ID": "bench-access-key", "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
           "AWS_DEFAULT_REGION": "us-east-1"}
BUCKET = "zbak-bench"
UPLOAD = textwrap.dedent("""\
    import sys, boto3
    endpoint, bucket, key = sys.argv[1:4]
    boto3.client("s3", endpoint_url=endpoint).upload_fileobj(sys.stdin.buffer, bucket, key)
""")


class Failed(Exception):
    """A tool run that did not complete (its exit status and last stderr line)."""


def parse_size(text: str) -> int:
    """``512MiB``, ``3GiB``, ``100M``, ``0`` -> bytes (binary units)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not found:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512MiB, 3GiB)")
    number, unit = found.groups()
    return int(float(number) * 1024 ** " KMGT".index(unit.upper() or " "))


def human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def timed(argv: list[str], log: Path) -> list[str]:
    """``argv`` run under GNU time, which writes ``%M %U %S`` (peak RSS KiB, user and
    system CPU seconds of the process and the children it waited for) to ``log``.

    Why not wait4(2) from here: Linux starts a child's ``ru_maxrss`` at its parent's RSS
    at fork (exec records the old mm's high-water mark), so every child of this big
    benchmark process would report this process's RSS; GNU time is a small parent."""
    return ["/usr/bin/time", "-f", "%M %U %S", "-o", str(log), *argv]


def usage(log: Path) -> tuple[int, float]:
    """``(peak RSS bytes, CPU seconds)`` from a :func:`timed` log."""
    rss, user, system = log.read_text().split("\n")[-2].split()
    return int(rss) * 1024, float(user) + float(system)


def run_pipe(argvs: list[list[str]], work: Path, *, stdout=None,
             env: dict[str, str] | None = None) -> tuple[float, int, float]:
    """Run ``argv0 | argv1 | ...``; ``(wall seconds, largest peak RSS bytes, CPU seconds)``.

    Raises:
        Failed: a stage exited non-zero (its stderr's last line).
    """
    procs: list[subprocess.Popen] = []
    errs, logs = [], []
    previous = None
    started = time.monotonic()
    for i, argv in enumerate(argvs):
        last = i == len(argvs) - 1
        err = tempfile.TemporaryFile()
        errs.append(err)
        logs.append(work / f"time-{i}.log")
        proc = subprocess.Popen(timed(argv, logs[-1]), stdin=previous,
                                stdout=stdout if last else subprocess.PIPE, stderr=err,
                                env=env)
        if procs and procs[-1].stdout is not None:
            procs[-1].stdout.close()
        procs.append(proc)
        previous = proc.stdout
    codes = [proc.wait() for proc in procs]
    seconds = time.monotonic() - started
    for code, err, argv in zip(codes, errs, argvs):
        if code != 0:
            err.seek(0)
            raise Failed(f"{argv[0]} exit {code}: {last_line(err.read().decode(errors='replace'))}")
    used = [usage(log) for log in logs]
    return seconds, max(rss for rss, _ in used), sum(cpu for _, cpu in used)


@dataclasses.dataclass(frozen=True)
class Run:
    """One timed run: wall seconds, peak RSS bytes (largest process), CPU seconds (user +
    system of its processes) and ``servers``: CPU seconds the zfs-fuse daemon and moto's
    server spent meanwhile (they do the send/receive and S3 work, on the same CPUs)."""

    seconds: float
    rss: int
    cpu: float
    servers: float = 0.0


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads; proc(5) stat
    fields 14 and 15, in clock ticks)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Bench:
    """Pools, data, stores and both tools; the case methods return a :class:`Run`."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args = args
        self.work = workdir
        tag = os.getpid()
        self.src, self.dst = f"zas{tag}", f"zad{tag}"
        self.serial = 0
        self.stream: dict[str, int] = {}
        self.moto: subprocess.Popen | None = None
        self.daemon_pid = 0  # the private zfs-fuse
        self.endpoint = ""
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("ZBAK_", "AWS_"))}
        self.env.update(S3_KEYS)
        self.latest: dict[str, tuple[Path, Path]] = {}  # case -> (zbak config, pipe's file)
        self.fsyncs: list[float] = []  # seconds of the baseline's fsync, per file run
        self.caps = workdir / "capabilities"  # zbak's capability cache, shared by all runs

    # -- set-up ------------------------------------------------------------------

    def make_pools(self) -> None:
        a = self.args
        data = a.size + a.rss_size
        sizes = {self.src: data * 1.3 + 512 * MIB,
                 self.dst: max(a.size, a.rss_size) * 1.5 + 512 * MIB}
        for pool, size in sizes.items():
            image = self.work / f"{pool}.img"
            sh("truncate", "-s", str(int(size)), str(image))
            sh("zpool", "create", "-m", str(self.work / pool), pool, str(image))

    def write_mixed(self, dataset: str, size: int) -> None:
        """``size`` bytes in 256 MiB files; each MiB alternately random and word text."""
        rng = random.Random(4)
        words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 11)))
                 for _ in range(20000)]
        text = b" ".join(rng.choices(words, k=3 * MIB))[:16 * MIB]
        mount = self.work / dataset
        left, index, offset = size, 0, 0
        while left > 0:
            with open(mount / f"data{index:03d}.bin", "wb") as handle:
                for n in range(min(256 * MIB, left) // MIB):
                    if n % 2:
                        handle.write(text[offset:offset + MIB])
                        offset = (offset + MIB) % len(text)
                    else:
                        handle.write(os.urandom(MIB))
            left -= 256 * MIB
            index += 1

    def make_data(self) -> None:
        datasets = [("ratio", self.args.size)]
        if self.args.rss_size:
            datasets.append(("big", self.args.rss_size))
        for name, size in datasets:
            dataset = f"{self.src}/{name}"
            sh("zfs", "create", dataset)
            self.write_mixed(dataset, size)
            sh("zfs", "snapshot", f"{dataset}@s")
            self.stream[name] = self.stream_size(["zfs", "send", f"{dataset}@s"])

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

    def start_moto(self) -> None:
        """moto's server in its own process (its request handling would otherwise share
        zbak's or this script's interpreter), and the bucket."""
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        log = open(self.work / "moto.log", "ab")
        self.moto = subprocess.Popen([PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                      str(port)], stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=log, env=self.env)
        import boto3  # noqa: PLC0415 (only with --s3)

        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                               aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
                               aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"])
        deadline = time.monotonic() + 30
        while True:
            try:
                self.s3.create_bucket(Bucket=BUCKET)
                return
            except Exception:  # noqa: BLE001 - not listening yet
                if time.monotonic() > deadline or self.moto.poll() is not None:
                    raise RuntimeError(f"moto server did not start; see {self.work}/moto.log")
                time.sleep(0.3)

    def s3_empty(self, prefix: str) -> None:
        """Delete the bench's objects under ``prefix`` (moto keeps them in memory)."""
        paginator = self.s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix):
            for obj in page.get("Contents", []):
                self.s3.delete_object(Bucket=BUCKET, Key=obj["Key"])

    # -- zbak --------------------------------------------------------------------

    def zbak_setup(self, store_url: str) -> Path:
        """A fresh state directory, catalog and config with jobs ``ratio`` and ``big``
        archiving to the store ``cold`` at ``store_url``; returns the config file."""
        self.serial += 1
        run = self.work / f"zbak-{self.serial}"
        run.mkdir()
        volume = f'volume_size = "{self.args.volume_size}"\n' if self.args.volume_size else ""
        s3 = (f'endpoint = "{self.endpoint}"\nregion = "us-east-1"\n'
              if store_url.startswith("s3") else "")
        text = f'state_dir = "{run / "state"}"\n[stores.cold]\nurl = "{store_url}"\n{s3}{volume}'
        for job in ("ratio", "big"):
            text += textwrap.dedent(f"""\
                [jobs.{job}]
                dataset = "{self.src}/{job}"
                [jobs.{job}.archive]
                store = "cold"
                compression_level = 3
            """)
        config = run / "zbak.toml"
        config.write_text(text)
        self.zbak(config, "init", "--no-checks")
        return config

    def zbak(self, config: Path, *args: str) -> Run:
        """Run ``python -m zrepl_py --config CFG ARGS`` with the shared capability cache
        (a real state directory keeps it between runs: zrepl_py/zfs/capability_cache.py)."""
        state = Path(re.search(r'state_dir = "([^"]+)"', config.read_text()).group(1))
        if self.caps.is_dir():
            shutil.copytree(self.caps, state / "capabilities", dirs_exist_ok=True)
        log = config.parent / "time.log"
        argv = timed([PYTHON, "-m", "zrepl_py", "--config", str(config), *args], log)
        with tempfile.TemporaryFile() as out:
            started = time.monotonic()
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                  env=self.env, check=False)
            seconds = time.monotonic() - started
            if done.returncode != 0:
                out.seek(0)
                raise Failed(f"zbak {args[0]} exit {done.returncode}: "
                             f"{last_line(out.read().decode(errors='replace'))}")
        if (state / "capabilities").is_dir():
            shutil.copytree(state / "capabilities", self.caps, dirs_exist_ok=True)
        rss, cpu = usage(log)
        return Run(seconds, rss, cpu)

    # -- the cases ---------------------------------------------------------------

    def archive_zbak(self, job: str, store: str) -> Run:
        if store == "file":
            directory = self.work / f"store-{self.serial + 1}"
            directory.mkdir()
            config = self.zbak_setup(f"file://{directory}")
        else:
            config = self.zbak_setup(f"s3://{BUCKET}/zbak-{self.serial + 1}")
        try:
            result = self.zbak(config, "archive", job)
        except Failed:
            self.drop_store(config)
            raise
        previous = self.latest.get(f"{job}-{store}-zbak")
        if previous:
            self.drop_store(previous[0])
        self.latest[f"{job}-{store}-zbak"] = (config, Path())
        return result

    def drop_store(self, config: Path) -> None:
        """Remove a zbak run's store contents (keeps the disk and moto's memory small)."""
        url = re.search(r'url = "([^"]+)"', config.read_text()).group(1)
        if url.startswith("file://"):
            shutil.rmtree(url[len("file://"):], ignore_errors=True)
        else:
            self.s3_empty(url.split("/", 3)[3] + "/")

    def archive_pipe(self, job: str, store: str) -> Run:
        send = ["zfs", "send", f"{self.src}/{job}@s"]
        zstd = ["zstd", "-3", "-q", "-c"]
        self.serial += 1
        if store == "file":
            target = self.work / f"store-{self.serial}.zst"
            with open(target, "wb") as out:
                seconds, rss, cpu = run_pipe([send, zstd], self.work, stdout=out)
                started = time.monotonic()
                os.fsync(out.fileno())
                fsync = time.monotonic() - started
            self.fsyncs.append(fsync)
            previous = self.latest.get(f"{job}-{store}-pipe")
            if previous:
                previous[1].unlink(missing_ok=True)
            self.latest[f"{job}-{store}-pipe"] = (Path(), target)
            return Run(seconds + fsync, rss, cpu)
        key = f"pipe-{self.serial}.zst"
        upload = [PYTHON, "-c", UPLOAD, self.endpoint, BUCKET, key]
        try:
            return Run(*run_pipe([send, zstd, upload], self.work, env=self.env))
        finally:
            self.s3.delete_object(Bucket=BUCKET, Key=key)

    def restore_check(self, job: str, target: str) -> None:
        if guid(f"{target}@s") != guid(f"{self.src}/{job}@s"):
            raise RuntimeError(f"{target}@s has the wrong guid")

    def restore_zbak(self, job: str) -> Run:
        config, _ = self.latest[f"{job}-file-zbak"]
        self.serial += 1
        target = f"{self.dst}/zbak-{self.serial}"
        try:
            result = self.zbak(config, "restore", f"{self.src}/{job}", "--to", "@s",
                               "--into", target, "--from", "cold", "--yes")
            self.restore_check(job, target)
            return result
        finally:
            destroy(f"{target}@s", target)

    def restore_pipe(self, job: str) -> Run:
        _, file = self.latest[f"{job}-file-pipe"]
        self.serial += 1
        target = f"{self.dst}/pipe-{self.serial}"
        try:
            result = Run(*run_pipe([["zstd", "-d", "-q", "-c", str(file)],
                                    ["zfs", "receive", "-u", target]], self.work))
            self.restore_check(job, target)
            return result
        finally:
            destroy(f"{target}@s", target)

    def servers_cpu(self) -> float:
        """CPU seconds so far of the zfs-fuse daemon and moto's server."""
        pids = [self.daemon_pid] + ([self.moto.pid] if self.moto is not None else [])
        return sum(process_cpu(pid) for pid in pids if pid)

    def with_servers(self, run: Callable[[], Run]) -> Callable[[], Run]:
        """``run`` that also reports the servers' CPU seconds spent while it ran."""
        def counted() -> Run:
            before = self.servers_cpu()
            done = run()
            return dataclasses.replace(done, servers=self.servers_cpu() - before)
        return counted

    def fixed_cost(self) -> dict[str, float]:
        """Median wall seconds of zbak runs that move no data: ``--help`` (interpreter and
        command imports), ``archive --dry-run`` and ``restore --dry-run`` (plus the catalog,
        the snapshot listing and the plan) on the last zbak store of the ratio case."""
        config, _ = self.latest["ratio-file-zbak"]
        runs = {"--help": ["--help"],
                "archive --dry-run": ["archive", "--dry-run", "ratio"],
                "restore --dry-run": ["restore", f"{self.src}/ratio", "--to", "@s", "--into",
                                      f"{self.dst}/never", "--from", "cold", "--dry-run"]}
        return {name: statistics.median(self.zbak(config, *argv).seconds for _ in range(3))
                for name, argv in runs.items()}


class Results:
    """Runs per (case, tool), failures, and the table."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], list[Run]] = collections.defaultdict(list)
        self.failures: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        self.order: list[tuple[str, str]] = []

    def record(self, case: str, tool: str, run: Callable[[], Run]) -> None:
        key = (case, tool)
        if key not in self.order:
            self.order.append(key)
        try:
            done = run()
        except Failed as exc:
            self.failures[key].append(str(exc))
            print(f"  {case:14} {tool:32} FAILED: {exc}", flush=True)
            return
        self.runs[key].append(done)
        print(f"  {case:14} {tool:32} {done.seconds:7.2f} s  {done.cpu:6.2f} s CPU"
              f"  {done.servers:6.2f} s servers' CPU  {done.rss / MIB:6.1f} MiB", flush=True)

    def median(self, case: str, tool: str) -> float | None:
        values = [r.seconds for r in self.runs.get((case, tool), [])]
        return statistics.median(values) if values else None

    def peak(self, case: str, tool: str) -> int | None:
        values = [r.rss for r in self.runs.get((case, tool), [])]
        return max(values) if values else None

    def table(self, streams: dict[str, int], baseline: dict[str, str]) -> str:
        head = (f"{'case':14} {'tool':32} {'runs (s)':24} {'median':>6} {'spread':>6} "
                f"{'MB/s':>6} {'ratio':>6} {'CPU s':>6} {'srv s':>6} {'RSS MiB':>7}")
        lines = [head, "-" * len(head)]
        for case, tool in self.order:
            runs = self.runs.get((case, tool), [])
            fails = self.failures.get((case, tool), [])
            if not runs:
                lines.append(f"{case:14} {tool:32} FAILED {len(fails)}x: "
                             f"{fails[0] if fails else ''}")
                continue
            seconds = [r.seconds for r in runs]
            median = statistics.median(seconds)
            spread = max(seconds) - min(seconds)
            listed = " ".join(f"{v:.2f}" for v in seconds)
            base = self.median(case, baseline[case])
            ratio = f"{base / median:6.3f}" if base and tool != baseline[case] else ""
            cpu = statistics.median(r.cpu for r in runs)
            servers = statistics.median(r.servers for r in runs)
            lines.append(f"{case:14} {tool:32} {listed:24} {median:6.2f} {spread:6.2f} "
                         f"{streams[case] / 1e6 / median:6.1f} {ratio:>6} {cpu:6.2f} {servers:6.2f} "
                         f"{self.peak(case, tool) / MIB:7.1f}")
            if fails:
                lines.append(f"{'':14} {'':32} also FAILED {len(fails)}x: {fails[0]}")
        return "\n".join(lines)


PIPE_FILE = "zfs send | zstd -3 > FILE; fsync"
PIPE_S3 = "zfs send | zstd -3 | boto3 upload"
PIPE_RESTORE = "zstd -dc FILE | zfs receive -u"


def measure(bench: Bench, results: Results, reps: int) -> tuple[dict[str, int], dict[str, str]]:
    """Every case and tool; returns (stream bytes per case, baseline tool per case)."""
    streams: dict[str, int] = {}
    baseline: dict[str, str] = {}
    cases: list[tuple[str, str, dict[str, Callable[[], Run]]]] = [
        ("archive file", "ratio", {PIPE_FILE: lambda: bench.archive_pipe("ratio", "file"),
                                   "zbak archive": lambda: bench.archive_zbak("ratio", "file")}),
    ]
    if bench.args.s3:
        cases.append(("archive s3", "ratio",
                      {PIPE_S3: lambda: bench.archive_pipe("ratio", "s3"),
                       "zbak archive": lambda: bench.archive_zbak("ratio", "s3")}))
    cases.append(("restore file", "ratio", {PIPE_RESTORE: lambda: bench.restore_pipe("ratio"),
                                            "zbak restore": lambda: bench.restore_zbak("ratio")}))
    for case, job, tools in cases:
        tools = {tool: bench.with_servers(run) for tool, run in tools.items()}
        streams[case] = bench.stream[job]
        baseline[case] = next(iter(tools))
        print(f"{case}: {bench.stream[job]} bytes per stream, warm-up + {reps} reps", flush=True)
        for tool, run in tools.items():  # warm-up, untimed (also leaves the files to restore)
            try:
                run()
            except Failed as exc:
                print(f"  warm-up of {tool} FAILED: {exc}", flush=True)
        for rep in range(reps):
            for tool in rotate(list(tools), rep):
                results.record(case, tool, tools[tool])
    if bench.args.rss_size:
        big = [("rss archive", {PIPE_FILE: lambda: bench.archive_pipe("big", "file"),
                                "zbak archive": lambda: bench.archive_zbak("big", "file")})]
        if bench.args.s3:
            big.append(("rss archive s3",
                        {PIPE_S3: lambda: bench.archive_pipe("big", "s3"),
                         "zbak archive": lambda: bench.archive_zbak("big", "s3")}))
        big.append(("rss restore", {PIPE_RESTORE: lambda: bench.restore_pipe("big"),
                                    "zbak restore": lambda: bench.restore_zbak("big")}))
        for case, tools in big:
            tools = {tool: bench.with_servers(run) for tool, run in tools.items()}
            streams[case] = bench.stream["big"]
            baseline[case] = next(iter(tools))
            print(f"{case}: {bench.stream['big']} bytes, 1 run each", flush=True)
            for tool, run in tools.items():
                results.record(case, tool, run)
    return streams, baseline


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("512MiB"),
                        help="data in the dataset of the ratio runs (default 512MiB)")
    parser.add_argument("--rss-size", type=parse_size, default=parse_size("3GiB"),
                        help="data in the dataset of the peak-RSS run (default 3GiB; 0: skip)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--volume-size", default=None,
                        help="zbak store volume_size, e.g. 256MiB (default: zbak's own, 1 GiB)")
    parser.add_argument("--s3", action="store_true",
                        help="also archive to moto's S3 server (python -m moto.server)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 64MiB, rss-size 256MiB, 1 rep (unless given)")
    args = parser.parse_args()
    if args.quick:
        defaults = {"size": parse_size("512MiB"), "rss_size": parse_size("3GiB"), "reps": 3}
        quick = {"size": 64 * MIB, "rss_size": 256 * MIB, "reps": 1}
        for key, value in quick.items():
            if getattr(args, key) == defaults[key]:
                setattr(args, key, value)
    if os.geteuid() != 0:
        raise SystemExit("run as root (zfs-fuse)")
    for tool in ("zstd", "/usr/bin/time"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} missing: apt-get install {tool.rsplit('/', 1)[-1]}")

    why_not = testbed_zfs._enter_private_namespace()
    if why_not:
        raise SystemExit(f"cannot get a private zfs-fuse: {why_not}")
    workdir = Path(tempfile.mkdtemp(prefix="zbak-bench-archive-", dir="/var/tmp"))
    pidfile = workdir / "zfs-fuse.pid"
    sh("/usr/sbin/zfs-fuse", "--no-kstat-mount", "--pidfile", str(pidfile))
    testbed_zfs._wait_for_daemon("zpool")
    bench = Bench(args, workdir)
    bench.daemon_pid = int(pidfile.read_text().strip())
    try:
        bench.make_pools()
        started = time.monotonic()
        bench.make_data()
        print(f"data written in {time.monotonic() - started:.0f} s; {os.cpu_count()} cpus; "
              f"pools {bench.src} {bench.dst} in {workdir}", flush=True)
        if args.s3:
            bench.start_moto()
        results = Results()
        streams, baseline = measure(bench, results, args.reps)
        fixed = bench.fixed_cost()
        load = os.getloadavg()
        print()
        print(f"ratio dataset {human(args.size)} (stream {bench.stream['ratio']} bytes), "
              f"rss dataset {human(args.rss_size)}"
              + (f" (stream {bench.stream['big']} bytes)" if "big" in bench.stream else "")
              + f"; {args.reps} reps; zbak volume_size {args.volume_size or '1GiB (default)'}; "
              f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(results.table(streams, baseline))
        print("(ratio = pipe median / zbak median; MB/s = 10^6 raw stream bytes per second; "
              "CPU s = median user+system of the tool's processes; srv s = median CPU of the "
              "zfs-fuse daemon and moto's server during the run; RSS = peak of the largest "
              "process)")
        print(f"(fsync of the pipe's file: median {statistics.median(bench.fsyncs):.2f} s of its "
              "time; zbak runs that move no data: "
              + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in fixed.items()) + ")")
        print()
        for case in streams:
            tool = "zbak archive" if "archive" in case else "zbak restore"
            ours, theirs = results.median(case, tool), results.median(case, baseline[case])
            if ours and theirs:
                verdict = "met" if theirs / ours >= 0.9 else "MISSED"
                start = fixed["archive --dry-run" if "archive" in case else "restore --dry-run"]
                data = (f"{theirs / (ours - start):.3f}x" if ours > start else "n/a")
                print(f"target {case}: zbak {theirs / ours:.3f}x the pipe "
                      f"({streams[case]} bytes, >= 0.9): {verdict}; without zbak's "
                      f"{start:.2f} s no-data run: {data}")
            peak = results.peak(case, tool)
            if case.startswith("rss") and peak:
                verdict = "met" if peak <= 200 * MIB else "MISSED"
                print(f"target {case}: zbak peak RSS {peak / MIB:.1f} MiB (<= 200 MiB): {verdict}")
        return 0
    finally:
        if bench.moto is not None:
            bench.moto.send_signal(signal.SIGTERM)
            try:
                bench.moto.wait(10)
            except subprocess.TimeoutExpired:
                bench.moto.kill()
                bench.moto.wait()
        for pool in (bench.src, bench.dst):
            subprocess.run(["zpool", "destroy", "-f", pool], capture_output=True)
        testbed_zfs._stop_private_daemon(pidfile)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
