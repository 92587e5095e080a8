"""One ``bandwidth_limit`` shared by a tree's concurrent transfers (``proc.ratelimit``),
measured on the real pipelines: zfs-fuse pools, a real ``zbak replicate`` process, real
``pv``; the bytes each ``pv`` writes are sampled from ``/proc`` (``support.pvmeter``).

Four children of 3, 7, 13 and 25 MiB of random data replicate at once under 4 MiB/s with
``concurrency = 8``: every pv starts at 0.5 MiB/s (the limit over the concurrency), so the
limit is reached only when each is raised to its share by its start timer (``RAISE_AFTER``
after its start); the children end one by one, and each end's timer raises the others to
the new share. Together they must pass the limit, no more and no less (+-10 %), over the
whole transfer time; the best second of each phase (4, 3, 2, 1 running) reaches it; no two
seconds pass it (one may: pv makes up for time it was blocked). Seen failing (at 8 MiB/s and
twice these sizes): given the whole limit each, 15.0 MiB/s over the run and 24.5 in its
busiest two seconds; never raised after their start, 4.0 MiB/s while four ran; not raised
after an end, 2.0 MiB/s for the last one alone. 4 MiB/s, not 8: four zfs-fuse pipelines at a
load of 10-12 could not always carry 8 MiB/s, and a limit the host cannot reach proves
nothing about the limit.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from support.cli import ZBAK_TIMEOUT, run_zbak, start_zbak, zfs
from support.pvmeter import PvSampler

pytestmark = [pytest.mark.zfs, pytest.mark.slow]

MiB = 1024 * 1024
LIMIT = 4 * MiB
"""Bytes per second of the shared limit."""
SIZES = {"c1": 3, "c2": 7, "c3": 13, "c4": 25}
"""MiB of random data per child: 12 s at the limit, in four phases of about 3 s each (4, 3,
2, then 1 transfer running; each child ends when the next has 8/3 x the time left), so each
phase has whole seconds after its share was set."""
CONCURRENCY = 8
TOLERANCE = 0.10


def test_concurrent_transfers_together_stay_within_the_shared_limit(make_pool, tmp_path):
    src, bak = make_pool(), make_pool()
    data = f"{src.name}/data"
    for child in ("", *(f"/{c}" for c in SIZES)):
        zfs("create", data + child)
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n' + textwrap.dedent(f"""
        [jobs.j]
        dataset = "{data}"
        recursive = true
        [jobs.j.replicate]
        targets = ["local:{bak.name}/replica"]
        bandwidth_limit = {LIMIT}
        concurrency = {CONCURRENCY}
    """))
    assert run_zbak("--config", str(config), "init", "--no-checks")[0] == 0
    zfs("snapshot", "-r", f"{data}@s0")
    # the replicas exist: next, every child's incremental starts at once
    status, out, err = run_zbak("--config", str(config), "replicate")
    assert status == 0, out + err
    for child, mib in SIZES.items():
        with open(src.mountpoint / "data" / child / "random.bin", "wb") as handle:
            for _ in range(mib):
                handle.write(os.urandom(MiB))
    for child in SIZES:  # not the parent: its empty increment would hold a share, unused
        zfs("snapshot", f"{data}/{child}@s1")

    proc = start_zbak("--config", str(config), "replicate", "--json", text=True)
    with PvSampler(proc.pid) as pvs:
        out, err = proc.communicate(timeout=ZBAK_TIMEOUT)
    assert proc.returncode == 0, out + err
    plans = {row["dataset"]: row["plan"] for row in json.loads(out)["rows"]}
    assert [ds for ds, plan in plans.items() if plan != "up to date"] == [
        f"{data}/{c}" for c in SIZES], plans

    begin, end = pvs.window()
    whole = pvs.rate(begin, end)
    seconds = [(pvs.running(t, t + 1), pvs.rate(t, t + 1))
               for t in (begin + k for k in range(int(end - begin)))]
    busiest = max(pvs.rate(t, t + 2) for t in (begin + k / 10 for k in range(int(
        (end - begin - 2) * 10) + 1)))
    report = (f"{pvs.total(end) - pvs.total(begin):.0f} bytes in {end - begin:.2f} s: "
              f"{whole / MiB:.2f} MiB/s; busiest 2 s {busiest / MiB:.2f} MiB/s; per second "
              f"(pvs running throughout, MiB/s): {[(n, round(r / MiB, 2)) for n, r in seconds]}")
    print(report)
    assert abs(whole - LIMIT) <= TOLERANCE * LIMIT, report
    # pv 1.6 makes up for time it was blocked (a stalled receive): a whole second may pass
    # the limit by what it missed before, two seconds hardly
    assert busiest <= (1 + TOLERANCE) * LIMIT, report
    # each phase reaches the limit: the start timers set the 4 shares, the end timers the
    # rest; its ceiling is the busiest two seconds' (one second may catch up, above)
    for running in (4, 3, 2, 1):
        best = max((rate for n, rate in seconds if n == running), default=0)
        assert best >= (1 - TOLERANCE) * LIMIT, f"{running} running: {report}"
