#!/usr/bin/env python3
"""Graph audit and archive prune planning on a synthetic catalog of 100,000 streams.

Target (issue 5): < 1 s on SQLite for the graph audit, loading included.

The catalog: ``--datasets`` datasets (default 1,000) of one host and one store, each with
``--chains`` chains (4) of ``--chain-length`` streams (25: a full and 24 ``-I``
incrementals carrying two snapshots each), the next chain's full one snapshot after the last
chain's tip, as ``zbak archive`` builds them; one volume per incremental and three per full;
every snapshot in the snapshots table (the oldest quarter tombstoned), one replica cursor
and one successful archive run per dataset. Older chains are ``verified``, the newest
``uploaded``. Rows are inserted with plain bulk INSERTs (not timed).

Timed, each ``--reps`` times (median and spread printed):

* ``load``: what the audit reads up front (``audit.load.load_graph_input``:
  ``Catalog.stream_links``, ``screen_streams`` (the volume and carried-snapshot rules in
  SQL, failing ids only), ``archive_heads``, ``dataset_names``, ``cursors``,
  ``snapshots_by_guid``);
* ``graph``: ``zrepl_py.audit.graph.audit_graph`` over those rows (pure but for reading the
  volume and carried rows of the streams its findings describe, and the carriers of a few
  guids: ``volume_totals_of``, ``carried``, ``carrying``);
* ``audit``: both, as ``zbak audit`` does for the whole catalog;
* ``prune plan``: the archive retention planner (``zrepl_py.pruning.chain_plan``), one plan
  per dataset and store over ``Catalog.bulk_streams`` rows (it needs the full rows), and
  ``prune (load + plan)`` with that read.

Measured 2026-11-21 on the shared 2-vCPU test machine (load average about 1, medians of 5):
SQLite load 0.46 s + graph 0.19 s = audit 0.62 s (min 0.61, max 0.66; 0.87 s of CPU), prune
plan 0.29 s (1.69 s with ``Catalog.bulk_streams``); PostgreSQL 15 load 2.25 s + graph 0.31 s =
audit 2.18 s, prune plan 0.28 s (1.75 s with the load). The audit was 1.78 s on SQLite reading
every volume and carried row, 1.19 s with the SQL screen, 0.81-0.89 s with the cyclic GC paused,
and is 0.62 s with the screen running in a thread beside the stream-link read (the database
answers it without holding the GIL). What is left is ``stream_links`` (about 0.37 s: 100,000
rows of 13 columns, 0.21 s of it SQLite's fetch) and the graph checks (0.19 s).

SQLite: a file under a temporary directory. PostgreSQL: ``ZBAK_BENCH_PG_URL`` (an empty
database, SQLAlchemy URL), else a throwaway PostgreSQL 15 cluster started the way
tests/support/postgres.py does (``initdb``/``pg_ctl`` as the postgres user, 127.0.0.1, fsync
off), removed at the end. Usage::

    .venv/bin/python benchmarks/catalog.py [--datasets 1000] [--chains 4] [--chain-length 25]
        [--reps 5] [--only sqlite|pg]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zrepl_py.audit.graph import GraphInput, audit_graph  # noqa: E402
from zrepl_py.audit.load import load_graph_input  # noqa: E402
from zrepl_py.catalog.db import make_engine, upgrade  # noqa: E402
from zrepl_py.catalog.models import (  # noqa: E402
    dataset_table,
    replica_cursor_table,
    run_table,
    snapshot_table,
    stream_snapshot_table,
    stream_table,
    volume_table,
)
from zrepl_py.catalog.repository import Catalog  # noqa: E402

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
HOST, STORE, JOB = "local", "cold", "bench"
PG_BIN = Path(os.environ.get("ZBAK_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _guid(dataset: int, snap: int) -> int:
    """A deterministic, well-spread unsigned 64-bit guid."""
    return int.from_bytes(hashlib.blake2b(f"{dataset}/{snap}".encode(), digest_size=8).digest(),
                          "big") or 1


def build_catalog(engine: sa.Engine, datasets: int, chains: int, chain_length: int) -> int:
    """Fill an empty, migrated catalog (see the module docstring); return the stream count."""
    per_chain_snaps = 1 + 2 * (chain_length - 1)
    snaps_per_dataset = chains * (per_chain_snaps + 1)
    dataset_rows, snap_rows, stream_rows, volume_rows, carried_rows = [], [], [], [], []
    cursor_rows, run_rows = [], []
    stream_id = volume_id = carried_id = snap_id = 0
    sha = "ab" * 32
    for d in range(1, datasets + 1):
        name = f"tank/bench/ds{d:05d}"
        dataset_rows.append({"id": d, "host": HOST, "name": name})
        for s in range(snaps_per_dataset):
            snap_id += 1
            snap_rows.append({
                "id": snap_id, "dataset_id": d, "name": f"zbak_{s:05d}", "guid": _guid(d, s),
                "createtxg": 100 + 10 * s, "creation": T0 + dt.timedelta(hours=s),
                "first_seen": T0 + dt.timedelta(hours=s),
                "destroyed_at": (T0 + dt.timedelta(days=60) if s < snaps_per_dataset // 4
                                 else None),
            })
        snap = 0
        for c in range(chains):
            state = "uploaded" if c == chains - 1 else "verified"
            parent = None
            for i in range(chain_length):
                stream_id += 1
                full = i == 0
                carried = [snap] if full else [snap + 1, snap + 2]
                to = carried[-1]
                stream_rows.append({
                    "id": stream_id, "dataset_id": d, "store": STORE,
                    "kind": "full" if full else "incremental",
                    "parent_id": parent, "from_guid": None if full else _guid(d, snap),
                    "to_guid": _guid(d, to), "from_name": None if full else f"zbak_{snap:05d}",
                    "to_name": f"zbak_{to:05d}", "to_createtxg": 100 + 10 * to,
                    "raw_bytes": 3000 if full else 2000, "stored_bytes": 300 if full else 200,
                    "object_prefix": f"{HOST}/{name}/{100 + 10 * to:020d}-{stream_id}/",
                    "storage_class": "STANDARD", "compression": "zstd", "state": state,
                    "created_at": T0 + dt.timedelta(hours=to),
                    "uploaded_at": T0 + dt.timedelta(hours=to),
                    "verified_at": None if state == "uploaded" else T0 + dt.timedelta(days=90),
                })
                for v in range(3 if full else 1):
                    volume_id += 1
                    volume_rows.append({
                        "id": volume_id, "stream_id": stream_id, "index": v,
                        "key": f"{HOST}/{name}/{100 + 10 * to:020d}-{stream_id}/vol-{v:06d}.zst",
                        "raw_bytes": 1000 if full else 2000, "stored_bytes": 100 if full else 200,
                        "sha256": sha,
                    })
                for s in carried:
                    carried_id += 1
                    carried_rows.append({"id": carried_id, "stream_id": stream_id,
                                         "name": f"zbak_{s:05d}", "guid": _guid(d, s),
                                         "createtxg": 100 + 10 * s})
                parent, snap = stream_id, to
            snap += 1  # the next chain's full is of the snapshot after this chain's tip
        newest = snaps_per_dataset - 1
        last_tip = snap - 1  # the last chain's tip; the run that wrote it started after it
        cursor_rows.append({
            "job": JOB, "target": "backup:pool/bench", "source_dataset_id": d,
            "target_location": f"pool/bench/ds{d:05d}", "method": "zfs",
            "snapshot_name": f"zbak_{newest:05d}", "guid": _guid(d, newest),
            "createtxg": 100 + 10 * newest, "updated_at": T0 + dt.timedelta(hours=newest),
        })
        run_rows.append({
            "job": JOB, "action": "archive", "target": f"{STORE}:{name}",
            "started_at": T0 + dt.timedelta(hours=last_tip, minutes=30),
            "ended_at": T0 + dt.timedelta(hours=last_tip, minutes=35),
            "result": "ok", "bytes": 0, "error": None,
        })
    with engine.begin() as conn:
        for table, rows in ((dataset_table, dataset_rows), (snapshot_table, snap_rows),
                            (stream_table, stream_rows), (volume_table, volume_rows),
                            (stream_snapshot_table, carried_rows),
                            (replica_cursor_table, cursor_rows), (run_table, run_rows)):
            for start in range(0, len(rows), 20_000):
                conn.execute(sa.insert(table), rows[start:start + 20_000])
    return stream_id


def load_input(catalog: Catalog) -> GraphInput:
    """Read everything the graph audit needs for the whole catalog (every dataset is of
    host ``local``), as ``zbak audit`` reads a job's (``audit.load.load_graph_input``: one
    query per table)."""
    return load_graph_input(catalog, host=HOST, archives=[(JOB, STORE)], cursors=catalog.cursors())


CPU: dict[int, list[float]] = {}
"""CPU seconds of this process per timed series (by id of its wall-time list): on a shared
machine the wall time includes waiting for a core; the CPU time does not (PostgreSQL's own
work runs in its server process and is only in the wall time)."""


def timed(fn: Callable[[], object], reps: int) -> tuple[list[float], object]:
    """Run ``fn`` ``reps`` times; return the wall times (seconds) and the last result."""
    times, cpu, result = [], [], None
    for _ in range(reps):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    CPU[id(times)] = cpu
    return times, result


def prune_planner() -> Callable[[list], object] | None:
    """The archive retention planner over the loaded rows (one plan per dataset and store,
    keep_chains 2, S3's minimum storage durations), or None while it does not exist."""
    from zrepl_py.pruning.chain_plan import ChainRetention, plan_chain_retention  # noqa: PLC0415

    policy = ChainRetention(keep_chains=2, min_storage={
        "STANDARD_IA": dt.timedelta(days=30), "GLACIER": dt.timedelta(days=90),
        "DEEP_ARCHIVE": dt.timedelta(days=180)})
    now = T0 + dt.timedelta(days=365)

    def plan(streams: list) -> list:
        groups: dict[tuple[str, str, str], list] = {}
        for stream in streams:
            groups.setdefault((stream.host, stream.dataset, stream.store), []).append(stream)
        return [plan_chain_retention(rows, policy, now) for rows in groups.values()]

    return plan


def run_backend(label: str, url: str,
                args: argparse.Namespace) -> list[tuple[str, str, list[float], str]]:
    """Build the synthetic catalog at ``url`` and time each case; return table rows."""
    engine = make_engine(url)
    try:
        upgrade(engine)
        start = time.perf_counter()
        count = build_catalog(engine, args.datasets, args.chains, args.chain_length)
        print(f"{label}: built {count} streams in {time.perf_counter() - start:.1f} s", flush=True)
        catalog = Catalog(engine)
        rows = []
        load_times, data = timed(lambda: load_input(catalog), args.reps)
        rows.append((label, "load", load_times, f"{len(data.streams)} streams,"
                     f" {len(data.screened.failed)} failing the SQL screen,"
                     f" {len(data.snapshots)} snapshot rows"))
        graph_times, findings = timed(lambda: audit_graph(data), args.reps)
        rows.append((label, "graph", graph_times, f"{len(findings)} findings"))
        audit_times, _ = timed(lambda: audit_graph(load_input(catalog)), args.reps)
        rows.append((label, "audit (load + graph)", audit_times, ""))
        planner = prune_planner()
        if planner is None:
            rows.append((label, "prune plan", [], "zrepl_py.pruning.chain_plan not available yet"))
        else:
            full_rows = catalog.bulk_streams()
            plan_times, plans = timed(lambda: planner(full_rows), args.reps)
            deleted = sum(len(c.streams) for p in plans for c in p.to_delete)
            rows.append((label, "prune plan", plan_times,
                         f"{len(plans)} plans, {deleted} streams to delete"))
            both, _ = timed(lambda: planner(catalog.bulk_streams()), args.reps)
            rows.append((label, "prune (load + plan)", both, ""))
        return rows
    finally:
        engine.dispose()


@contextlib.contextmanager
def postgres_url() -> Iterator[str]:
    """``ZBAK_BENCH_PG_URL``, else a throwaway cluster's fresh database."""
    if os.environ.get("ZBAK_BENCH_PG_URL"):
        yield os.environ["ZBAK_BENCH_PG_URL"]
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from support.common import free_port  # noqa: PLC0415

    base = Path(tempfile.mkdtemp(prefix="zbak-bench-pg-"))
    as_pg: list[str] = []
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(base, account.pw_uid, account.pw_gid)
        as_pg = ["runuser", "-u", "postgres", "--"]
    data, log = base / "data", base / "server.log"
    pg_ctl = [*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(data)]
    try:
        subprocess.run([*as_pg, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust",
                        "-U", "postgres", "-N"], cwd=base, check=True, capture_output=True)
        port = free_port()
        options = (f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
                   " -c synchronous_commit=off -c full_page_writes=off")
        subprocess.run([*pg_ctl, "-o", options, "-l", str(log), "-w", "-t", "60", "start"],
                       cwd=base, check=True, capture_output=True)
        try:
            import psycopg  # noqa: PLC0415

            name = f"zbak_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                                 autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/{name}"
        finally:
            subprocess.run([*pg_ctl, "-m", "immediate", "-w", "stop"], cwd=base,
                           capture_output=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    """Parse options, run the backends, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", type=int, default=1000)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--chain-length", type=int, default=25)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", choices=("sqlite", "pg"))
    args = parser.parse_args()
    rows = []
    if args.only in (None, "sqlite"):
        with tempfile.TemporaryDirectory(prefix="zbak-bench-") as tmp:
            rows += run_backend("SQLite", f"sqlite:///{tmp}/catalog.sqlite", args)
    if args.only in (None, "pg"):
        with postgres_url() as url:
            rows += run_backend("PostgreSQL", url, args)
    print(f"\n{'backend':<11} {'case':<22} {'median s':>9} {'min s':>7} {'max s':>7}"
          f" {'CPU s':>7}  notes")
    for label, case, times, note in rows:
        if times:
            cpu = statistics.median(CPU[id(times)])
            print(f"{label:<11} {case:<22} {statistics.median(times):>9.3f} {min(times):>7.3f}"
                  f" {max(times):>7.3f} {cpu:>7.3f}  {note}")
        else:
            print(f"{label:<11} {case:<22} {'-':>9} {'-':>7} {'-':>7} {'-':>7}  {note}")
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
