#!/usr/bin/env python3
"""Start-up of zbak's commands, each a whole process beside ``zfs snapshot`` alone
(docs/decisions.md#commands-start-in-under-300-ms; by hand, not in CI).

Target: ``zbak snapshot`` of one dataset and ``zbak status`` of a config without
jobs under 0.3 s of wall time, measured as subprocesses. Every cron run, hook, monitoring
probe and forced command (``zbak serve``, once per remote command) pays what is timed here.

Cases, on a private zfs-fuse pool (a sparse file under /var/tmp) with a SQLite catalog:

- ``zfs snapshot``: the bare command, a new snapshot of its own dataset each time (the floor);
- ``--version``, ``--help`` (``--help`` lists every command);
- ``config check`` and ``status (no jobs)`` (a config with no job: nothing to read);
- ``snapshot`` (one job, one dataset; runs wait for a new second, so names never collide),
  ``status`` (that job, with its held bytes read from zfs), ``status --check``, ``list
  snapshots``, ``replicate --dry-run`` (to a local target) and ``archive --dry-run`` (to a
  ``file://`` store);
- ``serve``: the forced command running ``zfs list -H -o name DATASET`` through its policy.

Each ``--zbak LABEL=PATH`` is one zbak to time (its own state directory and dataset), e.g.
two non-editable installs side by side, one per commit::

    python3 -m venv /var/tmp/zbak-a && /var/tmp/zbak-a/bin/pip install /path/to/checkout-a
    python3 -m venv /var/tmp/zbak-b && /var/tmp/zbak-b/bin/pip install /path/to/checkout-b
    .venv/bin/python benchmarks/startup.py --zbak a=/var/tmp/zbak-a/bin/zbak \\
        --zbak b=/var/tmp/zbak-b/bin/zbak

Without ``--zbak`` it times this checkout as ``python -m zrepl_py`` with its bytecode compiled
into a private ``PYTHONPYCACHEPREFIX`` (as an install would have it; the development venv's
editable finder still loads, about 0.01-0.04 s).

After one untimed round, every case of every zbak runs ``--reps`` times (default 7),
interleaved, the order rotated per round. Printed per case and zbak: the median wall time
and CPU time (user + sys of the process and its children, from ``wait4``), each with its
min-max spread, and the load average before and after (other work on the machine slows
the wall time first; CPU time is the steadier figure). ``--importtime`` also prints, per
case of the first zbak, the ten largest top-level imports (``python -X importtime``,
cumulative, the fastest of three runs). Usage (as root)::

    .venv/bin/python benchmarks/startup.py [--zbak LABEL=PATH ...] [--reps 7]
        [--cases snapshot,status...] [--importtime]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from zfsbench import private_zfs_fuse, rotate, sh

CASES = ("zfs snapshot", "--version", "--help", "config check", "status (no jobs)", "snapshot",
         "status", "status --check", "list snapshots", "replicate --dry-run",
         "archive --dry-run", "serve")


@dataclass
class Zbak:
    """One zbak under test: how to start it, and its own config files and dataset."""

    label: str
    argv: list[str]
    env: dict[str, str]
    work: Path
    dataset: str
    last_second: int = 0
    runs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    @property
    def config(self) -> Path:
        return self.work / "zbak.toml"

    @property
    def empty(self) -> Path:
        return self.work / "empty.toml"

    def case_argv(self, case: str, pool: str) -> tuple[list[str], dict[str, str]]:
        """The argv and extra environment of ``case``."""
        config = ["--config", str(self.config)]
        words = {
            "--version": ["--version"],
            "--help": ["--help"],
            "config check": [*config, "config", "check"],
            "status (no jobs)": ["--config", str(self.empty), "status"],
            "snapshot": [*config, "snapshot"],
            "status": [*config, "status"],
            "status --check": [*config, "status", "--check"],
            "list snapshots": [*config, "list", "snapshots"],
            "replicate --dry-run": [*config, "replicate", "--dry-run"],
            "archive --dry-run": [*config, "archive", "--dry-run"],
            "serve": ["serve", "--root", pool, "--log", str(self.work / "serve.log")],
        }[case]
        env = {"SSH_ORIGINAL_COMMAND": f"zfs list -H -o name {self.dataset}"}
        return [*self.argv, *words], env if case == "serve" else {}

    def write_configs(self, pool: str) -> None:
        state = self.work / "state"
        self.empty.write_text(f'state_dir = "{state}"\n')
        self.config.write_text(textwrap.dedent(f"""\
            state_dir = "{state}"
            stores.local = {{ url = "file://{self.work / 'store'}" }}
            [jobs.one]
            dataset = "{self.dataset}"
            snapshot = {{ prefix = "zbak", schedule = "0 * * * *" }}
            replicate = {{ targets = ["local:{pool}/replica-{self.label}"] }}
            archive = {{ store = "local" }}
        """))
        for path in (self.empty, self.config):
            path.chmod(0o600)


def run_once(argv: list[str], env: dict[str, str], log: Path) -> tuple[float, float, int]:
    """Run ``argv`` to its end, stderr to ``log``; (wall seconds, CPU seconds of it and its
    children, exit status)."""
    with open(log, "wb") as err:
        started = time.perf_counter()
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, child.returncode


def timed(bench: Bench, zbak: Zbak | None, case: str) -> tuple[float, float]:
    """One run of ``case`` (``zbak`` None: the bare zfs snapshot)."""
    if zbak is None:
        bench.serial += 1
        argv, extra = ["zfs", "snapshot", f"{bench.pool}/floor@s{bench.serial}"], {}
    else:
        argv, extra = zbak.case_argv(case, bench.pool)
        if case == "snapshot":  # a snapshot name has a one-second resolution
            while int(time.time()) == zbak.last_second:
                time.sleep(0.01)
    log = bench.work / "stderr.log"
    wall, cpu, status = run_once(argv, {**(zbak.env if zbak else os.environ), **extra}, log)
    if zbak is not None and case == "snapshot":
        zbak.last_second = int(time.time())
    if status != 0:
        raise SystemExit(f"{zbak.label if zbak else ''} {case}: exit {status}: {' '.join(argv)}"
                         f"\n{log.read_text(errors='replace')[-2000:]}")
    return wall, cpu


@dataclass
class Bench:
    """The pool, the zbaks and the floor's runs."""

    pool: str
    work: Path
    zbaks: list[Zbak]
    serial: int = 0
    floor: list[tuple[float, float]] = field(default_factory=list)


def importtime(zbak: Zbak, case: str, pool: str) -> str:
    """The ten largest top-level imports of ``case`` (ms, cumulative, fastest of 3 runs)."""
    best: dict[str, int] = {}
    for _ in range(3):
        argv, extra = zbak.case_argv(case, pool)
        if case == "snapshot":
            time.sleep(1.0)
        done = subprocess.run(argv, env={**zbak.env, **extra, "PYTHONPROFILEIMPORTTIME": "1"},
                              capture_output=True, text=True)
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "cumulative" in line:
                continue
            _, cumulative, name = line[len("import time:"):].split("|")
            if name.startswith("  "):  # an import made by another (top level: one space)
                continue
            best[name.strip()] = min(best.get(name.strip(), 1 << 62), int(cumulative))
    top = sorted(best.items(), key=lambda kv: -kv[1])[:10]
    total = sum(best.values()) / 1000
    return (f"  {case}: imports {total:.0f} ms; "
            + ", ".join(f"{name} {us / 1000:.0f}" for name, us in top))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zbak", action="append", default=[], metavar="LABEL=PATH",
                        help="a zbak executable to time (repeatable; default: this checkout)")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--importtime", action="store_true",
                        help="also print each case's largest imports (first zbak)")
    args = parser.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; choose from {', '.join(CASES)}")
    if os.geteuid() != 0:
        raise SystemExit("run as root (zfs-fuse)")
    work = Path(tempfile.mkdtemp(prefix="zbak-bench-startup-", dir="/var/tmp"))
    try:
        with private_zfs_fuse(work):
            return measure(args, cases, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args: argparse.Namespace, cases: list[str], work: Path) -> int:
    """Make a pool in ``work``, run every case's rounds and print the table."""
    pool = f"zbs{os.getpid()}"
    try:
        image = work / "pool.img"
        sh("truncate", "-s", "512M", str(image))
        sh("zpool", "create", "-m", str(work / "mnt"), pool, str(image))
        sh("zfs", "create", f"{pool}/floor")
        bench = Bench(pool, work, _zbaks(args.zbak, work, pool))
        for zbak in bench.zbaks:
            sh("zfs", "create", zbak.dataset)
            zbak.write_configs(pool)
            sh(*zbak.argv, "--config", str(zbak.config), "init", "--no-checks")
            sh(*zbak.argv, "--config", str(zbak.config), "snapshot")
            zbak.last_second = int(time.time())
        load = os.getloadavg()
        started = time.monotonic()
        runners = [(None, "zfs snapshot")] if "zfs snapshot" in cases else []
        runners += [(z, c) for z in bench.zbaks for c in cases if c != "zfs snapshot"]
        for rep in range(args.reps + 1):  # round 0 warms the caches and is not counted
            for zbak, case in rotate(runners, rep):
                result = timed(bench, zbak, case)
                if rep:
                    (bench.floor if zbak is None else zbak.runs.setdefault(case, [])).append(result)
        print(f"{args.reps} rounds in {time.monotonic() - started:.0f} s, {os.cpu_count()} CPUs; "
              f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
        print(f"{'case':22} {'zbak':10} {'wall s, median (min-max)':26} "
              f"{'CPU s, median (min-max)':26}")
        if bench.floor:
            print(f"{'zfs snapshot':22} {'-':10} {spread([w for w, _ in bench.floor]):26} "
                  f"{spread([c for _, c in bench.floor]):26}")
        for case in cases:
            for zbak in bench.zbaks:
                if case in zbak.runs:
                    runs = zbak.runs[case]
                    print(f"{case:22} {zbak.label:10} {spread([w for w, _ in runs]):26} "
                          f"{spread([c for _, c in runs]):26}")
        if args.importtime:
            zbak = bench.zbaks[0]
            print(f"\nlargest top-level imports of {zbak.label} (ms, cumulative):")
            for case in cases:
                if case != "zfs snapshot":
                    print(importtime(zbak, case, pool))
        return 0
    finally:
        subprocess.run(["zpool", "destroy", "-f", pool], capture_output=True)


def _zbaks(specs: list[str], work: Path, pool: str) -> list[Zbak]:
    """The zbaks of ``--zbak LABEL=PATH``, else this checkout with compiled bytecode."""
    found = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label.isidentifier() or not os.access(path, os.X_OK):
            raise SystemExit(f"--zbak {spec!r}: expected LABEL=PATH of a zbak executable")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        found.append(Zbak(label, [path], env, work / label, f"{pool}/{label}"))
    if not found:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "zrepl_py")],
                       env=env, check=True, capture_output=True)
        found.append(Zbak("checkout", [sys.executable, "-m", "zrepl_py"], env,
                          work / "checkout", f"{pool}/checkout"))
    for zbak in found:
        zbak.work.mkdir(mode=0o700)
    return found


if __name__ == "__main__":
    sys.exit(main())
