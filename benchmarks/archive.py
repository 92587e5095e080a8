#!/usr/bin/env python3
"""zbak archive and restore against the plain zstd pipe, side by side in one run (by hand, not CI).

Targets (docs/decisions.md#archive-at-the-speed-of-the-pipe-within-200-mib,
docs/decisions.md#restore-verifies-each-volume-before-it-is-received-and-reads-ahead,
docs/performance.md#archive-and-restore; ``FLOORS``): ``zbak archive`` >= 0.8x the raw baseline
to ``file://`` (``zfs send | zstd -3 -T0 > FILE``, one fsync at the end) and >= 0.9x to S3
(the same pipe into boto3's upload), on random and on compressible data, full and incremental,
with peak RSS <= 200 MiB at any stream size; ``zbak restore`` of a chain of 1 full + 30
incrementals >= 0.8x receiving the same volume files locally (``zstd -d < f | zfs receive`` per
stream, in order), from ``file://`` and S3; planning that restore (``zbak restore --dry-run``)
< 0.5 s. Each goal line gives the CPU seconds per GiB of raw stream of zbak and its baseline.

Cases (the rows of docs/performance.md#archive-and-restore), each timing the ``zbak`` command as a subprocess beside its
baseline, on snapshots of zfs-fuse datasets:

- ``archive full random``: ``--size`` bytes of random (incompressible) data, a fresh catalog
  and store per run (every run writes a full), against ``zfs send DS@s | zstd -3 -T0 > FILE``
  and an fsync of FILE (zbak's file store fsyncs each volume before it counts as stored);
- ``archive full 50%``: the same with data whose every other MiB is word text (zstd -3
  shrinks it to about 0.69 of its size);
- ``archive incremental``: a chain whose full (4 MiB) is archived, then ``--size`` bytes of
  random data and ``@b``: zbak writes the incremental (each run starts from a copy of the
  chain's catalog and store), against ``zfs send -i @a DS@b | zstd -3 -T0 > FILE; fsync``;
- with ``--s3``, the three again to moto's S3 server run out of process (``python -m
  moto.server``), against ``zfs send | zstd -3 -T0 | python -c 'boto3 upload_fileobj(stdin)'``
  (boto3's managed multipart upload with zbak's part size, 8 MiB, and its own 10 threads);
  with ``--zfs-uploader VENV`` also zfs_uploader 0.9.0 in the two full cases (a full of its
  own snapshot of the same data, uncompressed; a zfs shim for zfs-fuse:
  ``zfs_uploader_peer``);
- ``restore chain file``: a chain of a ``--chain-full`` full and 30 incrementals of
  ``--chain-step`` each (50 % compressible), archived by 31 ``zbak archive`` runs, restored
  by ``zbak restore DS --to @30 --into NEW --from STORE --yes``, against ``cat VOLUMES | zstd
  -d | zfs receive -u NEW2`` for each stream's volume files of that store, in order;
- ``restore chain s3`` (``--s3``): zbak restores the same chain from S3 (every volume
  downloaded and verified), against the same local pipe;
- ``restore --dry-run``: planning that 31-stream restore (zbak only);
- ``rss ...`` (``--rss-size``, one run each, 0 skips): archive (``file://`` and, with
  ``--s3``, S3) and restore of a 50 % compressible dataset of that size, for zbak's peak RSS
  at several GB (run once with ``--rss-size 2GiB`` and once with ``8GiB``).

zbak runs as its CLI (``python -m zrepl_py --config CFG ...``), so its times include the
interpreter start and imports (of modules compiled first, as an install has them) (the runs that move no data are printed: about 0.5 s here).
Peak RSS is GNU time's ``%M`` of each process (for zbak: the Python process; for the pipe:
the largest of its processes). After one untimed warm-up of each case, each case runs
``--reps`` times, tools alternated and their order rotated per repetition; the table gives
every run, the median, the spread (max - min), MB/s (10^6 bytes of the raw send stream per
second), the ratio (pipe median / zbak median: >= 1 means zbak is as fast), CPU seconds and
the peak RSS. Every received snapshot's guid is checked against the source's. The load
average (``uptime``) is printed before and after.

``--compare REV`` adds, to each archive and restore case, zbak run from the git revision
``REV`` of this repository (``main``, a commit: ``git archive`` into a temporary directory) as
one more tool, interleaved with the others: the old code beside the new in one run, on the
same data and load; ``--compare NAME=DIR`` runs the checkout ``DIR`` as tool ``NAME``.

``--profile DIR`` runs each zbak case once under py-spy (``pip install py-spy``; raw
collapsed stacks of every thread, idle ones included, one file per run) instead of timing,
and prints per thread where its samples went.

Runs as root on the test bed of tests/support: a private mount namespace with its own
zfs-fuse daemon, two pools on sparse files and a store directory in a temporary directory
under /var/tmp (about 2 x (3 x size + chain + rss-size) of real disk at most), all removed
at the end. Usage::

    .venv/bin/python benchmarks/archive.py [--size 512MiB] [--rss-size 2GiB] [--reps 5]
        [--chain-full 128MiB] [--chain-step 8MiB] [--s3] [--quick] [--profile DIR]
        [--only WORDS] [--compare REV|NAME=DIR] [--zfs-uploader VENV]
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import dataclasses
import functools
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import zfs_uploader_peer
from support.common import free_port
from zfsbench import (
    destroy,
    guid,
    last_line,
    private_zfs_fuse,
    rotate,
    sh,
    target_line,
    timed,
    usage,
)

MIB = 1024 * 1024
PYTHON = sys.executable
S3_KEYS = {"AWS_ACCESS_KEY_ID": "bench-access-key", "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
           "AWS_DEFAULT_REGION": "us-east-1"}
BUCKET = "zbak-bench"
PART_SIZE = 8 * MIB  # zbak's S3 part size (stores/s3.py DEFAULT_PART_SIZE), for the baseline too
DOWNLOADS = 4  # zbak restore's default [restore] download_concurrency (config/restore.py)
JOBS = ("rand", "text", "incr", "chain", "big")
UPLOAD = textwrap.dedent("""\
    import sys, boto3
    from boto3.s3.transfer import TransferConfig
    endpoint, bucket, key, part = sys.argv[1:5]
    boto3.client("s3", endpoint_url=endpoint).upload_fileobj(
        sys.stdin.buffer, bucket, key, Config=TransferConfig(multipart_chunksize=int(part)))
""")

DOWNLOAD = textwrap.dedent("""\
    import concurrent.futures, sys, boto3
    endpoint, bucket, prefix, workers = sys.argv[1:5]
    s3 = boto3.client("s3", endpoint_url=endpoint)
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix) for o in page.get("Contents", []) if "/vol-" in o["Key"]]
    def get(key):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        while body.read(8 << 20):
            pass
    with concurrent.futures.ThreadPoolExecutor(int(workers)) as pool:
        list(pool.map(get, keys))
""")
"""What reading a chain from S3 costs on this machine, apart from receiving it: every volume
read from moto's server (on the same 2 CPUs) by boto3, ``workers`` at a time, and thrown
away."""


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
    # The culprit is the first stage that failed on its own, not of a reader's SIGPIPE.
    failed = [(code, err, argv) for code, err, argv in zip(codes, errs, argvs, strict=True)
              if code != 0]
    for code, err, argv in sorted(failed, key=lambda f: f[0] in (141, -signal.SIGPIPE)):
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
        self.templates: dict[str, Path] = {}  # store kind -> config of the chain holding incr@a
        self.chain: dict[str, Path] = {}  # store kind -> config of the 31-stream chain
        self.fsyncs: list[float] = []  # seconds of the baseline's fsync, per file run
        self.caps = workdir / "capabilities"  # zbak's capability cache, shared by all runs
        self.profile_to: Path | None = None  # --profile: py-spy's raw stacks of zbak runs
        self.profiles = 0

    # -- set-up ------------------------------------------------------------------

    def make_pools(self) -> None:
        a = self.args
        data = 3 * a.size + a.chain_full + 30 * a.chain_step + a.rss_size
        sizes = {self.src: data * 1.3 + 512 * MIB,
                 self.dst: max(a.size, a.chain_full + 30 * a.chain_step, a.rss_size) * 1.5
                 + 512 * MIB}
        for pool, size in sizes.items():
            image = self.work / f"{pool}.img"
            sh("truncate", "-s", str(int(size)), str(image))
            sh("zpool", "create", "-m", str(self.work / pool), pool, str(image))

    def write_mixed(self, dataset: str, size: int, *, text_share: bool = True,
                    name: str = "data") -> None:
        """``size`` bytes in files of at most 256 MiB; each MiB alternately random and word
        text (all random without ``text_share``)."""
        rng = random.Random(4)
        words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 11)))
                 for _ in range(20000)]
        text = b" ".join(rng.choices(words, k=3 * MIB))[:16 * MIB]
        mount = self.work / dataset
        left, index, offset = size, 0, 0
        while left > 0:
            with open(mount / f"{name}{index:03d}.bin", "wb") as handle:
                for n in range(max(1, min(256 * MIB, left) // MIB)):
                    if n % 2 and text_share:
                        handle.write(text[offset:offset + MIB])
                        offset = (offset + MIB) % len(text)
                    else:
                        handle.write(os.urandom(MIB))
            left -= 256 * MIB
            index += 1

    def make_data(self) -> None:
        """The datasets of the archive cases (``rand``, ``text``, ``incr`` with its chain
        template archived before ``@b``) and of the rss runs (``big``)."""
        a = self.args
        for name, size, text in (("rand", a.size, False), ("text", a.size, True),
                                 ("big", a.rss_size, True)):
            if not size:
                continue
            dataset = f"{self.src}/{name}"
            sh("zfs", "create", dataset)
            self.write_mixed(dataset, size, text_share=text)
            sh("zfs", "snapshot", f"{dataset}@s")
            self.stream[name] = self.stream_size(["zfs", "send", f"{dataset}@s"])
        incr = f"{self.src}/incr"
        sh("zfs", "create", incr)
        self.write_mixed(incr, 4 * MIB, text_share=False, name="base")
        sh("zfs", "snapshot", f"{incr}@a")
        for store in self.stores():
            config = self.zbak_setup(store)
            self.zbak(config, "archive", "incr")
            self.templates[store] = config
        self.write_mixed(incr, a.size, text_share=False)
        sh("zfs", "snapshot", f"{incr}@b")
        self.stream["incr"] = self.stream_size(["zfs", "send", "-i", "@a", f"{incr}@b"])

    def make_chain(self) -> None:
        """``chain``: a full of ``--chain-full`` and 30 incrementals of ``--chain-step``
        (50 % compressible), each archived by its own ``zbak archive`` to every store."""
        a = self.args
        chain = f"{self.src}/chain"
        sh("zfs", "create", chain)
        configs = {store: self.zbak_setup(store) for store in self.stores()}
        for step in range(31):
            self.write_mixed(chain, a.chain_full if step == 0 else a.chain_step,
                             name=f"step{step:02d}-")
            sh("zfs", "snapshot", f"{chain}@{step}")
            for config in configs.values():
                self.zbak(config, "archive", "chain")
        self.chain = configs
        self.stream["chain"] = sum(
            self.stream_size(["zfs", "send", f"{chain}@0"] if step == 0 else
                             ["zfs", "send", "-i", f"@{step - 1}", f"{chain}@{step}"])
            for step in range(31))

    def stores(self) -> list[str]:
        return ["file", "s3"] if self.args.s3 else ["file"]

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
        import boto3  # only with --s3

        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                               aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
                               aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"])
        deadline = time.monotonic() + 30
        while True:
            try:
                self.s3.create_bucket(Bucket=BUCKET)
                return
            except Exception as exc:  # not listening yet
                if time.monotonic() > deadline or self.moto.poll() is not None:
                    raise RuntimeError(
                        f"moto server did not start; see {self.work}/moto.log") from exc
                time.sleep(0.3)

    def s3_empty(self, prefix: str) -> None:
        """Delete the bench's objects under ``prefix`` (moto keeps them in memory)."""
        paginator = self.s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix):
            for obj in page.get("Contents", []):
                self.s3.delete_object(Bucket=BUCKET, Key=obj["Key"])

    # -- zbak --------------------------------------------------------------------

    def zbak_setup(self, store: str, template: Path | None = None, *,
                   store_tables: str = "") -> Path:
        """A fresh state directory, catalog and config with a job per dataset archiving to
        the store ``cold`` (a new directory, or a new prefix of the bucket for ``s3``);
        with ``template`` (an earlier such config), a copy of its state and store;
        ``store_tables``: TOML that follows the store's keys (``[stores.cold.age]``)."""
        self.serial += 1
        run = self.work / f"zbak-{self.serial}"
        run.mkdir()
        if store == "file":
            url = f"file://{run / 'store'}"
            (run / "store").mkdir()
        else:
            url = f"s3://{BUCKET}/zbak-{self.serial}"
        s3 = (f'endpoint = "{self.endpoint}"\nregion = "us-east-1"\n'
              if store == "s3" else "")
        text = f'state_dir = "{run / "state"}"\n[stores.cold]\nurl = "{url}"\n{s3}{store_tables}'
        for job in JOBS:
            text += textwrap.dedent(f"""\
                [jobs.{job}]
                dataset = "{self.src}/{job}"
                [jobs.{job}.archive]
                store = "cold"
                compression_level = 3
                max_chain_length = 40
            """)
        config = run / "zbak.toml"
        config.write_text(text)
        if template is None:
            self.zbak(config, "init", "--no-checks")
            return config
        old = template.parent
        shutil.copytree(old / "state", run / "state")
        if store == "file":
            shutil.copytree(old / "store", run / "store", dirs_exist_ok=True)
        else:
            source = store_prefix(template)
            for page in self.s3.get_paginator("list_objects_v2").paginate(
                    Bucket=BUCKET, Prefix=source):
                for obj in page.get("Contents", []):
                    self.s3.copy_object(Bucket=BUCKET, CopySource={"Bucket": BUCKET,
                                                                   "Key": obj["Key"]},
                                        Key=store_prefix(config) + obj["Key"][len(source):])
        return config

    def zbak(self, config: Path, *args: str, tree: Path = REPO) -> Run:
        """Run ``python -m zrepl_py --config CFG ARGS`` with the shared capability cache
        (a real state directory keeps it between runs: zrepl_py/zfs/capability_cache.py),
        the code of the checkout ``tree`` (this one unless ``--compare``)."""
        state = Path(re.search(r'state_dir = "([^"]+)"', config.read_text()).group(1))
        if self.caps.is_dir():
            shutil.copytree(self.caps, state / "capabilities", dirs_exist_ok=True)
        log = config.parent / "time.log"
        command = [PYTHON, "-m", "zrepl_py", "--config", str(config), *args]
        if self.profile_to is not None and args[0] != "init":
            self.profiles += 1
            out = self.profile_to / f"{self.profiles:02d}-{args[0]}.txt"
            command = ["py-spy", "record", "--threads", "--idle", "--nonblocking",
                       "--rate", "100", "--format", "raw", "-o", str(out), "--", *command]
        argv = timed(command, log)
        with tempfile.TemporaryFile() as out:
            started = time.monotonic()
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tree,
                                  env={**self.env, "PYTHONPATH": str(tree)}, check=False)
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

    def archive_zbak(self, job: str, store: str, tree: Path = REPO) -> Run:
        """``zbak archive JOB`` into a fresh store (for ``incr``, a copy of the chain
        holding the full @a), which is dropped afterwards; ``tree``: the checkout whose code
        runs (``--compare``)."""
        config = self.zbak_setup(store, self.templates.get(store) if job == "incr" else None)
        try:
            return self.zbak(config, "archive", job, tree=tree)
        finally:
            self.drop_store(config)
            shutil.rmtree(config.parent / "state", ignore_errors=True)

    def drop_store(self, config: Path) -> None:
        """Remove a zbak run's store contents (keeps the disk and moto's memory small)."""
        url = re.search(r'url = "([^"]+)"', config.read_text()).group(1)
        if url.startswith("file://"):
            shutil.rmtree(url[len("file://"):], ignore_errors=True)
        else:
            self.s3_empty(store_prefix(config))

    def archive_pipe(self, job: str, store: str, after: Sequence[list[str]] = ()) -> Run:
        """The baseline of ``archive_zbak``: send | zstd -3 -T0 into a file (then fsync)
        or boto3's managed upload; ``after``: more stages between zstd and the file (the
        sealed bench's ``age -r``)."""
        send = (["zfs", "send", "-i", "@a", f"{self.src}/incr@b"] if job == "incr"
                else ["zfs", "send", f"{self.src}/{job}@s"])
        zstd = ["zstd", "-3", "-T0", "-q", "-c"]
        self.serial += 1
        if store == "file":
            target = self.work / f"pipe-{self.serial}.zst"
            try:
                with open(target, "wb") as out:
                    seconds, rss, cpu = run_pipe([send, zstd, *after], self.work, stdout=out)
                    started = time.monotonic()
                    os.fsync(out.fileno())
                    fsync = time.monotonic() - started
            finally:
                target.unlink(missing_ok=True)
            self.fsyncs.append(fsync)
            return Run(seconds + fsync, rss, cpu)
        key = f"pipe-{self.serial}.zst"
        upload = [PYTHON, "-c", UPLOAD, self.endpoint, BUCKET, key, str(PART_SIZE)]
        try:
            return Run(*run_pipe([send, zstd, upload], self.work, env=self.env))
        finally:
            self.s3.delete_object(Bucket=BUCKET, Key=key)

    def archive_zfs_uploader(self, job: str) -> Run:
        """``zfsup backup`` of ``SRC/JOB`` (a full of its own new snapshot, uncompressed) to
        a fresh prefix of the bucket with the zfs-fuse shim (``zfs_uploader_peer``); its
        snapshot and objects are removed afterwards (not timed)."""
        self.serial += 1
        run = self.work / f"zfsup-{self.serial}"
        run.mkdir()
        dataset, prefix = f"{self.src}/{job}", f"zfsup-{self.serial}"
        cfg = zfs_uploader_peer.config(
            run / "config.cfg", dataset=dataset, bucket=BUCKET, prefix=prefix,
            endpoint=self.endpoint, access_key=S3_KEYS["AWS_ACCESS_KEY_ID"],
            secret_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"])
        before = set(sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot").split())
        shim = zfs_uploader_peer.install_shim(self.work / "zfsup-shim")
        argv = timed([str(self.args.zfs_uploader / "bin" / "zfsup"), "--config-path", str(cfg),
                      "--log-path", str(run / "zfsup.log"), "backup"], run / "time.log")
        try:
            started = time.monotonic()
            done = subprocess.run(argv, cwd=run, capture_output=True, text=True, env={
                **self.env, "PATH": f"{shim}:{os.environ['PATH']}"}, check=False)
            seconds = time.monotonic() - started
            if done.returncode != 0 or "Finished full backup" not in done.stdout:
                raise Failed(f"zfsup exit {done.returncode}: "
                             f"{last_line(done.stderr or done.stdout)}")
        finally:
            for name in set(sh("zfs", "list", "-H", "-o", "name", "-t", "snapshot").split()
                            ) - before:
                if name.startswith(f"{dataset}@"):
                    sh("zfs", "destroy", name)
            self.s3_empty(prefix + "/")
        rss, cpu = usage(run / "time.log")
        return Run(seconds, rss, cpu)

    def check_restored(self, dataset: str, target: str, snapshot: str) -> None:
        if guid(f"{target}@{snapshot}") != guid(f"{self.src}/{dataset}@{snapshot}"):
            raise RuntimeError(f"{target}@{snapshot} has the wrong guid")

    def restore_zbak(self, config: Path, job: str, snapshot: str, *extra: str,
                     tree: Path = REPO) -> Run:
        """``zbak restore SRC/JOB --to @SNAPSHOT --into NEW --from cold --yes``; NEW is
        checked and destroyed afterwards (not timed); ``tree``: the checkout whose code runs
        (``--compare``)."""
        self.serial += 1
        target = f"{self.dst}/zbak-{self.serial}"
        try:
            result = self.zbak(config, "restore", f"{self.src}/{job}", "--to", f"@{snapshot}",
                               "--into", target, "--from", "cold", "--yes", *extra, tree=tree)
            self.check_restored(job, target, snapshot)
            return result
        finally:
            self.destroy_received(target)

    def restore_pipe(self, config: Path, job: str, snapshot: str, *,
                     identity: Path | None = None) -> Run:
        """``cat VOLUMES | zstd -d | zfs receive -u NEW`` for each stream of ``config``'s
        ``file://`` store, in chain order (a stream's prefix starts with its createtxg); with
        ``identity``, each volume is decrypted by ``age -d -i IDENTITY`` instead of ``cat``
        (docs/sealed.md's restore without zbak)."""
        store = Path(re.search(r'url = "file://([^"]+)"', config.read_text()).group(1))
        prefixes = sorted({path.parent for path in store.rglob("vol-*.zst")},
                          key=lambda path: path.name)
        self.serial += 1
        target = f"{self.dst}/pipe-{self.serial}"
        total = Run(0.0, 0, 0.0)
        try:
            for prefix in prefixes:
                volumes = [str(path) for path in sorted(prefix.glob("vol-*.zst"))]
                first = (["cat", *volumes] if identity is None else
                         ["sh", "-c", 'k=$1; shift; for v; do age -d -i "$k" "$v" || exit; done',
                          "sh", str(identity), *volumes])
                seconds, rss, cpu = run_pipe([first, ["zstd", "-d", "-q", "-c"],
                                              ["zfs", "receive", "-u", target]], self.work)
                total = Run(total.seconds + seconds, max(total.rss, rss), total.cpu + cpu)
            self.check_restored(job, target, snapshot)
            return total
        finally:
            self.destroy_received(target)

    def download_volumes(self, config: Path) -> Run:
        """``DOWNLOAD`` of every volume of ``config``'s S3 store (nothing received), with
        zbak's default download concurrency."""
        return Run(*run_pipe([[PYTHON, "-c", DOWNLOAD, self.endpoint, BUCKET,
                               store_prefix(config), str(DOWNLOADS)]], self.work, env=self.env))

    def restore_big(self) -> Run:
        """``zbak restore`` of ``big`` from a ``file://`` store archived for it (untimed)."""
        if "big" not in self.chain:
            self.chain["big"] = self.zbak_setup("file")
            self.zbak(self.chain["big"], "archive", "big")
        return self.restore_zbak(self.chain["big"], "big", "s")

    def destroy_received(self, target: str) -> None:
        """Destroy a restored dataset's snapshots (newest first), then the dataset."""
        listed = subprocess.run(["zfs", "list", "-H", "-o", "name", "-t", "snapshot", "-s",
                                 "createtxg", "-r", target], capture_output=True, text=True)
        destroy(*reversed(listed.stdout.split()), target)

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
        command imports) and ``archive --dry-run`` of the chain."""
        config = self.chain["file"]
        runs = {"--help": ["--help"], "archive --dry-run": ["archive", "--dry-run", "chain"]}
        return {name: statistics.median(self.zbak(config, *argv).seconds for _ in range(3))
                for name, argv in runs.items()}


def store_prefix(config: Path) -> str:
    """The bucket prefix (with a trailing ``/``) of an ``s3://`` store config."""
    url = re.search(r'url = "([^"]+)"', config.read_text()).group(1)
    return url.split("/", 3)[3] + "/"


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
            print(f"  {case:26} {tool:32} FAILED: {exc}", flush=True)
            return
        self.runs[key].append(done)
        print(f"  {case:26} {tool:32} {done.seconds:7.2f} s  {done.cpu:6.2f} s CPU"
              f"  {done.servers:6.2f} s servers' CPU  {done.rss / MIB:6.1f} MiB", flush=True)

    def median(self, case: str, tool: str) -> float | None:
        values = [r.seconds for r in self.runs.get((case, tool), [])]
        return statistics.median(values) if values else None

    def cpu_per_gib(self, case: str, tool: str, stream: int) -> float | None:
        """Median CPU seconds (user + system) of ``tool`` per GiB of the case's raw stream
        (``stream`` bytes)."""
        values = [r.cpu for r in self.runs.get((case, tool), [])]
        return statistics.median(values) * (1 << 30) / stream if values and stream else None

    def peak(self, case: str, tool: str) -> int | None:
        values = [r.rss for r in self.runs.get((case, tool), [])]
        return max(values) if values else None

    def table(self, streams: dict[str, int], baseline: dict[str, str]) -> str:
        head = (f"{'case':26} {'tool':32} {'runs (s)':24} {'median':>6} {'spread':>6} "
                f"{'MB/s':>6} {'ratio':>6} {'CPU s':>6} {'srv s':>6} {'RSS MiB':>7}")
        lines = [head, "-" * len(head)]
        for case, tool in self.order:
            runs = self.runs.get((case, tool), [])
            fails = self.failures.get((case, tool), [])
            if not runs:
                lines.append(f"{case:26} {tool:32} FAILED {len(fails)}x: "
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
            lines.append(f"{case:26} {tool:32} {listed:24} {median:6.2f} {spread:6.2f} "
                         f"{streams[case] / 1e6 / median:6.1f} {ratio:>6} {cpu:6.2f} {servers:6.2f} "
                         f"{self.peak(case, tool) / MIB:7.1f}")
            if fails:
                lines.append(f"{'':26} {'':32} also FAILED {len(fails)}x: {fails[0]}")
        return "\n".join(lines)


FLOORS = {"archive file": 0.8, "archive s3": 0.9, "restore": 0.8}
"""zbak's throughput against its baseline (baseline median / zbak median) each kind of case
must reach (docs/performance.md#the-cold-path-goals-and-its-peer): archive to ``file://``
>= 0.8x the pipe with its fsync, to S3 >= 0.9x boto3's upload of the same pipe, restore >= 0.8x
receiving the same local files."""
RSS_LIMIT = 200 * MIB
PLANNING_LIMIT = 0.5
"""Seconds ``zbak restore --dry-run`` of the 31-stream chain must stay under."""


def floor_of(case: str) -> float:
    """The throughput floor (``FLOORS``) of ``case`` (``archive full random file``, ``restore
    chain s3``, ``rss archive s3``, ...)."""
    verb, store = case.removeprefix("rss ").split()[0], case.split()[-1]
    return FLOORS["restore" if verb == "restore" else f"archive {store}"]


def _ratio_verdict(ours: float, theirs: float, *, floor: float, cpu: float,
                   base_cpu: float) -> str:
    """A throughput goal's verdict: zbak's median ``ours`` against its baseline's ``theirs``
    (seconds), with both sides' CPU seconds per GiB."""
    return (f"zbak {theirs / ours:.3f}x the baseline (>= {floor}):"
            f" {'MET' if theirs / ours >= floor else 'MISSED'};"
            f" CPU {cpu:.2f} s/GiB, baseline {base_cpu:.2f}")


def goal_lines(results: Results, streams: dict[str, int], baseline: dict[str, str],
               compare: Sequence[str] = ()) -> list[str]:
    """One line per goal (pure; ``zfsbench.target_line``), MET or MISSED: per case and zbak
    tool (this checkout's, then each ``--compare NAME``) its throughput against its baseline
    (``floor_of``) with both sides' CPU seconds per GiB of raw stream, its peak RSS in the
    ``rss`` cases, and the restore plan's time; MISSED with the failures when every zbak run
    of the case failed, not measured when the baseline's did or the case was not run."""
    lines = []
    for case in streams:
        verb = next((t for t in ("zbak archive", "zbak restore")
                     if (case, t) in results.runs or (case, t) in results.failures), None)
        if verb is None:
            continue
        base = baseline[case]
        base_cpu = results.cpu_per_gib(case, base, streams[case]) or 0.0
        floor = floor_of(case)
        for tool in [verb, *(f"{verb} ({name})" for name in compare)]:
            if (case, tool) not in results.runs and (case, tool) not in results.failures:
                continue
            failed = results.failures.get((case, tool), [])
            named = case if tool == verb else f"{case}, {tool}"
            if tool != base:
                cpu = results.cpu_per_gib(case, tool, streams[case]) or 0.0
                lines.append(target_line(
                    named, results.median(case, tool), results.median(case, base),
                    ours_failed=failed, reference_failed=results.failures.get((case, base), []),
                    peer=base, verdict=functools.partial(_ratio_verdict, floor=floor, cpu=cpu,
                                                         base_cpu=base_cpu)))
            if (case, ZFS_UPLOADER) in results.runs or (case, ZFS_UPLOADER) in results.failures:
                lines.append(target_line(
                    f"{named} vs {ZFS_UPLOADER}", results.median(case, tool),
                    results.median(case, ZFS_UPLOADER), ours_failed=failed,
                    reference_failed=results.failures.get((case, ZFS_UPLOADER), []),
                    peer=ZFS_UPLOADER, verdict=lambda ours, theirs: (
                        f"zbak {theirs / ours:.3f}x (> 1.0):"
                        f" {'MET' if theirs / ours > 1.0 else 'MISSED'}")))
            if tool == verb and (case, S3_GET) in results.runs:
                get = results.median(case, S3_GET) or 0.0
                base_s = results.median(case, base) or 0.0
                lines.append(f"  (reading every volume from this S3 alone, nothing received,"
                             f" took {get:.2f} s: {get / base_s if base_s else 0:.2f} of the"
                             " baseline's time)")
            if case.startswith("rss"):
                lines.append(target_line(
                    f"{named} peak RSS", results.peak(case, tool), RSS_LIMIT, ours_failed=failed,
                    verdict=lambda peak, limit: (f"zbak {peak / MIB:.1f} MiB (<= {limit // MIB}"
                                                 f" MiB): {'MET' if peak <= limit else 'MISSED'}")))
    planning = "restore --dry-run"
    if planning in streams:
        lines.append(target_line(
            f"{planning} of 31 streams", results.median(planning, "zbak restore --dry-run"),
            PLANNING_LIMIT, ours_failed=results.failures.get(
                (planning, "zbak restore --dry-run"), []),
            verdict=lambda ours, limit: (f"{ours:.2f} s (< {limit} s):"
                                         f" {'MET' if ours < limit else 'MISSED'}")))
    return lines


def summarize_profile(path: Path, top: int = 8) -> str:
    """Per thread of a py-spy ``raw`` profile (collapsed stacks, ``--threads --idle``): its
    share of the samples and the leaf frames it spent them in, most first."""
    per_thread: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        thread = re.sub(r" ?\(?0x[0-9a-f]+\)?", "", frames[0]).strip() or frames[0]
        leaf = re.sub(r" \(.*?/([^/]+)\)", r" (\1)", frames[-1])
        per_thread[thread][leaf] += int(count)
    total = sum(sum(c.values()) for c in per_thread.values()) or 1
    lines = []
    for thread, leaves in sorted(per_thread.items(), key=lambda t: -sum(t[1].values())):
        samples = sum(leaves.values())
        lines.append(f"  thread {thread}: {samples} samples ({100 * samples / total:.0f} %)")
        for leaf, count in leaves.most_common(top):
            lines.append(f"      {100 * count / samples:5.1f} %  {leaf[:110]}")
    return "\n".join(lines)


PIPE_FILE = "send | zstd -3 -T0 > FILE; fsync"
PIPE_S3 = "send | zstd -3 -T0 | boto3 upload"
PIPE_RESTORE = "cat VOLS | zstd -d | zfs recv, x31"
ZFS_UPLOADER = "zfs_uploader 0.9.0 (shim)"
S3_GET = "boto3 GET of the volumes only"


def measure(bench: Bench, results: Results, reps: int) -> tuple[dict[str, int], dict[str, str]]:
    """Every case and tool; returns (stream bytes per case, baseline tool per case)."""
    streams: dict[str, int] = {}
    baseline: dict[str, str] = {}
    cases: list[tuple[str, str, dict[str, Callable[[], Run]]]] = []
    for store, pipe in (("file", PIPE_FILE), ("s3", PIPE_S3)):
        if store not in bench.stores():
            continue
        for job, label in (("rand", "full random"), ("text", "full 50%"), ("incr", "incremental")):
            tools = {
                pipe: lambda job=job, store=store: bench.archive_pipe(job, store),
                "zbak archive": lambda job=job, store=store: bench.archive_zbak(job, store)}
            for name, tree in bench.args.compare:
                tools[f"zbak archive ({name})"] = (
                    lambda job=job, store=store, tree=tree: bench.archive_zbak(job, store, tree))
            if store == "s3" and job != "incr" and bench.args.zfs_uploader:
                tools[ZFS_UPLOADER] = lambda job=job: bench.archive_zfs_uploader(job)
            cases.append((f"archive {label} {store}", job, tools))
    for store in bench.stores():
        restores: dict[str, Callable[[], Run]] = {
            PIPE_RESTORE: lambda: bench.restore_pipe(bench.chain["file"], "chain", "30"),
            "zbak restore": lambda store=store: bench.restore_zbak(bench.chain[store], "chain",
                                                                 "30")}
        if store == "s3":
            restores[S3_GET] = lambda: bench.download_volumes(bench.chain["s3"])
        for name, tree in bench.args.compare:
            restores[f"zbak restore ({name})"] = (
                lambda store=store, tree=tree: bench.restore_zbak(bench.chain[store], "chain",
                                                                  "30", tree=tree))
        cases.append((f"restore chain {store}", "chain", restores))
    cases.append(("restore --dry-run", "chain", {
        "zbak restore --dry-run": lambda: bench.zbak(
            bench.chain["file"], "restore", f"{bench.src}/chain", "--to", "@30", "--into",
            f"{bench.dst}/never", "--from", "cold", "--dry-run")}))
    cases = [c for c in cases if not bench.args.only or any(
        word in c[0] for word in bench.args.only)]
    for case, job, tools in cases:
        run_case(bench, results, case, job, tools, reps, streams, baseline)
    if bench.args.rss_size:
        big: list[tuple[str, dict[str, Callable[[], Run]]]] = [
            ("rss archive file", {PIPE_FILE: lambda: bench.archive_pipe("big", "file"),
                                  "zbak archive": lambda: bench.archive_zbak("big", "file")})]
        if bench.args.s3:
            big.append(("rss archive s3", {PIPE_S3: lambda: bench.archive_pipe("big", "s3"),
                                           "zbak archive": lambda: bench.archive_zbak("big", "s3")}))
        big.append(("rss restore file", {"zbak restore": lambda: bench.restore_big()}))
        for case, tools in big:
            run_case(bench, results, case, "big", tools, 0, streams, baseline)
    return streams, baseline


def run_case(bench: Bench, results: Results, case: str, job: str,
             tools: dict[str, Callable[[], Run]], reps: int, streams: dict[str, int],
             baseline: dict[str, str]) -> None:
    """One untimed warm-up and ``reps`` interleaved runs of each tool (``reps`` 0: one
    timed run each, no warm-up)."""
    tools = {tool: bench.with_servers(run) for tool, run in tools.items()}
    streams[case] = bench.stream[job]
    baseline[case] = next(iter(tools))
    print(f"{case}: {bench.stream[job]} bytes, {f'warm-up + {reps} reps' if reps else '1 run'}"
          f" (load {' '.join(f'{x:.2f}' for x in os.getloadavg())})", flush=True)
    if bench.profile_to is not None:
        for tool, run in tools.items():
            if tool.startswith("zbak"):
                results.record(case, tool, run)
        return
    if reps:
        for tool, run in tools.items():
            try:
                run()
            except Failed as exc:
                print(f"  warm-up of {tool} FAILED: {exc}", flush=True)
    for rep in range(max(reps, 1)):
        for tool in rotate(list(tools), rep):
            results.record(case, tool, tools[tool])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--size", type=parse_size, default=parse_size("512MiB"),
                        help="data of the archive cases (default 512MiB)")
    parser.add_argument("--chain-full", type=parse_size, default=parse_size("128MiB"),
                        help="data of the restore chain's full (default 128MiB)")
    parser.add_argument("--chain-step", type=parse_size, default=parse_size("8MiB"),
                        help="data added before each of its 30 incrementals (default 8MiB)")
    parser.add_argument("--rss-size", type=parse_size, default=parse_size("2GiB"),
                        help="data of the peak-RSS runs (default 2GiB; 0: skip)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--s3", action="store_true",
                        help="also archive to and restore from moto's S3 server")
    parser.add_argument("--only", action="append", default=[], metavar="WORDS",
                        help="run only the cases whose name contains WORDS (repeatable, e.g."
                             " --only restore; the rss runs follow --rss-size)")
    parser.add_argument("--zfs-uploader", type=Path, default=None, metavar="VENV",
                        help="with --s3, also run zfs_uploader (installed in the venv VENV)"
                             " in the full S3 cases (benchmarks/zfs_uploader_peer.py)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 64MiB, chain 16MiB + 30 x 1MiB, rss-size 0, 1 rep")
    add_compare_and_profile(parser, "zbak archive and restore")
    args = parser.parse_args()
    if args.quick:
        args.size, args.chain_full, args.chain_step = 64 * MIB, 16 * MIB, MIB
        args.rss_size, args.reps = 0, 1
    if os.geteuid() != 0:
        raise SystemExit("run as root (zfs-fuse)")
    for tool in ("zstd", "/usr/bin/time") + (("py-spy",) if args.profile else ()):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} missing: apt-get install zstd time; pip install py-spy")

    # As installed (pip compiles the modules), not as a fresh checkout that, with
    # PYTHONDONTWRITEBYTECODE set, compiles every module again in every run (0.05-0.09 s of
    # an archive's start-up in py-spy).
    for tree in [REPO, *(tree for _, tree in args.compare)]:
        subprocess.run([PYTHON, "-m", "compileall", "-q", str(tree / "zrepl_py")], check=True)
    with bench_bed(Bench, args, "archive") as bench:
        return run(bench, args, bench.work)


def add_compare_and_profile(parser: argparse.ArgumentParser, what: str) -> None:
    """The options ``--compare`` (:func:`compare_tree`; ``what``: the runs it adds) and
    ``--profile`` of both benchmarks."""
    parser.add_argument("--compare", action="append", default=[], metavar="REV|NAME=DIR",
                        type=compare_tree,
                        help=f"also run {what} with the zbak of the git revision REV (a"
                             " temporary checkout) or of the checkout DIR, as tool REV or NAME")
    parser.add_argument("--profile", type=Path, default=None,
                        help="run each zbak case once under py-spy, raw stacks into this dir")


def compare_tree(text: str) -> tuple[str, Path]:
    """``--compare``'s value: ``NAME=DIR`` (a checkout made by hand) or a git revision of
    this repository (``main``, a commit), unpacked by ``git archive`` into a temporary
    directory removed at exit; returns (tool name, checkout)."""
    if "=" in text:
        name, _, tree = text.partition("=")
        return name, Path(tree)
    tree = Path(tempfile.mkdtemp(prefix="zbak-bench-compare-", dir="/var/tmp"))
    atexit.register(shutil.rmtree, tree, ignore_errors=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", text], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return text, tree


B = TypeVar("B", bound=Bench)


@contextlib.contextmanager
def bench_bed(kind: type[B], args: argparse.Namespace, name: str) -> Iterator[B]:
    """A ``kind`` bench on a new work directory under /var/tmp and a private zfs-fuse
    daemon (``zfsbench.private_zfs_fuse``); both removed at the end."""
    workdir = Path(tempfile.mkdtemp(prefix=f"zbak-bench-{name}-", dir="/var/tmp"))
    try:
        with private_zfs_fuse(workdir) as pidfile:
            bench = kind(args, workdir)
            bench.daemon_pid = int(pidfile.read_text().strip())
            yield bench
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(bench: Bench, args: argparse.Namespace, workdir: Path) -> int:
    """Make the pools and data, time every case and print the table and the targets."""
    try:
        load = os.getloadavg()
        bench.make_pools()
        if args.s3:
            bench.start_moto()
        started = time.monotonic()
        bench.make_data()
        bench.make_chain()
        print(f"data written and the chain archived in {time.monotonic() - started:.0f} s; "
              f"{os.cpu_count()} cpus; pools {bench.src} {bench.dst} in {workdir}", flush=True)
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            bench.profile_to = args.profile
        results = Results()
        streams, baseline = measure(bench, results, args.reps)
        if args.profile:
            for path in sorted(args.profile.glob("*.txt")):
                print(f"{path}:\n{summarize_profile(path)}")
            return 0
        fixed = bench.fixed_cost()
        after = os.getloadavg()
        print()
        print(f"archive cases {human(args.size)} of data; chain {human(args.chain_full)} + 30 x "
              f"{human(args.chain_step)}; rss {human(args.rss_size)}; {args.reps} reps; load "
              f"average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {after[0]:.2f} "
              f"{after[1]:.2f} {after[2]:.2f}")
        print(results.table(streams, baseline))
        print("(ratio = pipe median / zbak median; MB/s = 10^6 raw stream bytes per second; "
              "CPU s = median user+system of the tool's processes; srv s = median CPU of the "
              "zfs-fuse daemon and moto's server during the run; RSS = peak of the largest "
              "process)")
        print(f"(fsync of the pipe's file: median {statistics.median(bench.fsyncs or [0]):.2f} s "
              "of its time; zbak runs that move no data: "
              + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in fixed.items()) + ")")
        print()
        print("\n".join(goal_lines(results, streams, baseline,
                                    [name for name, _ in args.compare])))
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


if __name__ == "__main__":
    sys.exit(main())
