#!/usr/bin/env python3
"""``zbak archive`` of a tree of small datasets: what zbak adds per dataset (by hand, not CI).

Target (docs/decisions.md#an-archive-run-reads-its-tree-once): a 100-dataset tree with small
incrementals is archived in one ``zbak archive`` without per-dataset start-up costs that dominate
the data.

The tree: ``--datasets`` children (default 100) under one dataset of a zfs-fuse pool, each
holding a file of ``--kib`` KiB (default 64) of random data, archived once in full by an
untimed first run. Each repetition then writes ``--kib`` KiB more into every dataset,
takes one ``zfs snapshot -r`` and times, in rotating order:

- ``zbak archive``: one run for the recursive job (one ``-I`` incremental per dataset into
  a ``file://`` store, compressed, hashed, manifests, catalog rows, holds moved);
- ``loop``: the data work alone, as a shell loop would do it, ``zfs send -I PREV CUR |
  zstd -3 > FILE`` for each dataset in turn, then one ``sync`` (zbak's store fsyncs).

Both send the same incrementals; the loop's files are removed after each run. What zbak
adds per dataset is ``(zbak - loop) / datasets``, printed with the medians. ``--repo DIR``
runs the zbak of another checkout (e.g. ``git archive main | tar -x -C DIR``) with this
venv, to compare before and after a change.

Runs as root in a private mount namespace with its own zfs-fuse (tests/support/zfs.py);
the zbak process runs under GNU time for its peak RSS. Usage::

    .venv/bin/python benchmarks/archive_tree.py [--datasets 100] [--kib 64] [--reps 3]
        [--repo DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from support.generated import archive_config
from zfsbench import private_zfs_fuse, rotate, sh, timed, usage

POOL = "ztree"
PYTHON = sys.executable


class Tree:
    """The pool, the tree, the zbak config and the loop's work directory."""

    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        self.root = f"{POOL}/tree"
        self.children = [f"{self.root}/ds{i:03d}" for i in range(args.datasets)]
        self.snap = 0
        self.repo = args.repo or REPO
        self.config = work / "zbak.toml"
        self.store = work / "store"
        self.loop_dir = work / "loop"

    def create(self) -> None:
        image = self.work / "pool.img"
        sh("truncate", "-s", "2G", str(image))
        sh("zpool", "create", "-m", str(self.work / POOL), POOL, str(image))
        sh("zfs", "create", self.root)
        for child in self.children:
            sh("zfs", "create", child)
        self.store.mkdir()
        self.loop_dir.mkdir()
        archive_config(self.config, state=self.work / "state", store=self.store,
                       root=self.root, job="tree")
        self.zbak("init", "--no-checks")

    def grow(self) -> None:
        """``--kib`` KiB more in every dataset, then one recursive snapshot."""
        for child in self.children:  # mounted under the pool's mountpoint, work/POOL
            (self.work / child / f"f{self.snap}").write_bytes(os.urandom(self.args.kib * 1024))
        self.snap += 1
        sh("zfs", "snapshot", "-r", f"{self.root}@s{self.snap:03d}")

    def zbak(self, *args: str) -> tuple[float, int]:
        """``python -m zrepl_py --config CFG ARGS`` from ``--repo``; (seconds, peak RSS)."""
        log = self.work / "time.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ZBAK_", "AWS_"))}
        env["PYTHONPATH"] = str(self.repo)
        started = time.monotonic()
        done = subprocess.run(timed([PYTHON, "-m", "zrepl_py", "--config", str(self.config),
                                     *args], log),
                              capture_output=True, text=True, cwd=self.repo, env=env,
                              check=False)
        seconds = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"zbak {' '.join(args)} exit {done.returncode}:"
                               f" {done.stderr.strip()[-500:]}")
        return seconds, usage(log)[0]

    def archive(self) -> tuple[float, int]:
        return self.zbak("archive")

    def profile(self) -> None:
        """One ``zbak archive`` under cProfile (wall clock: most of it is waiting on
        children); the 45 functions with the most cumulative time."""
        out = self.work / "profile.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ZBAK_", "AWS_"))}
        env["PYTHONPATH"] = str(self.repo)
        subprocess.run([PYTHON, "-m", "cProfile", "-o", str(out), "-m", "zrepl_py", "--config",
                        str(self.config), "archive"], cwd=self.repo, env=env, check=True,
                       capture_output=True)
        import pstats

        pstats.Stats(str(out)).sort_stats("cumulative").print_stats(45)

    def loop(self) -> tuple[float, int]:
        """The same incrementals with a shell loop of ``zfs send -I | zstd -3 > FILE``."""
        prev, cur = f"s{self.snap - 1:03d}", f"s{self.snap:03d}"
        script = "\n".join(
            f"zfs send -I {child}@{prev} {child}@{cur} | zstd -3 -q -c > {self.loop_dir}/{i}.zst"
            " || exit 1" for i, child in enumerate(self.children)) + "\nsync\n"
        started = time.monotonic()
        subprocess.run(["sh", "-c", script], check=True)
        seconds = time.monotonic() - started
        for f in self.loop_dir.iterdir():
            f.unlink()
        return seconds, 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", type=int, default=100)
    parser.add_argument("--kib", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--repo", type=Path, help="run the zbak of this checkout")
    parser.add_argument("--profile", action="store_true",
                        help="profile one incremental zbak archive (wall clock) instead")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (zfs-fuse)")
    work = Path(tempfile.mkdtemp(prefix="zbak-bench-tree-", dir="/var/tmp"))
    tree = Tree(args, work)
    try:
        with private_zfs_fuse(work):
            measure(tree, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(tree: Tree, args: argparse.Namespace) -> None:
    """Build the tree, archive it once, then the timed rounds; print the table."""
    try:
        tree.create()
        tree.grow()
        first, _ = tree.archive()
        print(f"{args.datasets} datasets, first archive (fulls) {first:.1f} s;"
              f" zbak from {tree.repo}", flush=True)
        if args.profile:
            tree.grow()
            tree.profile()
            return
        runs: dict[str, list[tuple[float, int]]] = {"zbak archive": [], "loop": []}
        tools = {"zbak archive": tree.archive, "loop": tree.loop}
        print(f"before: load average {os.getloadavg()[0]:.2f}", flush=True)
        for rep in range(args.reps + 1):  # the first round warms up, untimed
            tree.grow()
            for tool in rotate(list(tools), rep):
                seconds, rss = tools[tool]()
                if rep:
                    runs[tool].append((seconds, rss))
                    print(f"  {tool:13} {seconds:6.2f} s", flush=True)
        print(f"after: load average {os.getloadavg()[0]:.2f}")
        zbak = [s for s, _ in runs["zbak archive"]]
        loop = [s for s, _ in runs["loop"]]
        print(f"\n{'tool':13} {'runs (s)':22} {'median':>7} {'spread':>7} {'per dataset':>12}"
              f" {'peak RSS':>9}")
        for tool, values in (("zbak archive", zbak), ("loop", loop)):
            rss = max(r for _, r in runs[tool])
            print(f"{tool:13} {' '.join(f'{v:.2f}' for v in values):22}"
                  f" {statistics.median(values):7.2f} {max(values) - min(values):7.2f}"
                  f" {statistics.median(values) / args.datasets * 1000:9.0f} ms"
                  + (f" {rss / 2**20:6.0f} MiB" if rss else ""))
        extra = (statistics.median(zbak) - statistics.median(loop)) / args.datasets
        print(f"\nzbak adds {extra * 1000:.0f} ms per dataset to the loop's data work")
    finally:
        subprocess.run(["zpool", "destroy", "-f", POOL], capture_output=True, check=False)


if __name__ == "__main__":
    main()
