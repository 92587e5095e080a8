#!/usr/bin/env python3
"""zbak archive and restore into a sealed store beside the same commands unsealed, in one run
(by hand, not CI).

Targets (docs/sealed.md#speed): ``zbak archive`` into a sealed ``file://`` store (zstd, then
age to one X25519 recipient) >= 0.8x the unsealed archive's throughput on random data and
>= 0.9x on 50 % compressible data; ``zbak restore`` of that full stream with ``--identity``
likewise against the unsealed restore; peak RSS of every sealed run <= 200 MiB.

Cases, on snapshots of zfs-fuse datasets of ``--size`` bytes (``benchmarks/archive.py``'s
test bed, data and table):

- ``archive full random`` / ``archive full 50%``: ``zbak archive`` into a fresh store per
  run, unsealed and sealed;
- ``restore full random`` / ``restore full 50%``: ``zbak restore DS --to @s --into NEW
  --from cold --yes`` of a store archived once (untimed) for each, unsealed and sealed
  (``--identity KEY``); every received snapshot's guid is checked.

Beside zbak in every case, the stock tools' pipes, unsealed and sealed (``zfs send | zstd -3
-T0 [| age -r KEY] > FILE``; each volume of zbak's store through ``cat`` or ``age -d -i KEY``,
``| zstd -d | zfs receive``): their ratio is what the cipher costs on this machine with no
zbak in the way, printed below the goals (``reference``).

After one untimed warm-up of each tool, each case runs ``--reps`` times, the tools
alternated and their order rotated per repetition; the ratio is the unsealed median over the
sealed one (>= 1: sealing costs nothing). Peak RSS is GNU time's ``%M`` of the zbak
process. The load average is printed before and after. Runs as root (a private zfs-fuse).
Usage::

    .venv/bin/python benchmarks/sealed.py [--size 512MiB] [--reps 5] [--only WORDS]
        [--compare REV] [--profile DIR]

``--only WORDS`` (repeatable) runs only the cases whose name contains WORDS (``--only
restore``: the restores alone, each store still archived once, untimed).

``--compare REV`` adds each sealed case run by the zbak of the git revision ``REV``
(``main``: a temporary checkout; ``NAME=DIR`` for a checkout made by hand), interleaved with
the others: old and new code on the same data and load. ``--profile DIR`` runs each zbak case once under py-spy instead of timing
(``benchmarks/archive.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from archive import (
    MIB,
    PYTHON,
    REPO,
    Bench,
    Results,
    Run,
    add_compare_and_profile,
    bench_bed,
    human,
    parse_size,
    run_case,
    summarize_profile,
)
from zfsbench import load, sh, target_line

RSS_LIMIT = 200 * MIB
FLOORS = {"random": 0.8, "50%": 0.9}
"""Sealed throughput over unsealed (unsealed median / sealed median) each data kind must
reach, archive and restore alike."""
PLAIN, SEALED = "unsealed", "sealed"
STOCK = "pipe"
"""The stock tools' pipelines beside zbak: their sealed over unsealed ratio is what the
cipher costs on this machine with no zbak in the way."""


class SealedBench(Bench):
    """``archive.Bench`` with one identity and configs whose store is sealed to it."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        super().__init__(args, workdir)
        self.key = workdir / "restore.key"
        subprocess.run(["age-keygen", "-o", str(self.key)], check=True, capture_output=True)
        recipient = subprocess.run(["age-keygen", "-y", str(self.key)], check=True,
                                   capture_output=True, text=True).stdout.strip()
        self.recipient = recipient
        self.age_table = f'[stores.cold.age]\nrecipients = ["{recipient}"]\n'
        self.archived: dict[tuple[str, str], Path] = {}

    def make_data(self) -> None:
        """``rand`` (random) and ``text`` (every other MiB word text) of ``--size``."""
        for job, text in (("rand", False), ("text", True)):
            dataset = f"{self.src}/{job}"
            sh("zfs", "create", dataset)
            self.write_mixed(dataset, self.args.size, text_share=text)
            sh("zfs", "snapshot", f"{dataset}@s")
            self.stream[job] = self.stream_size(["zfs", "send", f"{dataset}@s"])

    def setup(self, kind: str) -> Path:
        return self.zbak_setup("file", store_tables=self.age_table if kind == SEALED else "")

    def archive(self, job: str, kind: str, tree: Path = REPO) -> Run:
        """``zbak archive JOB`` into a fresh store of ``kind``, dropped afterwards; ``tree``:
        the checkout whose code runs (``--compare``)."""
        config = self.setup(kind)
        try:
            return self.zbak(config, "archive", job, tree=tree)
        finally:
            self.drop_store(config)
            shutil.rmtree(config.parent / "state", ignore_errors=True)

    def restore(self, job: str, kind: str, tree: Path = REPO) -> Run:
        """``zbak restore`` of JOB's full from a store of ``kind`` archived once for it (by
        this checkout's zbak); ``tree``: the checkout whose code restores (``--compare``)."""
        identity = ("--identity", str(self.key)) if kind == SEALED else ()
        return self.restore_zbak(self.store_of(job, kind), job, "s", *identity, tree=tree)

    def store_of(self, job: str, kind: str) -> Path:
        """The config of a store of ``kind`` holding JOB's full, archived once (untimed, by
        this checkout's zbak) for every restore of it."""
        if (job, kind) not in self.archived:
            config = self.setup(kind)
            self.zbak(config, "archive", job)
            self.archived[job, kind] = config
        return self.archived[job, kind]

    def archive_stock(self, job: str, kind: str) -> Run:
        """The stock tools' archive: ``zfs send | zstd -3 -T0 [| age -r RECIPIENT] > FILE``
        (one age file for the whole stream, where zbak seals each volume)."""
        age = [["age", "-r", self.recipient]] if kind == SEALED else []
        return self.archive_pipe(job, "file", after=age)

    def restore_stock(self, job: str, kind: str) -> Run:
        """The stock tools' restore of the store ``restore`` archived: each volume through
        ``cat`` (or ``age -d -i KEY``), ``| zstd -d | zfs receive``."""
        return self.restore_pipe(self.store_of(job, kind), job, "s",
                                 identity=self.key if kind == SEALED else None)


def measure(bench: SealedBench, results: Results, reps: int) -> tuple[dict[str, int],
                                                                       dict[str, str]]:
    """Every case, unsealed and sealed; (stream bytes per case, baseline tool per case)."""
    streams: dict[str, int] = {}
    baseline: dict[str, str] = {}
    for verb in ("archive", "restore"):
        for job, label in (("rand", "random"), ("text", "50%")):
            case = f"{verb} full {label}"
            if bench.args.only and not any(word in case for word in bench.args.only):
                continue
            run = bench.archive if verb == "archive" else bench.restore
            stock = bench.archive_stock if verb == "archive" else bench.restore_stock
            tools: dict[str, Callable[[], Run]] = {
                f"zbak {verb} {kind}": (lambda job=job, kind=kind, run=run: run(job, kind))
                for kind in (PLAIN, SEALED)}
            tools.update({f"{STOCK} {verb} {kind}": (lambda job=job, kind=kind, stock=stock:
                                                      stock(job, kind))
                          for kind in (PLAIN, SEALED)})
            for name, tree in bench.args.compare:
                tools[f"zbak {verb} {SEALED} ({name})"] = (
                    lambda job=job, run=run, tree=tree: run(job, SEALED, tree))
            run_case(bench, results, case, job, tools, reps, streams, baseline)
    return streams, baseline


def goal_lines(results: Results, streams: dict[str, int],
               compare: Sequence[str] = ()) -> list[str]:
    """One line per goal (pure), MET or MISSED: per case and sealed tool (this checkout's,
    then each ``--compare NAME``) the sealed throughput against the unsealed with both
    tools' CPU seconds per GiB of raw stream, and the sealed runs' peak RSS."""
    lines = []
    for case in streams:
        verb, label = case.split()[0], case.split()[-1]
        plain = f"zbak {verb} {PLAIN}"
        floor = FLOORS[label]
        plain_cpu = results.cpu_per_gib(case, plain, streams[case])
        for sealed in [f"zbak {verb} {SEALED}", *(f"zbak {verb} {SEALED} ({name})"
                                                   for name in compare)]:
            failed = results.failures.get((case, sealed), [])
            cpu = results.cpu_per_gib(case, sealed, streams[case])
            lines.append(target_line(
                f"{case} {sealed}", results.median(case, sealed), results.median(case, plain),
                ours_failed=failed, reference_failed=results.failures.get((case, plain), []),
                peer=plain, verdict=lambda ours, theirs, floor=floor, cpu=cpu, pc=plain_cpu: (
                    f"sealed {theirs / ours:.3f}x unsealed (>= {floor}):"
                    f" {'MET' if theirs / ours >= floor else 'MISSED'};"
                    f" CPU {cpu or 0:.2f} s/GiB sealed, {pc or 0:.2f} unsealed")))
            lines.append(target_line(
                f"{case} {sealed} peak RSS", results.peak(case, sealed), RSS_LIMIT,
                ours_failed=failed, verdict=lambda peak, limit: (
                    f"{peak / MIB:.1f} MiB (<= {limit // MIB} MiB):"
                    f" {'MET' if peak <= limit else 'MISSED'}")))
        lines.extend(_stock_line(results, case, verb))
    return lines


def _stock_line(results: Results, case: str, verb: str) -> list[str]:
    """The stock pipes' line of ``case`` (not a goal): their sealed over unsealed ratio, the
    cipher's cost with no zbak in the way, and zbak's sealed command against the sealed
    pipe; none when either pipe has no run."""
    pipe_plain, pipe_sealed = (results.median(case, f"{STOCK} {verb} {kind}")
                               for kind in (PLAIN, SEALED))
    if pipe_plain is None or pipe_sealed is None:
        return []
    ours = results.median(case, f"zbak {verb} {SEALED}")
    against = f"; zbak sealed {pipe_sealed / ours:.3f}x the sealed pipe" if ours else ""
    return [f"reference {case}: the stock pipes' sealed {pipe_plain / pipe_sealed:.3f}x"
            f" their unsealed{against}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--size", type=parse_size, default=parse_size("512MiB"),
                        help="data of each dataset (default 512MiB)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", action="append", default=[], metavar="WORDS",
                        help="run only the cases whose name contains WORDS (repeatable, e.g."
                             " --only restore, --only '50%%')")
    add_compare_and_profile(parser, "the sealed cases")
    args = parser.parse_args()
    # What archive.Bench sizes its pools by; this bench has no chain and no rss runs.
    args.chain_full = args.chain_step = args.rss_size = 0
    args.s3 = False
    if os.geteuid() != 0:
        raise SystemExit("run as root (zfs-fuse)")
    for tool in ("zstd", "/usr/bin/time", "age-keygen") + (("py-spy",) if args.profile else ()):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} missing: apt-get install zstd time age; pip install"
                             " py-spy")
    for tree in [REPO, *(tree for _, tree in args.compare)]:
        subprocess.run([PYTHON, "-m", "compileall", "-q", str(tree / "zrepl_py")], check=True)
    with bench_bed(SealedBench, args, "sealed") as bench:
        try:
            before = load()
            bench.make_pools()
            bench.make_data()
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                bench.profile_to = args.profile
            results = Results()
            streams, baseline = measure(bench, results, args.reps)
            if args.profile:
                for path in sorted(args.profile.glob("*.txt")):
                    print(f"{path}:\n{summarize_profile(path)}")
                return 0
            print()
            print(f"{human(args.size)} of data per dataset; {args.reps} reps; "
                  f"{os.cpu_count()} cpus; load average before {before}, after {load()}")
            print(results.table(streams, baseline))
            print("(ratio = unsealed median / sealed median; MB/s = 10^6 raw stream bytes"
                  " per second; CPU s = median user+system of zbak; srv s = median CPU of"
                  " the zfs-fuse daemon; RSS = zbak's peak)")
            print()
            print("\n".join(goal_lines(results, streams,
                                        [name for name, _ in args.compare])))
            return 0
        finally:
            for pool in (bench.src, bench.dst):
                subprocess.run(["zpool", "destroy", "-f", pool], capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
