"""The benchmarks' goal lines and tables (pure code of benchmarks/replication.py and
benchmarks/archive.py, without running a benchmark): a goal whose every zbak run failed is
MISSED with the failures, never silent nor "not measured", and ``zbak (pipe only)``, a view
inside zbak's run, gets no ratio."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    """``benchmarks/NAME.py`` as a module (the benchmarks import ``zfsbench`` by its bare
    name, as scripts do)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def replication():
    return _load("replication")


@pytest.fixture(scope="module")
def archive():
    return _load("archive")


@pytest.fixture(scope="module")
def sealed():
    return _load("sealed")


def test_a_replication_goal_whose_zbak_runs_all_failed_is_missed_with_the_failures(replication):
    results = replication.Results()
    for seconds in (2.0, 2.2, 2.1):
        results.add("full", "raw pipe", seconds)
    results.failures[("full", "zbak")] += ["exit 1: cannot receive", "exit 1: again"]
    (full, *_) = replication.goal_lines(results)
    assert full == ("target full vs raw pipe: MISSED, every zbak run failed"
                    " (2x: exit 1: cannot receive)")


def test_replication_goals_met_missed_not_measured_and_not_run(replication):
    results = replication.Results()
    results.add("full", "raw pipe", 2.0)
    results.add("full", "zbak", 2.02)
    results.add("incremental", "raw pipe", 1.0)
    results.add("incremental", "zbak", 1.5)
    results.add("tree initial", "zbak", 3.0)
    results.failures[("tree initial", "syncoid")].append("exit 2: zfs get -t")
    results.add("no-op cycle", "zbak", 1.4)
    lines = replication.goal_lines(results)
    assert lines == [
        "target full vs raw pipe: zbak 0.990x (>= 0.97): met",
        "target incremental vs raw pipe: zbak 0.667x (>= 0.97): MISSED",
        "target tree initial vs syncoid: not measured, every syncoid run failed"
        " (1x: exit 2: zfs get -t)",
        "target nightly cycle vs syncoid+shim: not measured (not run)",
        "target nightly cycle vs shell loop: not measured (not run)",
        "target no-op cycle: zbak 1.40 s (< 2 s): met"]
    results.add("nightly cycle", "syncoid+shim", 5.0)
    results.add("nightly cycle", "zbak", 5.0)
    assert replication.goal_lines(results)[3] == (
        "target nightly cycle vs syncoid+shim: zbak 1.000x (> 1.0): MISSED")  # not faster


def test_a_no_op_cycle_whose_zbak_runs_all_failed_is_missed(replication):
    results = replication.Results()
    results.failures[("no-op cycle", "zbak")].append("exit 3: locked")
    assert replication.goal_lines(results)[-1] == (
        "target no-op cycle: MISSED, every zbak run failed (1x: exit 3: locked)")


def test_the_pipe_only_row_gets_no_ratio_and_zbaks_row_does(replication):
    results = replication.Results()
    results.add("full", "raw pipe", 2.0)
    results.add("full", "zbak", 2.5)
    results.add("full", replication.PIPE_ONLY, 1.9)
    table = results.table({"full": 500_000_000}, {"full": ("raw pipe", "throughput")})
    rows = {line[15:33].strip(): line.rstrip() for line in table.splitlines()[2:]}
    assert rows["zbak"].endswith(" 200.0   0.800  raw pipe (throughput)"), rows
    assert rows[replication.PIPE_ONLY].endswith(" 263.2"), rows  # MB/s, then no ratio


def test_archive_goals_missed_with_the_failures_when_every_zbak_run_failed(archive):
    results = archive.Results()
    run = archive.Run(seconds=4.0, rss=50 * archive.MIB, cpu=3.0)
    streams = {"archive full random file": 10**9, "rss archive file": 10**9,
               "restore --dry-run": 10**6, "restore chain file": 10**9}
    baseline = {"archive full random file": archive.PIPE_FILE,
                "rss archive file": archive.PIPE_FILE,
                "restore --dry-run": "zbak restore --dry-run",
                "restore chain file": archive.PIPE_RESTORE}
    for case in ("archive full random file", "rss archive file"):
        results.runs[(case, archive.PIPE_FILE)].append(run)
        results.failures[(case, "zbak archive")].append("exit 1: store full")
    results.failures[("restore --dry-run", "zbak restore --dry-run")].append("exit 2: usage")
    results.runs[("restore chain file", archive.PIPE_RESTORE)].append(run)
    results.runs[("restore chain file", "zbak restore")].append(
        archive.Run(seconds=4.2, rss=80 * archive.MIB, cpu=3.0))
    assert archive.goal_lines(results, streams, baseline) == [
        "target archive full random file: MISSED, every zbak run failed (1x: exit 1: store full)",
        "target rss archive file: MISSED, every zbak run failed (1x: exit 1: store full)",
        "target rss archive file peak RSS: MISSED, every zbak run failed"
        " (1x: exit 1: store full)",
        "target restore chain file: zbak 0.952x the baseline (>= 0.8): MET;"
        " CPU 3.22 s/GiB, baseline 3.22",
        "target restore --dry-run of 31 streams: MISSED, every zbak run failed"
        " (1x: exit 2: usage)"]


def test_archive_goals_judge_measured_runs(archive):
    results = archive.Results()
    streams = {"rss restore file": 10**9, "restore --dry-run": 10**6}
    baseline = {"rss restore file": "zbak restore", "restore --dry-run": "zbak restore --dry-run"}
    results.runs[("rss restore file", "zbak restore")].append(
        archive.Run(seconds=9.0, rss=250 * archive.MIB, cpu=8.0))
    results.runs[("restore --dry-run", "zbak restore --dry-run")].append(
        archive.Run(seconds=0.4, rss=archive.MIB, cpu=0.3))
    assert archive.goal_lines(results, streams, baseline) == [
        "target rss restore file peak RSS: zbak 250.0 MiB (<= 200 MiB): MISSED",
        "target restore --dry-run of 31 streams: 0.40 s (< 0.5 s): MET"]


def test_archive_goals_hold_each_store_to_its_floor_and_each_compared_zbak_too(archive):
    """file:// at 0.8x, S3 at 0.9x, each ``--compare`` tool judged on its own line, with the
    CPU seconds per GiB of raw stream of zbak and its baseline."""
    results = archive.Results()
    gib = 1 << 30
    streams = {"archive full random file": gib, "archive full random s3": gib}
    baseline = {"archive full random file": archive.PIPE_FILE,
                "archive full random s3": archive.PIPE_S3}
    for case, pipe in baseline.items():
        results.runs[(case, pipe)].append(archive.Run(seconds=1.7, rss=archive.MIB, cpu=1.0))
        results.runs[(case, "zbak archive")].append(
            archive.Run(seconds=2.0, rss=archive.MIB, cpu=2.5))
        results.runs[(case, "zbak archive (main)")].append(
            archive.Run(seconds=2.5, rss=archive.MIB, cpu=3.0))
    assert archive.goal_lines(results, streams, baseline, ["main"]) == [
        "target archive full random file: zbak 0.850x the baseline (>= 0.8): MET;"
        " CPU 2.50 s/GiB, baseline 1.00",
        "target archive full random file, zbak archive (main): zbak 0.680x the baseline"
        " (>= 0.8): MISSED; CPU 3.00 s/GiB, baseline 1.00",
        "target archive full random s3: zbak 0.850x the baseline (>= 0.9): MISSED;"
        " CPU 2.50 s/GiB, baseline 1.00",
        "target archive full random s3, zbak archive (main): zbak 0.680x the baseline"
        " (>= 0.9): MISSED; CPU 3.00 s/GiB, baseline 1.00"]


def test_the_sealed_bench_prints_the_stock_pipes_ratio_beside_its_goals(sealed):
    results = sealed.Results()
    case = "restore full random"
    for tool, seconds in (("zbak restore unsealed", 8.0), ("zbak restore sealed", 10.0),
                          ("pipe restore unsealed", 6.0), ("pipe restore sealed", 7.5)):
        results.record(case, tool, lambda seconds=seconds: sealed.Run(seconds, 1 << 20, 1.0))
    lines = sealed.goal_lines(results, {case: 1 << 30})
    assert "target restore full random zbak restore sealed: sealed 0.800x unsealed" in lines[0]
    assert lines[-1] == ("reference restore full random: the stock pipes' sealed 0.800x their"
                         " unsealed; zbak sealed 0.750x the sealed pipe")


def test_no_stock_line_without_both_pipes(sealed):
    results = sealed.Results()
    results.record("archive full 50%", "zbak archive sealed",
                   lambda: sealed.Run(1.0, 1 << 20, 1.0))
    results.record("archive full 50%", "pipe archive sealed",
                   lambda: sealed.Run(1.0, 1 << 20, 1.0))
    assert not any(line.startswith("reference")
                   for line in sealed.goal_lines(results, {"archive full 50%": 1 << 30}))
