#!/usr/bin/env python3
"""The catalog commands at scale, timed as the user runs them (by hand, not CI).

Targets (docs/decisions.md#catalog-commands-stay-fast-at-100000-streams): ``zbak prune --dry-run``
(table and ``--json``), ``zbak audit`` (graph and objects levels), ``zbak list streams`` and ``zbak
status`` over a catalog of 100,000 streams each < 2 s wall and < 300 MiB peak RSS on SQLite, and at
1,000,000 streams no worse than linear.

Per scale (``--scales``, default ``10k,100k``; ``1M`` takes about 20 min to build and
13 GB of disk) a catalog, a ``file://`` store and a config are generated once under
``--workdir`` (reused by later runs with the same scale) by ``tests/support/generated.py``,
as ``zbak archive`` builds them: ``--datasets-per-10k`` datasets per 10,000 streams
(default 100) under one recursive job, each with 4 chains of 25 streams (a full of three
volumes and 24 ``-I`` incrementals of one volume carrying two snapshots each), every
snapshot in the snapshots table (the oldest quarter destroyed), one successful archive run
per dataset; the three older chains are ``verified`` (a day ago), the newest ``uploaded``;
``keep_chains = 2``, so a prune plan deletes the oldest two chains of every dataset (the
worst case: the store is listed and every dataset re-checked). The store holds every volume
(sparse files of the recorded size), ``manifest.json`` and ``manifest.json.copy``
(sealed, agreeing with the catalog). The job's source is a dataset of a zfs-fuse pool of a
private zfs-fuse (the catalog's datasets are children that were destroyed since, which
every command treats like live ones but for the source listing); the job has no
replication target.

Timed commands (``zbak --config CFG ...`` as subprocesses of GNU time, output to a pipe as
cron or a pager would see it, so tables are the summaries, not every row)::

    prune --dry-run            prune --dry-run --json
    audit (first)              the first audit: every manifest read, stamps recorded
    audit                      graph + objects levels with stamps from an earlier audit
    list streams               list streams --json
    status

``audit (first)`` runs once per scale (the catalog is copied back between its
repetitions so each is a first). Each case runs ``--reps`` times (default 3) after one
warm-up, cases interleaved and their order rotated per repetition; the table gives the
median wall time, the spread (max - min), the median CPU seconds and the peak RSS of the
zbak process (``%M`` of GNU time), and the load average (``uptime``) before and after.

Runs as root: a private mount namespace with its own zfs-fuse daemon (tests/support/zfs.py).
Usage::

    .venv/bin/python benchmarks/catalog.py [--scales 10k,100k,1M] [--reps 3]
        [--workdir /var/tmp/zbak-bench-catalog] [--only CASE,...] [--keep]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from support.generated import Generated, archive_config
from zfsbench import load, private_zfs_fuse, rotate, sh, timed, usage

from zrepl_py.catalog.db import make_engine, upgrade
from zrepl_py.catalog.models import stream_table

POOL = "zbench"
STORE, JOB = "cold", "bench"
CHAINS, CHAIN_LENGTH, KEEP_CHAINS = 4, 25, 2
PYTHON = sys.executable
CASES = {
    "prune --dry-run": ["prune", "--dry-run"],
    "prune --dry-run --json": ["prune", "--dry-run", "--json"],
    "audit": ["audit"],
    "list streams": ["list", "streams"],
    "list streams --json": ["list", "streams", "--json"],
    "status": ["status"],
}
FIRST_AUDIT = "audit (first)"


def parse_scale(text: str) -> int:
    """``10k``, ``100k``, ``1M``, ``25000`` -> streams."""
    text = text.strip().lower()
    factor = {"k": 1000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * factor)


@dataclasses.dataclass
class Scale:
    """One generated catalog, store and config."""

    streams: int
    datasets: int
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "zbak.toml"

    @property
    def catalog(self) -> Path:
        return self.root / "state" / "catalog.sqlite"

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def done(self) -> Path:
        return self.root / "built"


def build(scale: Scale) -> None:
    """Generate the scale's catalog, store and config (unless already built)."""
    if scale.done.exists():
        return
    shutil.rmtree(scale.root, ignore_errors=True)
    (scale.root / "state").mkdir(parents=True, mode=0o700)
    scale.store.mkdir()
    archive_config(scale.config, state=scale.root / "state", store=scale.store,
                   root=f"{POOL}/bench", job=JOB, store_name=STORE, keep_chains=KEEP_CHAINS)
    engine = make_engine(f"sqlite:///{scale.catalog}")
    started = time.monotonic()
    try:
        upgrade(engine)
        generated = Generated(engine, scale.store, f"{POOL}/bench", store_name=STORE, job=JOB,
                              chains=CHAINS, chain_length=CHAIN_LENGTH)
        for d in range(1, scale.datasets + 1):
            generated.dataset(d)
            if d % 50 == 0:
                generated.flush()
                print(f"\r  {scale.streams:,} streams: {d}/{scale.datasets} datasets",
                      end="", flush=True)
        generated.flush()
    finally:
        engine.dispose()
    scale.done.write_text(f"{scale.streams}\n")
    print(f"\r  {scale.streams:,} streams built in {time.monotonic() - started:.0f} s"
          + " " * 20, flush=True)


@dataclasses.dataclass(frozen=True)
class Timed:
    """One timed run: wall seconds, CPU seconds, peak RSS bytes, exit status, output bytes."""

    seconds: float
    cpu: float
    rss: int
    code: int
    output: int


def zbak(scale: Scale, args: list[str], work: Path) -> Timed:
    """``python -m zrepl_py --config CFG ARGS`` under GNU time, stdout to a pipe."""
    log = work / "time.log"
    argv = timed([PYTHON, "-m", "zrepl_py", "--config", str(scale.config), *args], log)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZBAK_", "AWS_"))}
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, cwd=REPO, env=env, check=False)
    seconds = time.monotonic() - started
    rss, cpu = usage(log)
    if done.returncode not in (0, 4):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        print(f"    zbak {' '.join(args)} exit {done.returncode}: {' | '.join(tail)}", flush=True)
    return Timed(seconds, cpu, rss, done.returncode, len(done.stdout))


def first_audit(scale: Scale, work: Path) -> Timed:
    """An audit of a catalog no audit has stamped (every manifest is read), on a copy: the
    catalog file is put back afterwards."""
    saved = work / "catalog.before-audit"
    shutil.copy2(scale.catalog, saved)
    try:
        forget_stamps(scale)
        return zbak(scale, ["audit"], work)
    finally:
        os.replace(saved, scale.catalog)


def forget_stamps(scale: Scale) -> None:
    """Clear every manifest stamp (``catalog.stamps``), as in a catalog never audited."""
    engine = make_engine(f"sqlite:///{scale.catalog}")
    try:
        with engine.begin() as conn:
            conn.execute(sa.update(stream_table).values(manifest_seen=None, manifest_read_at=None))
    finally:
        engine.dispose()


def measure(scale: Scale, cases: list[str], reps: int, work: Path) -> dict[str, list[Timed]]:
    """Warm up, then ``reps`` interleaved rounds of every case, order rotated per round."""
    runs: dict[str, list[Timed]] = {case: [] for case in cases}

    def one(case: str) -> Timed:
        return first_audit(scale, work) if case == FIRST_AUDIT else zbak(scale, CASES[case], work)

    # The catalog at the schema's head (a catalog kept from an older zbak is upgraded), then
    # an audit, so the plain "audit" case finds the stamps of an earlier audit.
    zbak(scale, ["init", "--no-checks"], work)
    zbak(scale, ["audit"], work)
    for case in cases:
        one(case)
    for rep in range(reps):
        for case in rotate(cases, rep):
            runs[case].append(one(case))
    return runs


PROFILE = """\
import cProfile, sys, time
from zrepl_py.cli import main
profile = cProfile.Profile(time.process_time)
profile.runcall(main, sys.argv[2:])
profile.dump_stats(sys.argv[1])
"""


def profile(scale: Scale, case: str, work: Path) -> None:
    """Run ``case`` once under cProfile counting CPU time (the main thread's: a listing
    running ahead in another thread is not in it); print the 40 functions that spent the
    most, by their own time and then by cumulative time."""
    out = work / "profile.out"
    args = ["audit"] if case == FIRST_AUDIT else CASES[case]
    if case == FIRST_AUDIT:
        shutil.copy2(scale.catalog, work / "catalog.before-audit")
        forget_stamps(scale)
    subprocess.run([PYTHON, "-c", PROFILE, str(out), "--config", str(scale.config), *args],
                   stdout=subprocess.DEVNULL, cwd=REPO, check=False)
    if case == FIRST_AUDIT:
        os.replace(work / "catalog.before-audit", scale.catalog)
    import pstats

    print(f"--- {case} at {scale.streams:,} streams (CPU seconds)")
    for order in ("tottime", "cumulative"):
        pstats.Stats(str(out)).sort_stats(order).print_stats(40)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="10k,100k")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--datasets-per-10k", type=int, default=100)
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/zbak-bench-catalog"))
    parser.add_argument("--only", help="comma-separated cases (default: all)")
    parser.add_argument("--profile", metavar="CASE",
                        help="run CASE once under cProfile at each scale and print where the"
                             " time goes instead of timing")
    parser.add_argument("--keep", action="store_true",
                        help="keep the generated catalogs and stores for the next run")
    args = parser.parse_args()
    cases = [*CASES, FIRST_AUDIT]
    if args.only:
        cases = [c.strip() for c in args.only.split(",")]
        unknown = [c for c in cases if c not in CASES and c != FIRST_AUDIT]
        if unknown:
            raise SystemExit(f"unknown cases {unknown}; known: {[*CASES, FIRST_AUDIT]}")
    if os.geteuid() != 0:
        raise SystemExit("run as root (zfs-fuse)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.workdir))
    scales: list[Scale] = []
    try:
        with private_zfs_fuse(work):
            run_scales(args, cases, work, scales)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            for scale in scales:
                shutil.rmtree(scale.root, ignore_errors=True)


def run_scales(args: argparse.Namespace, cases: list[str], work: Path,
               scales: list[Scale]) -> None:
    """The source pool, each scale built (appended to ``scales``), then profile or measure
    and print the table."""
    image = work / "pool.img"
    try:
        sh("truncate", "-s", "256M", str(image))
        sh("zpool", "create", "-m", str(work / POOL), POOL, str(image))
        sh("zfs", "create", f"{POOL}/bench")
        sh("zfs", "snapshot", f"{POOL}/bench@zbak_00000")
        for text in args.scales.split(","):
            streams = parse_scale(text)
            datasets = max(1, streams * args.datasets_per_10k // 10_000)
            if datasets * CHAINS * CHAIN_LENGTH != streams:
                raise SystemExit(f"{text}: not a multiple of {CHAINS * CHAIN_LENGTH} streams"
                                 f" x datasets")
            scale = Scale(streams, datasets, args.workdir / f"s{streams}")
            print(f"building {streams:,} streams ({datasets} datasets) in {scale.root}",
                  flush=True)
            build(scale)
            scales.append(scale)
        if args.profile:
            for scale in scales:
                profile(scale, args.profile, work)
            return
        print(f"before: load average {load()} ({os.cpu_count()} cores)", flush=True)
        results = []
        for scale in scales:
            runs = measure(scale, cases, args.reps, work)
            for case in cases:
                results.append((scale, case, runs[case]))
                times = [r.seconds for r in runs[case]]
                print(f"  {scale.streams:>9,} {case:<24} {statistics.median(times):7.2f} s",
                      flush=True)
        print(f"after: load average {load()}")
        print(f"\n{'streams':>9}  {'command':<24} {'median s':>8} {'spread':>7} {'CPU s':>6}"
              f" {'peak RSS':>9} {'output':>9}  exit")
        for scale, case, runs in results:
            times = [r.seconds for r in runs]
            print(f"{scale.streams:>9,}  {case:<24} {statistics.median(times):8.2f}"
                  f" {max(times) - min(times):7.2f} {statistics.median(r.cpu for r in runs):6.2f}"
                  f" {max(r.rss for r in runs) / 2**20:6.0f} MiB"
                  f" {max(r.output for r in runs) / 1024:7.0f} KiB"
                  f"  {','.join(sorted({str(r.code) for r in runs}))}")
    finally:
        subprocess.run(["zpool", "destroy", "-f", POOL], capture_output=True, check=False)


if __name__ == "__main__":
    main()
