"""Load: hundreds of datasets of tens of snapshots replicated (zfs target over the real sshd
on 127.0.0.1) and archived (file:// store) by one ``zbak`` run each, within fixed process,
descriptor and memory bounds, with a bounded number of commands per dataset (none per
snapshot), every snapshot arriving, a chain per dataset, and a second replication a no-op.

Scale: ``ZBAK_LOAD_SCALE=DATASETSxSNAPSHOTS``, 60x10 by default (1.5-4 minutes: zfs-fuse
receiving is the cost), 200x50 for the figures in docs/safety.md#load (about 40 minutes). A job over
a tenth of the datasets runs first: the descriptor peak of the large run must not exceed the
small run's by more than a few (a leak of one per dataset or per snapshot would add tens to
thousands). ``zbak`` runs as a subprocess (``python -m zrepl_py --debug``) watched through
/proc every 50 ms (``support.procwatch``); its debug log counts the commands it ran. Figures
are printed (``pytest -s``).

Process bound, from the design (docs/design.md#replication, ``transport.stages``,
``replication.zfs_target``): the job replicates ``CONCURRENCY`` datasets at once, one
pipeline each. A pipeline from a local source is at most ``zfs send | zstd | pv | ssh`` (4
processes; this job has compression and no bandwidth limit: 3). The shared ssh connection
is opened once while the run starts (``ssh -N -f``, +1 until it has forked the master away,
which then is no descendant). Control commands on the source are local processes run one at
a time by the run's thread (the batched holds), plus at most one at a time by the start-up
prefetch thread (``zrepl_py.runtime.prefetch``: pool health) (+2); the workers run none on
zfs-fuse (their per-dataset probes, bookmarks and encryption, exist on OpenZFS only);
control commands on the target go through paramiko, in-process. So at most 4 x 3 + 1 + 2 =
15 live descendants, whatever the dataset count.
Archive: ``zfs send`` (compression and upload are in-process) plus control commands: 3.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.cli import Zbak, zfs
from support.common import hosts_table
from support.procwatch import Peaks, ProcessWatch

from zrepl_py.errors import ExitStatus

SCALE = os.environ.get("ZBAK_LOAD_SCALE", "60x10")
"""``DATASETSxSNAPSHOTS``. The default keeps CI near 4 minutes: zfs-fuse receives about 10
snapshots a second and needs ~0.6 s per pipeline, so 200 x 50 takes ~40 minutes (run it with
``ZBAK_LOAD_SCALE=200x50``). Read at import: the autouse fixture scrubs ``ZBAK_*``."""
LARGE, SNAPSHOTS = (int(n) for n in SCALE.split("x"))
SMALL = max(1, LARGE // 10)
CONCURRENCY = 4
"""The jobs' ``[replicate] concurrency``: datasets replicated at once."""
REPLICATE_PROCESSES = CONCURRENCY * 3 + 1 + 2
"""Most live descendants of ``zbak replicate`` (derivation in the module doc)."""
ARCHIVE_PROCESSES = 3
"""Most live descendants of ``zbak archive`` (derivation in the module doc)."""
MAX_FDS = 64
"""Most descriptors ``zbak`` may hold open at once, whatever the dataset count."""
FD_PER_PIPELINE = 8
"""Descriptors one replication pipeline holds in ``zbak`` at most: three stages with a stderr
pipe and a pidfd each, plus a pipe between two stages while they start."""
FD_SLACK = (CONCURRENCY - 1) * FD_PER_PIPELINE
"""How many more descriptors the large run may peak at than the small one: the small run
(``SMALL`` datasets, a few seconds) is surely sampled with one pipeline open but may never be
with all ``CONCURRENCY``, so up to ``CONCURRENCY - 1`` more pipelines' worth. A leak of one per
dataset would add at least ``LARGE - SMALL`` (54 at the default scale), more than this."""
MAX_RSS_KIB = 200 * 1024
"""Peak resident set (VmHWM) of one ``zbak`` run (about 80 MiB at 200 x 50)."""
CONTROL_PER_DATASET, CONTROL_FIXED, PROBES = 6, 20, 2 * 10
"""Control commands a run may issue: per dataset three on each host (on the target the
properties that confirm the replica, and on a target without ``zfs receive -o``, zfs-fuse
here, the two ``zfs set`` of a new replica's canmount and readonly; on the source its
mountpoint, the snapshot's size and the hold), a command for several datasets when their
transfers end together and one each when they do not; a fixed number (listings, health,
the cached capabilities' fingerprint: all a no-op run asks); the capability probes
(``zfs/capabilities.py``, ten on zfs-fuse) on both hosts the first time; none per
snapshot."""
RUN_TIMEOUT = 120 + LARGE * SNAPSHOTS * 0.2
"""Seconds one watched run may take (zfs-fuse receives ~15 snapshots a second)."""

pytestmark = [pytest.mark.zfs, pytest.mark.ssh, pytest.mark.slow,
              pytest.mark.timeout(600 + 8 * RUN_TIMEOUT)]


@dataclasses.dataclass
class Watched:
    """One watched ``zbak`` run: exit status, stdout, debug log, seconds, /proc peaks."""

    status: int
    out: str
    log: str
    seconds: float
    peaks: Peaks

    def commands(self) -> dict[str, int]:
        """Commands the debug log names, by where they ran: ``local``/host name for control
        commands (``run [WHERE]:``), ``pipeline`` for each pipeline stage started."""
        counts: dict[str, int] = {}
        for where in re.findall(r"run \[([^\]]+)\]: ", self.log):
            counts[where] = counts.get(where, 0) + 1
        counts["pipeline stages"] = len(re.findall(r"pipeline stage ", self.log))
        counts["pipelines"] = len(re.findall(r"pipeline done", self.log))
        return counts

    def pipeline_seconds(self) -> float:
        """Seconds spent inside pipelines (``pipeline done: N bytes in X s``): the rest of
        the wall time is zbak's own work and its control commands."""
        return sum(float(x) for x in re.findall(r"pipeline done: \d+ bytes in ([\d.]+) s",
                                                self.log))

    def figures(self) -> str:
        """One line for the report."""
        p = self.peaks
        return (f"{self.seconds:.1f} s ({self.pipeline_seconds():.1f} s in pipelines), peak "
                f"{p.descendants} processes (ssh masters {p.extra}), peak fds zbak {p.fds} / "
                f"child {p.child_fds}, VmHWM "
                f"{p.hwm_kib / 1024:.0f} MiB, {p.samples} samples, started >= {p.names}, "
                f"commands {self.commands()}")


class LoadRig:
    """A source pool with SRC/small (20 children) and SRC/load (200 children), each child
    with a tiny file and 50 snapshots taken by ``zfs snapshot -r`` on the pool; a backup
    pool reached over the session's sshd; a file:// store; jobs ``small`` and ``load``."""

    def __init__(self, make_pool, sshd, tmp_path: Path, capsys):
        self.tmp, self.sshd = tmp_path, sshd
        started = time.monotonic()
        self.src, self.bak = make_pool("1G"), make_pool("1G")
        for parent, count in (("small", SMALL), ("load", LARGE)):
            zfs("create", f"{self.src.name}/{parent}")
            for i in range(count):
                child = f"{self.src.name}/{parent}/d{i:03d}"
                zfs("create", child)
                (self.src.mountpoint / parent / f"d{i:03d}" / "f.txt").write_text(child)
        self.create_seconds = time.monotonic() - started
        started = time.monotonic()
        for n in range(SNAPSHOTS):
            zfs("snapshot", "-r", f"{self.src.name}@{snapshot_name(n)}")
        self.snapshot_seconds = time.monotonic() - started
        self.config = tmp_path / "zbak.toml"
        (tmp_path / "store").mkdir()
        jobs = "".join(textwrap.dedent(f"""
            [jobs.{job}]
            dataset = "{self.src.name}/{job}"
            recursive = true
            [jobs.{job}.replicate]
            targets = ["backup:{self.bak.name}/{job}"]
            compression = "zstd"
            concurrency = {CONCURRENCY}
            [jobs.{job}.archive]
            store = "cold"
        """) for job in ("small", "load"))
        self.config.write_text(textwrap.dedent(f"""
            state_dir = "{tmp_path / 'state'}"
            [stores.cold]
            url = "file://{tmp_path / 'store'}"
            volume_size = "1MiB"
        """) + hosts_table("backup", sshd.host_config(), connect_timeout=10) + jobs)
        self.zbak = Zbak(self.config, capsys)
        status, out, err = self.zbak("init", "--no-checks")
        assert status == ExitStatus.OK, out + err

    def master_socket(self) -> str:
        """The control socket zbak's shared ssh connection to the backup host uses."""
        from zrepl_py.config.loading import load_config
        from zrepl_py.proc.openssh import control_dir, control_path, known_hosts_path

        config = load_config(self.config)
        host = config.hosts["backup"]
        directory = control_dir(config.state_dir)
        assert directory is not None
        return str(control_path(directory, host,
                                known_hosts_path(host, config.state_dir / "known_hosts")))

    def run(self, *args: str) -> Watched:
        """Run ``zbak --debug ARGS`` as a watched subprocess."""
        socket = self.master_socket()
        log = self.tmp / f"zbak-{time.monotonic_ns()}.log"
        started = time.monotonic()
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "zrepl_py", "--config", str(self.config), "--debug", *args],
                stdout=subprocess.PIPE, stderr=err, env=dict(os.environ))
            watch = ProcessWatch(proc.pid, 0.05, extra_match=lambda argv: is_master(argv, socket))
            watch.start()
            try:
                out, _ = proc.communicate(timeout=RUN_TIMEOUT)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                peaks = watch.stop()
        return Watched(proc.returncode, out.decode(), log.read_text(errors="replace"),
                       time.monotonic() - started, peaks)


def control(commands: dict[str, int]) -> int:
    """Control commands (local and remote) among ``Watched.commands()``."""
    return sum(n for where, n in commands.items() if not where.startswith("pipeline"))


def is_master(argv: list[str], socket: str) -> bool:
    """True for an ssh ControlPersist master on ``socket``: it retitles itself
    ``ssh: SOCKET [mux]`` (OpenSSH ssh.c ``control_persist_detach``)."""
    line = " ".join(argv)
    return socket in line and "[mux]" in line


def snapshot_name(n: int) -> str:
    """The name of the ``n``-th snapshot (0-based): zbak's form, one minute apart."""
    return f"zbak_20260101T{n // 60:02d}{n % 60:02d}00Z"


def guids(root: str) -> dict[str, int]:
    """``{name relative to root: guid}`` of every dataset and snapshot under ``root``."""
    out = zfs("get", "-Hp", "-r", "-o", "name,value", "guid", root)
    return {n[len(root):]: int(v) for n, v in (line.split("\t") for line in out.splitlines())}


def test_hundreds_of_datasets_replicate_and_archive_in_one_run_each_within_bounds_that_do_not_grow(
        make_pool, sshd, tmp_path, capsys):
    rig = LoadRig(make_pool, sshd, tmp_path, capsys)
    report = [f"scale {LARGE} datasets x {SNAPSHOTS} snapshots; tree: {SMALL + LARGE} "
              f"datasets created (+ a file each) in {rig.create_seconds:.1f} s, "
              f"{SNAPSHOTS} x zfs snapshot -r in {rig.snapshot_seconds:.1f} s"]
    runs: dict[tuple[str, str], Watched] = {}
    for action in ("replicate", "archive"):
        for job in ("small", "load"):
            run = rig.run(action, job, "--json")
            runs[action, job] = run
            report.append(f"{action} {job}: {run.figures()}")
            print(f"\n{report[0]}\n{report[-1]}", flush=True)  # survives a failed assert
            assert run.status == ExitStatus.OK, run.out[-3000:] + run.log[-3000:]

    for action, bound in (("replicate", REPLICATE_PROCESSES), ("archive", ARCHIVE_PROCESSES)):
        small, load = runs[action, "small"].peaks, runs[action, "load"].peaks
        assert load.samples > 40, f"{action}: too short a run to sample"
        assert load.descendants <= bound, f"{action}: {load.widest}"
        assert small.descendants <= bound, f"{action}: {small.widest}"
        assert load.extra <= 1, f"{action}: one shared ssh master per host at most"
        assert load.fds <= MAX_FDS and small.fds <= MAX_FDS
        assert load.fds <= small.fds + FD_SLACK, (
            f"{action}: descriptors grow with the dataset count: {small.fds} at {SMALL} "
            f"datasets, {load.fds} at {LARGE}")
        assert load.hwm_kib <= MAX_RSS_KIB, f"{action}: VmHWM {load.hwm_kib} KiB"
        # One pipeline per planned stream (a full and one -I per dataset), a bounded number
        # of control commands per dataset and none per snapshot.
        for job, datasets in (("small", SMALL + 1), ("load", LARGE + 1)):
            commands = runs[action, job].commands()
            assert commands["pipelines"] <= 2 * datasets, commands
            assert control(commands) <= (CONTROL_PER_DATASET * datasets + CONTROL_FIXED
                                         + PROBES), commands

    src = f"{rig.src.name}/load"
    source, replica = guids(src), guids(f"{rig.bak.name}/load")
    newest = "@" + snapshot_name(SNAPSHOTS - 1)
    for i in range(LARGE):
        child = f"/d{i:03d}"
        assert source[child + newest] == replica[child + newest], child
        snaps = [n for n in replica if n.startswith(child + "@")]
        assert len(snaps) == SNAPSHOTS, child
    assert {n: g for n, g in source.items() if "@" in n} == \
        {n: g for n, g in replica.items() if "@" in n}

    from zrepl_py.catalog.chains import current_chain
    from zrepl_py.catalog.db import make_engine
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.config.loading import load_config

    catalog = Catalog(make_engine(load_config(rig.config).catalog_url))
    by_dataset: dict[str, list] = {}
    for stream in catalog.streams(store="cold"):
        by_dataset.setdefault(stream.dataset, []).append(stream)
    for i in range(LARGE):
        dataset = f"{src}/d{i:03d}"
        chain = current_chain(by_dataset.get(dataset, []))
        assert chain and chain[0].kind == "full", dataset
        assert chain[-1].to_guid == source[f"/d{i:03d}{newest}"], dataset

    again = rig.run("replicate", "--json")
    assert again.status == ExitStatus.OK, again.out[-3000:] + again.log[-3000:]
    rows = [r for r in json.loads(again.out)["rows"] if r["dataset"]]
    assert len(rows) == SMALL + LARGE + 2 and all(r["plan"] == "up to date" for r in rows), \
        [r for r in rows if r["plan"] != "up to date"][:5]
    assert again.commands()["pipeline stages"] == 0
    assert control(again.commands()) <= CONTROL_FIXED, "a no-op costs no command per dataset"
    print(f"replicate again (both jobs, no-op): {again.figures()}")
