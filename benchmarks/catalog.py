#!/usr/bin/env python3
"""The catalog commands at scale, timed as the user runs them (by hand, not CI).

Targets (issue 20 P5): ``zbak prune --dry-run`` (table and ``--json``), ``zbak audit``
(graph and objects levels), ``zbak list streams`` and ``zbak status`` over a catalog of
100,000 streams each < 2 s wall and < 300 MiB peak RSS on SQLite, and at 1,000,000 streams
no worse than linear.

Per scale (``--scales``, default ``10k,100k``; ``1M`` takes about 20 min to build and
13 GB of disk) a catalog, a ``file://`` store and a config are generated once under
``--workdir`` (reused by later runs with the same scale), like ``zbak archive`` builds
them: ``--datasets-per-10k`` datasets per 10,000 streams (default 100) under one recursive
job, each with 4 chains of 25 streams (a full of three volumes and 24 ``-I`` incrementals
of one volume carrying two snapshots each), every snapshot in the snapshots table (the
oldest quarter destroyed), one successful archive run per dataset; the three older
chains are ``verified`` (a day ago), the newest ``uploaded``; ``keep_chains = 2``, so a
prune plan deletes the oldest two chains of every dataset. The store holds every volume
(sparse files of the recorded size), ``manifest.json`` and ``manifest.json.copy``
(sealed, agreeing with the catalog). The job's source is the root of a zfs-fuse pool
of a private zfs-fuse (the catalog's datasets are children that were destroyed since,
which every command treats like live ones but for the source listing); the job has no
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
import datetime as dt
import hashlib
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
sys.path.insert(0, str(REPO))

from support import zfs as support_zfs  # noqa: E402
from zrepl_py.catalog.db import make_engine, upgrade  # noqa: E402
from zrepl_py.catalog.models import (  # noqa: E402
    Dataset,
    Run,
    Snapshot,
    Stream,
    StreamSnapshot,
    Volume,
)
from zrepl_py.objects.layout import MANIFEST, MANIFEST_COPY, stream_prefix, volume_key  # noqa: E402
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest, VolumeRecord  # noqa: E402

POOL = "zbench"
HOST, STORE, JOB = "local", "cold", "bench"
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


def guid(dataset: int, snap: int) -> int:
    """A deterministic, well-spread unsigned 64-bit guid."""
    return int.from_bytes(hashlib.blake2b(f"{dataset}/{snap}".encode(), digest_size=8).digest(),
                          "big") or 1


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


def write_config(scale: Scale) -> None:
    """The config: one recursive job over the pool's root, archiving to the store."""
    scale.config.write_text(f"""\
state_dir = "{scale.root / 'state'}"

[stores.{STORE}]
url = "file://{scale.store}"

[jobs.{JOB}]
dataset = "{POOL}/bench"
recursive = true

[jobs.{JOB}.archive]
store = "{STORE}"
keep_chains = {KEEP_CHAINS}
""")
    os.chmod(scale.config, 0o600)


class Builder:
    """Rows and objects of the generated catalog (module docstring), written in batches."""

    def __init__(self, engine: sa.Engine, store: Path, now: dt.datetime):
        self.engine, self.store, self.now = engine, store, now
        self.rows: dict[type, list[dict]] = {m: [] for m in (Dataset, Snapshot, Stream, Volume,
                                                             StreamSnapshot, Run)}
        self.ids = {m: 0 for m in self.rows}

    def add(self, model: type, **row) -> int:
        self.ids[model] += 1
        self.rows[model].append({"id": self.ids[model], **row})
        return self.ids[model]

    def flush(self) -> None:
        with self.engine.begin() as conn:
            for model, rows in self.rows.items():
                for start in range(0, len(rows), 20_000):
                    conn.execute(sa.insert(model), rows[start:start + 20_000])
                rows.clear()

    def dataset(self, d: int) -> None:
        name = f"{POOL}/bench/ds{d:05d}"
        dataset_id = self.add(Dataset, host=HOST, name=name)
        per_chain = 1 + 2 * (CHAIN_LENGTH - 1)
        count = CHAINS * (per_chain + 1)
        start = self.now - dt.timedelta(hours=count + 2)

        def created(s: int) -> dt.datetime:
            return start + dt.timedelta(hours=s)

        for s in range(count):
            self.add(Snapshot, dataset_id=dataset_id, name=f"zbak_{s:05d}", guid=guid(d, s),
                     createtxg=100 + 10 * s, creation=created(s), first_seen=created(s),
                     destroyed_at=self.now - dt.timedelta(days=1) if s < count // 4 else None)
        snap = 0
        for c in range(CHAINS):
            newest_chain = c == CHAINS - 1
            parent = None
            for i in range(CHAIN_LENGTH):
                full = i == 0
                carried = [snap] if full else [snap + 1, snap + 2]
                to = carried[-1]
                prefix = stream_prefix(HOST, name, to_createtxg=100 + 10 * to,
                                       to_guid=guid(d, to),
                                       from_guid=None if full else guid(d, snap))
                sizes = [(1000, 100)] * 3 if full else [(2000, 200)]
                stream_id = self.add(
                    Stream, dataset_id=dataset_id, store=STORE,
                    kind="full" if full else "incremental", parent_id=parent,
                    from_guid=None if full else guid(d, snap), to_guid=guid(d, to),
                    from_name=None if full else f"zbak_{snap:05d}", to_name=f"zbak_{to:05d}",
                    to_createtxg=100 + 10 * to, raw_bytes=sum(r for r, _ in sizes),
                    stored_bytes=sum(s for _, s in sizes), object_prefix=prefix,
                    storage_class="STANDARD", compression="zstd",
                    state="uploaded" if newest_chain else "verified",
                    created_at=created(to), uploaded_at=created(to),
                    verified_at=None if newest_chain else self.now - dt.timedelta(days=1))
                volumes = []
                for v, (raw, stored) in enumerate(sizes):
                    key = volume_key(prefix, v)
                    sha = hashlib.sha256(key.encode()).hexdigest()
                    self.add(Volume, stream_id=stream_id, index=v, key=key, raw_bytes=raw,
                             stored_bytes=stored, sha256=sha)
                    volumes.append(VolumeRecord(v, key, raw, stored, sha, sha))
                    path = self.store / key
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with open(path, "wb") as handle:
                        handle.truncate(stored)
                snaps = tuple(CarriedSnapshot(f"zbak_{s:05d}", guid(d, s), 100 + 10 * s)
                              for s in carried)
                for c_snap in snaps:
                    self.add(StreamSnapshot, stream_id=stream_id, name=c_snap.name,
                             guid=c_snap.guid, createtxg=c_snap.createtxg)
                manifest = Manifest(
                    host=HOST, dataset=name, kind="full" if full else "incremental",
                    from_snap=None if full else CarriedSnapshot(f"zbak_{snap:05d}", guid(d, snap),
                                                                100 + 10 * snap),
                    to_snap=snaps[-1], snapshots=snaps, volumes=tuple(volumes),
                    compression="zstd", compression_level=3,
                    send_flags=() if full else ("-I",), storage_class="STANDARD",
                    tool="zbak bench", created_at=created(to)).to_json()
                (self.store / (prefix + MANIFEST)).write_bytes(manifest)
                (self.store / (prefix + MANIFEST_COPY)).write_bytes(manifest)
                parent, snap = stream_id, to
            snap += 1  # the next chain's full is of the snapshot after this chain's tip
        last_tip = snap - 1
        self.add(Run, job=JOB, action="archive", target=f"{STORE}:{name}",
                 started_at=created(last_tip) + dt.timedelta(minutes=30),
                 ended_at=created(last_tip) + dt.timedelta(minutes=35), result="ok", bytes=0,
                 error=None)


def build(scale: Scale) -> None:
    """Generate the scale's catalog, store and config (unless already built)."""
    if scale.done.exists():
        return
    shutil.rmtree(scale.root, ignore_errors=True)
    (scale.root / "state").mkdir(parents=True, mode=0o700)
    scale.store.mkdir()
    write_config(scale)
    engine = make_engine(f"sqlite:///{scale.catalog}")
    started = time.monotonic()
    try:
        upgrade(engine)
        builder = Builder(engine, scale.store, dt.datetime.now(dt.timezone.utc))
        for d in range(1, scale.datasets + 1):
            builder.dataset(d)
            if d % 50 == 0:
                builder.flush()
                print(f"\r  {scale.streams:,} streams: {d}/{scale.datasets} datasets",
                      end="", flush=True)
        builder.flush()
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
    argv = ["/usr/bin/time", "-f", "%M %U %S", "-o", str(log), PYTHON, "-m", "zrepl_py",
            "--config", str(scale.config), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZBAK_", "AWS_"))}
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, cwd=REPO, env=env, check=False)
    seconds = time.monotonic() - started
    rss, user, system = log.read_text().split("\n")[-2].split()
    if done.returncode not in (0, 4):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        print(f"    zbak {' '.join(args)} exit {done.returncode}: {' | '.join(tail)}", flush=True)
    return Timed(seconds, float(user) + float(system), int(rss) * 1024, done.returncode,
                len(done.stdout))


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
            conn.execute(sa.update(Stream).values(manifest_seen=None, manifest_read_at=None))
    finally:
        engine.dispose()


def load() -> str:
    """``uptime``'s load averages (1, 5, 15 min)."""
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


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
        shift = rep % len(cases)
        for case in cases[shift:] + cases[:shift]:
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
    import pstats  # noqa: PLC0415

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
    why_not = support_zfs._enter_private_namespace()
    if why_not:
        raise SystemExit(f"cannot get a private zfs-fuse: {why_not}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.workdir))
    pidfile = work / "zfs-fuse.pid"
    subprocess.run(["/usr/sbin/zfs-fuse", "--no-kstat-mount", "--pidfile", str(pidfile)],
                   check=True)
    support_zfs._wait_for_daemon("zpool")
    image = work / "pool.img"
    try:
        subprocess.run(["truncate", "-s", "256M", str(image)], check=True)
        subprocess.run(["zpool", "create", "-m", str(work / POOL), POOL, str(image)], check=True)
        subprocess.run(["zfs", "create", f"{POOL}/bench"], check=True)
        subprocess.run(["zfs", "snapshot", f"{POOL}/bench@zbak_00000"], check=True)
        scales = []
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
        print(f"before: {load()} ({os.cpu_count()} cores)", flush=True)
        results = []
        for scale in scales:
            runs = measure(scale, cases, args.reps, work)
            for case in cases:
                results.append((scale, case, runs[case]))
                times = [r.seconds for r in runs[case]]
                print(f"  {scale.streams:>9,} {case:<24} {statistics.median(times):7.2f} s",
                      flush=True)
        print(f"after: {load()}")
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
        subprocess.run(["zpool", "destroy", "-f", POOL], check=False)
        support_zfs._stop_private_daemon(pidfile)
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            for scale in scales if "scales" in locals() else ():
                shutil.rmtree(scale.root, ignore_errors=True)


if __name__ == "__main__":
    main()
