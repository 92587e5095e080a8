#!/usr/bin/env python3
"""``zbak copy`` beside its baselines, in one run (by hand, not CI).

Targets (docs/copies.md, docs/decisions.md#s3-to-s3-copies-stay-inside-s3):

- ``file -> s3``: ``zbak copy`` of a chain of ``--chain`` bytes (default 1 GiB: a full of four
  volumes and four one-volume incrementals, random bytes) from a ``file://`` store to S3
  (moto's server, out of process) >= 0.9x uploading the same volume files, in the same order,
  with boto3's ``upload_file`` (``TransferConfig``: zbak's part size, 8 MiB, and its upload
  concurrency, 4; ``ChecksumAlgorithm=SHA256`` as zbak sends);
- ``s3 -> s3``: ``zbak copy`` of that chain from its bucket to another bucket on the same
  endpoint: the bytes the host reads (every answer's body, counted by ``tests/support/s3proxy.py``
  in front of moto) ~0 against the chain's size; the same copy between stores in other regions
  (so streamed through the host) is timed beside it;
- ``no-op``: ``zbak copy`` of a job whose ``--noop-streams`` streams (default 1,000: 10
  datasets of 4 chains of 25, ``tests/support/generated.py`` with tiny real volumes) are already
  in both ``file://`` stores (the second filled by an untimed ``zbak copy``) < 2 s.

The chain's catalog rows and volume files are written directly (``Generated``): ``zbak copy``
reads only the catalog and the stores, never ZFS. Each case runs ``--reps`` times after one
untimed warm-up, its tools alternated and their order rotated per repetition; every timed copy
starts from a fresh copy of the state directory and an empty target bucket. zbak runs as its
CLI (``python -m zrepl_py``) under GNU time (peak RSS, CPU). The table gives every run, the
median and the spread; the load average is printed before and after.

(Named ``copies.py``: a script ``copy.py`` would stand in for the standard library's ``copy``
module, its directory being first on ``sys.path``.) Usage::

    .venv/bin/python benchmarks/copies.py [--chain 1GiB] [--reps 3] [--noop-streams 1000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from support.common import free_port
from support.generated import Generated
from support.s3proxy import S3Proxy
from zfsbench import load, rotate, timed, usage

from zrepl_py.catalog.db import make_engine, upgrade

MIB = 1 << 20
PART_SIZE = 8 * MIB  # zbak's S3 part size (stores/s3.py DEFAULT_PART_SIZE)
CONCURRENCY = 4  # zbak's upload_concurrency default (stores/settings.py)
PYTHON = sys.executable
KEYS = {"AWS_ACCESS_KEY_ID": "bench-access-key", "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
        "AWS_DEFAULT_REGION": "us-east-1"}
FLOOR, NOOP_LIMIT = 0.9, 2.0
UPLOAD = textwrap.dedent("""\
    import sys, boto3
    from boto3.s3.transfer import TransferConfig
    endpoint, bucket, part, concurrency, root, *keys = sys.argv[1:]
    config = TransferConfig(multipart_threshold=int(part), multipart_chunksize=int(part),
                            max_concurrency=int(concurrency))
    client = boto3.client("s3", endpoint_url=endpoint)
    for key in keys:
        client.upload_file(f"{root}/{key}", bucket, f"zbak/{key}", Config=config,
                           ExtraArgs={"ChecksumAlgorithm": "SHA256"})
""")


class RealVolumes(Generated):
    """``Generated`` with volumes of random bytes and their true SHA-256, so ``zbak copy``
    can copy them."""

    def write_volume(self, path: Path, stored: int) -> str:
        digest = hashlib.sha256()
        with open(path, "wb") as handle:
            for at in range(0, stored, 8 * MIB):
                chunk = os.urandom(min(8 * MIB, stored - at))
                digest.update(chunk)
                handle.write(chunk)
        return digest.hexdigest()


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": MIB, "g": 1 << 30}
    text = text.lower().removesuffix("ib").removesuffix("b")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


class Bench:
    """The moto server, the generated sites and the timed runs."""

    def __init__(self, work: Path):
        self.work = work
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ZBAK_", "AWS_"))}
        self.env.update(KEYS, ZBAK_LOG_LEVEL="WARNING")
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.moto = subprocess.Popen([PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                      str(port)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=self.env)
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                               aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                               aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"])
        self.buckets = 0
        self.bucket()  # waits for the server
        self.runs: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
        self.read: dict[str, list[int]] = {}

    def close(self) -> None:
        self.moto.terminate()
        self.moto.wait()

    def bucket(self) -> str:
        """A new, empty bucket."""
        self.buckets += 1
        name = f"zbak-bench-{self.buckets}"
        deadline = time.monotonic() + 30
        while True:
            try:
                self.s3.create_bucket(Bucket=name)
                return name
            except Exception:  # not listening yet
                if time.monotonic() > deadline or self.moto.poll() is not None:
                    raise
                time.sleep(0.3)

    def site(self, name: str, streams: RealVolumes | None, stores: dict[str, str],
             *, datasets: int) -> Path:
        """A config of ``stores`` (name -> the lines of its table; the first is the archive
        store) and job ``bench`` over ``bench/root`` (recursive), and its state directory with
        the ``datasets`` datasets of ``streams`` (a generator not yet run) in the first."""
        root = self.work / name
        (root / "state").mkdir(parents=True, mode=0o700)
        tables = "".join(f"[stores.{n}]\nvolume_size = \"5GiB\"\n{body}\n"
                         for n, body in stores.items())
        config = root / "zbak.toml"
        config.write_text(f'state_dir = "{root / "state"}"\n{tables}[jobs.bench]\n'
                          'dataset = "bench/root"\nrecursive = true\n[jobs.bench.archive]\n'
                          f'store = "{next(iter(stores))}"\n')
        engine = make_engine(f"sqlite:///{root / 'state' / 'catalog.sqlite'}")
        try:
            upgrade(engine)
            if streams is not None:
                streams.engine = engine
                streams.datasets(datasets)
        finally:
            engine.dispose()
        return config

    def zbak(self, config: Path, *args: str) -> tuple[float, float, int]:
        """Run ``zbak --config CONFIG ARGS`` under GNU time: (wall s, CPU s, peak RSS)."""
        log = self.work / "time.log"
        started = time.monotonic()
        done = subprocess.run(timed([PYTHON, "-m", "zrepl_py", "--config", str(config), *args],
                                    log), env=self.env, capture_output=True, text=True)
        seconds = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"zbak {' '.join(args)}: {done.returncode}: {done.stderr[-500:]}")
        rss, cpu = usage(log)
        return seconds, cpu, rss

    def record(self, case: str, tool: str, run: Callable[[], tuple[float, float, int]],
               timed_run: bool) -> None:
        result = run()
        print(f"  {case:12} {tool:40} {result[0]:7.2f} s {result[1]:6.2f} s CPU"
              f" {result[2] / MIB:6.1f} MiB{'' if timed_run else '  (warm-up)'}", flush=True)
        if timed_run:
            self.runs.setdefault((case, tool), []).append(result)

    def median(self, case: str, tool: str) -> float:
        return statistics.median(r[0] for r in self.runs[(case, tool)])


def fresh_state(config: Path, into: Path, replace: dict[str, str]) -> Path:
    """A copy of ``config``'s site (config and state directory) under ``into``, with each
    ``replace`` key of the config replaced by its value; the new config."""
    shutil.copytree(config.parent / "state", into / "state")
    text = config.read_text().replace(str(config.parent / "state"), str(into / "state"))
    for old, new in replace.items():
        text = text.replace(old, new)
    (into / "zbak.toml").write_text(text)
    return into / "zbak.toml"


def file_to_s3(bench: Bench, chain: int, reps: int) -> Path:
    """The ``file -> s3`` case; the config of its last zbak copy."""
    volume = chain // 8
    streams = RealVolumes(None, bench.work / "chain" / "a", "bench/root", job="bench",  # type: ignore[arg-type]
                          store_name="a", chains=1, chain_length=5)
    streams.full_volumes = [(volume, volume)] * 4
    streams.incremental_volumes = [(volume, volume)]
    (bench.work / "chain" / "a").mkdir(parents=True)
    config = bench.site("chain", streams, {
        "a": f'url = "file://{bench.work / "chain" / "a"}"',
        "cloud": f'url = "s3://BUCKET/zbak"\nendpoint = "{bench.endpoint}"\n'
                 'region = "us-east-1"'}, datasets=1)
    engine = make_engine(f"sqlite:///{config.parent / 'state' / 'catalog.sqlite'}")
    with engine.connect() as conn:
        keys = [k for (k,) in conn.execute(sa.text(
            "select v.key from volumes v join streams s on s.id = v.stream_id"
            " order by s.to_createtxg, v.\"index\""))]
    engine.dispose()
    last: list[Path] = []
    n = 0

    def zbak_copy() -> tuple[float, float, int]:
        nonlocal n
        n += 1
        bucket = bench.bucket()
        site = fresh_state(config, bench.work / f"file-s3-{n}", {"BUCKET": bucket})
        last.append(site)
        return bench.zbak(site, "copy", "bench", "--to", "cloud")

    def upload_file() -> tuple[float, float, int]:
        log = bench.work / "time.log"
        started = time.monotonic()
        subprocess.run(timed([PYTHON, "-c", UPLOAD, bench.endpoint, bench.bucket(),
                              str(PART_SIZE), str(CONCURRENCY), str(bench.work / "chain" / "a"),
                              *keys], log), env=bench.env, check=True)
        seconds = time.monotonic() - started
        rss, cpu = usage(log)
        return seconds, cpu, rss

    tools = [("zbak copy", zbak_copy), ("boto3 upload_file", upload_file)]
    for rep in range(reps + 1):
        for tool, run in rotate(tools, rep):
            bench.record("file -> s3", tool, run, rep > 0)
    return last[-1]


def s3_to_s3(bench: Bench, site: Path, reps: int) -> None:
    """The ``s3 -> s3`` case, from the ``cloud`` store of ``site``."""
    read = [0]

    def count(method: str, path: str, status: int, body: bytes) -> tuple[int, bytes]:
        read[0] += len(body)
        return status, body

    proxy = S3Proxy(bench.endpoint, rewrite=count)
    n = 0
    try:
        def copy(region: str) -> Callable[[], tuple[float, float, int]]:
            def run() -> tuple[float, float, int]:
                nonlocal n
                n += 1
                config = fresh_state(site, bench.work / f"s3-s3-{n}", {
                    bench.endpoint: proxy.url})
                with open(config, "a") as handle:
                    handle.write(f'[stores.copy]\nurl = "s3://{bench.bucket()}/zbak"\n'
                                 f'endpoint = "{proxy.url}"\nregion = "{region}"\n')
                read[0] = 0
                done = bench.zbak(config, "copy", "bench", "--from", "cloud", "--to", "copy")
                bench.read.setdefault(region, []).append(read[0])
                return done
            return run

        tools = [("zbak copy, one endpoint (inside S3)", copy("us-east-1")),
                 ("zbak copy, other region (streamed)", copy("eu-west-1"))]
        for rep in range(reps + 1):
            for tool, run in rotate(tools, rep):
                bench.record("s3 -> s3", tool, run, rep > 0)
    finally:
        proxy.close()


def noop(bench: Bench, streams: int, reps: int) -> None:
    """The ``no-op`` case."""
    datasets = max(1, streams // 100)
    store_a, store_b = bench.work / "noop" / "a", bench.work / "noop" / "b"
    store_a.mkdir(parents=True)
    store_b.mkdir()
    generated = RealVolumes(None, store_a, "bench/root", job="bench",  # type: ignore[arg-type]
                            store_name="a", chains=4, chain_length=25)
    config = bench.site("noop", generated, {"a": f'url = "file://{store_a}"',
                                            "b": f'url = "file://{store_b}"'},
                        datasets=datasets)
    started = time.monotonic()
    bench.zbak(config, "copy", "bench", "--to", "b")
    print(f"  no-op: {datasets * 100} streams copied to b in {time.monotonic() - started:.0f} s"
          " (set-up)", flush=True)
    for rep in range(reps + 1):
        bench.record("no-op", f"zbak copy ({datasets * 100} streams)",
                     lambda: bench.zbak(config, "copy", "bench", "--to", "b"), rep > 0)


def report(bench: Bench, chain: int) -> None:
    print("\ncase         tool                                     runs (s)               "
          " median spread  CPU s  RSS MiB")
    for (case, tool), runs in bench.runs.items():
        seconds = [r[0] for r in runs]
        print(f"{case:12} {tool:40} {' '.join(f'{s:.2f}' for s in seconds):22}"
              f" {statistics.median(seconds):6.2f} {max(seconds) - min(seconds):6.2f}"
              f" {statistics.median(r[1] for r in runs):6.2f}"
              f" {max(r[2] for r in runs) / MIB:7.1f}")
    print()
    if ("file -> s3", "zbak copy") in bench.runs:
        ratio = bench.median("file -> s3", "boto3 upload_file") / bench.median("file -> s3",
                                                                             "zbak copy")
        print(f"target file -> s3 of {chain / MIB:.0f} MiB: zbak {ratio:.3f}x boto3 upload_file"
              f" (>= {FLOOR}): {'met' if ratio >= FLOOR else 'MISSED'}")
    if "us-east-1" in bench.read:
        inside, streamed = max(bench.read["us-east-1"]), max(bench.read.get("eu-west-1", [0]))
        print(f"target s3 -> s3 on one endpoint: the host read at most {inside:,} bytes of"
              f" answers per copy of a {chain:,}-byte chain (streamed: {streamed:,}):"
              f" {'met' if inside < chain / 100 else 'MISSED'}")
    noops = [k for k in bench.runs if k[0] == "no-op"]
    if noops:
        seconds = bench.median(*noops[0])
        print(f"target no-op {noops[0][1]}: {seconds:.2f} s (< {NOOP_LIMIT} s):"
              f" {'met' if seconds < NOOP_LIMIT else 'MISSED'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chain", type=parse_size, default=1 << 30)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--noop-streams", type=int, default=1000)
    parser.add_argument("--only", default="file,s3,noop")
    args = parser.parse_args()
    only = set(args.only.split(","))
    print(f"load before: {load()}", flush=True)
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="zbak-bench-copy-") as work:
        bench = Bench(Path(work))
        try:
            if only & {"file", "s3"}:
                site = file_to_s3(bench, args.chain, args.reps if "file" in only else 0)
                if "s3" in only:
                    s3_to_s3(bench, site, args.reps)
            if "noop" in only:
                noop(bench, args.noop_streams, args.reps)
        finally:
            bench.close()
        print(f"load after: {load()}")
        report(bench, args.chain)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
