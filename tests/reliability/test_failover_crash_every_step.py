"""docs/decisions.md#crash-tests-kill-at-every-step: ``zbak failover`` and ``zbak failback``
killed (SIGKILL) right after their k-th step, for every k, then run again; and a failback
killed at one named step the stride may miss (the full stream of a dataset made on the live
replica, before its mark), then run again.

A step is every zfs command that changes state on either side (the master's pool here, the
backup host's over the real sshd: a root login without zbak, so the replica's commands go
one by one) and every catalog write (``support/crash_runner.py`` with
``ZBAK_FAULT_ZFS_STEPS``). Each test has one site (one small dataset on zfs-fuse replicated
to the backup pool) that serves every k: the commands of one k bring it back to a replica
and a live master for the next. After each kill:

* never writable on both sides (mounted and taking a write);
* no snapshot or dataset guid of either pool lost (nothing destroyed);
then after the rerun:
* a planned failover has every byte the source had;
* a failback has every byte written on the live replica on the source, the replica is a
  read-only replica without its mark, the source live without its mark, and what the master
  wrote after the common snapshot is in the kept tree.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import CRASH_RUNNER, prop, tree_digest, write_synced, zfs
from support.failover import Site

pytestmark = [pytest.mark.zfs, pytest.mark.slow, pytest.mark.timeout(1800)]

KiB = 1 << 10
STRIDE = int(os.environ.get("ZBAK_CRASH_STRIDE", "5"))
"""The kill points: k = 1, 1 + STRIDE, 1 + 2 * STRIDE, ... until a run finishes unkilled.
``ZBAK_CRASH_STRIDE=1`` kills after every step (about 14 minutes per test on a loaded 2-core
host, over the suite's budget); the suite runs every fifth (k = 1, 6, 11, ...)."""


def crash(site: Site, k: int | None, *args: str, at: str | None = None
          ) -> tuple[int, list[str], str]:
    """``zbak ARGS`` under the crash runner, killed after step ``k`` (or after the step
    whose ``OP<TAB>KEY`` contains ``at``; neither: not killed); return its exit status (-9
    when killed), the steps it completed and its stderr."""
    steps_file = site.tmp / "steps"
    steps_file.unlink(missing_ok=True)
    kill = {"ZBAK_FAULT_KILL_AFTER": str(k)} if k is not None else {}
    kill |= {"ZBAK_FAULT_KILL_AT": at} if at is not None else {}
    env = dict(os.environ, ZBAK_FAULT_STEPS_FILE=str(steps_file), ZBAK_FAULT_ZFS_STEPS="1",
               ZBAK_LOG_LEVEL="WARNING", **kill)
    # Output to a file, not a pipe (as support.cli.faulty_zbak has): the ssh master a killed
    # run started (ControlPersist) inherits its stderr and would hold a pipe open past it.
    with open(site.tmp / "stderr", "w+") as stderr:
        done = subprocess.run([sys.executable, str(CRASH_RUNNER), "--config", str(site.config),
                               *args], env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                              timeout=120, stdin=subprocess.DEVNULL)
        stderr.seek(0)
        steps = steps_file.read_text().splitlines() if steps_file.exists() else []
        return done.returncode, steps, stderr.read()


def writable(dataset: str) -> bool:
    """``dataset`` is mounted and takes a write (a probe file, removed again); False when
    it or its pool is not there."""
    try:
        if prop(dataset, "mounted") != "yes":
            return False
        probe = Path(prop(dataset, "mountpoint")) / ".crash-probe"
    except subprocess.CalledProcessError:
        return False
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_EXCL))
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return False
        raise
    probe.unlink()
    return True


def guids(pool: str) -> set[str] | None:
    """Guids of every dataset and snapshot of ``pool``; None while it is exported."""
    listed = subprocess.run(["zfs", "list", "-H", "-t", "filesystem,snapshot", "-o", "guid",
                             "-r", pool], capture_output=True, text=True, timeout=60)
    return set(listed.stdout.split()) if listed.returncode == 0 else None


class Run:
    """Runs the commands of each k under the crash runner and checks what every kill left."""

    def __init__(self, site: Site):
        self.site = site
        self.seen: dict[str, set[str]] = {site.src.name: set(), site.bak.name: set()}
        self.finished: set[str] = set()
        """The commands that ran to the end: k was past their last step."""
        self.kept()

    def kept(self, where: str = "") -> None:
        """Every guid either pool had is still there (while the pool is imported)."""
        for pool, seen in self.seen.items():
            now = guids(pool)
            if now is None:
                continue
            assert seen <= now, f"{where}: {pool} lost the guids {sorted(seen - now)}"
            seen |= now

    def killed(self, k: int, name: str, *args: str) -> bool:
        """Run ``zbak ARGS`` killed after step ``k``, check what it left, and run it again
        to the end when it was killed; return whether it was."""
        site = self.site
        code, steps, stderr = crash(site, k, *args)
        if code == 0:
            self.finished.add(name)
            assert len(steps) < k, (name, k, steps)
            self.kept(f"{name}, not killed")
            return False
        assert code == -signal.SIGKILL, f"{name} after step {k}: {stderr}"
        assert len(steps) == k
        where = f"{name} killed after step {k} ({steps[-1]})"
        assert not (writable(site.replica) and writable(site.data)), \
            f"{where}: writable on both sides"
        self.kept(where)
        rerun = site.zbak(*args)
        assert rerun.returncode == 0, f"rerun after {where}: {rerun.stdout}{rerun.stderr}"
        self.kept(f"rerun after {where}")
        return True


def _write(where: Path, name: str) -> dict[str, str]:
    """A new file of 64 KiB under ``where``; return the tree's digest after it."""
    write_synced(where / name, os.urandom(64 * KiB))
    return tree_digest(where)


def _kept_trees(site: Site) -> set[str]:
    listed = zfs("list", "-H", "-o", "name", "-d", "1", site.src.name).split()
    return {name for name in listed if name.startswith(f"{site.data}-before-failback-")}


def _way_back_held(site: Site, where: str) -> None:
    """The mark's base snapshot on the replica carries the failover's hold (the way back)."""
    (mark,) = site.marks(site.replica).values()
    base = dict(field.split("=", 1) for field in mark.split(";"))["base"]
    # zfs-fuse has no `zfs holds`; the replica's snapshots carry no other hold
    assert prop(f"{site.replica}@{base}", "userrefs") == "1", f"{where}: @{base} is not held"


def _failed_back(site: Site, written: dict[str, str], where: str) -> None:
    """The source has ``written`` and is live; the replica is a read-only replica."""
    assert tree_digest(site.source_dir) == written, f"{where}: the replica's writes"
    assert site.marks(site.replica) == {}, where
    assert (prop(site.replica, "readonly"), prop(site.replica, "mounted")) == ("on", "no")
    marked = zfs("get", "-H", "-r", "-s", "local", "-o", "name", "zbak:failover-source",
                 site.data)
    assert marked.split() == [], f"{where}: the source is still marked"
    assert writable(site.data), f"{where}: the source is not live"
    status = json.loads(site.ok("status", "--json", "--offline").stdout)
    assert status[0]["targets"][0]["failed_over"] is None, f"{where}: recorded failed over"


def test_a_planned_switchover_and_its_failback_killed_after_any_step_converge(
        make_pool, sshd, tmp_path):
    """Per k: ``zbak failover j --planned`` (the source frozen, snapshotted, its last
    incremental sent, then the switch) and ``zbak failback j --yes`` (the frozen source
    receives directly), each killed after step k and run again."""
    site = Site(make_pool, sshd, tmp_path, recursive=False)
    site.nightly(256 * KiB)
    run = Run(site)
    k, killed = 0, True
    while killed:
        k += 1 if k == 0 else STRIDE
        assert k < 60, "the runs never finished: the step count does not converge"
        before = _write(site.source_dir, f"last-{k}")  # not snapshotted: it goes along
        killed = run.killed(k, "planned failover", "failover", "j", "--planned")
        assert tree_digest(site.live) == before, f"planned failover, k={k}: the source's"
        _way_back_held(site, f"planned failover, k={k}")
        written = _write(site.live, f"replica-{k}")
        killed |= run.killed(k, "failback", "failback", "j", "--yes")
        _failed_back(site, written, f"failback, k={k}")
    assert run.finished == {"planned failover", "failback"}
    assert site.nightly(64 * KiB) < 1 << 20, "replication goes on incrementally"


def test_a_failback_that_keeps_the_masters_write_killed_after_any_step_converges(
        make_pool, sshd, tmp_path):
    """Per k: the master's pool exported, ``zbak failover j``, a write on the live replica;
    the master imported with a write of its own since the common snapshot, unmounted (so it
    is planned to receive directly, zfs receive finds it modified, and the failback plans
    again, renaming the master's tree aside and cloning it back); ``zbak failback j --yes``
    killed after step k and run again. The unplanned failover's steps are the planned one's
    switch (the test above)."""
    site = Site(make_pool, sshd, tmp_path, recursive=False)
    site.nightly(256 * KiB)
    run = Run(site)
    written = tree_digest(site.source_dir)
    k, killed = 0, True
    while killed:
        k += 1 if k == 0 else STRIDE
        assert k < 60, "the runs never finished: the step count does not converge"
        site.export()
        site.ok("failover", "j")
        assert tree_digest(site.live) == written, f"k={k}: the replica's"
        written = _write(site.live, f"replica-{k}")
        site.import_()
        master = _write(site.source_dir, f"master-{k}")
        zfs("unmount", site.data)
        kept = _kept_trees(site)
        killed = run.killed(k, "failback", "failback", "j", "--yes")
        _failed_back(site, written, f"failback, k={k}")
        (new,) = _kept_trees(site) - kept
        zfs("mount", new)
        assert tree_digest(Path(prop(new, "mountpoint"))) == master, f"k={k}: the master's"
        zfs("unmount", new)
    assert run.finished == {"failback"}
    assert site.nightly(64 * KiB) < 1 << 20, "replication goes on incrementally"


def test_a_failback_killed_between_a_full_stream_and_its_mark_converges(
        make_pool, sshd, tmp_path):
    """A dataset made on the live replica after the failover goes to the master as a full
    stream; the failback killed right after that stream, before the new dataset is marked
    (docs/failover.md#when-a-failover-or-failback-is-killed), and run again: no second full
    stream, nothing destroyed, the new dataset held for the target like the others and its
    files at its place, the replica a replica."""
    site = Site(make_pool, sshd, tmp_path)
    site.nightly(64 * KiB)
    run = Run(site)
    site.export()
    site.ok("failover", "j")
    zfs("create", f"{site.replica}/new")
    _write(Path(prop(f"{site.replica}/new", "mountpoint")), "made-there")
    written = tree_digest(site.live)
    site.import_()
    full = f"zfs.full\t{site.replica}/new -> {site.data}/new"
    code, steps, stderr = crash(site, None, "failback", "j", "--yes", at=full)
    assert code == -signal.SIGKILL and full in steps[-1], f"{steps[-1:]} {stderr}"
    assert not (writable(site.replica) and writable(site.data)), "writable on both sides"
    run.kept("killed after the full stream")
    made = prop(f"{site.data}/new", "guid")
    code, steps, stderr = crash(site, None, "failback", "j", "--yes")
    assert code == 0, stderr
    assert not [s for s in steps if "\tzfs.full\t" in s], "no second full stream"
    assert prop(f"{site.data}/new", "guid") == made, "the new dataset is the one received"
    run.kept("rerun")
    _failed_back(site, written, "rerun")
    newest = site.snaps(f"{site.data}/new")[-1]
    assert prop(f"{site.data}/new@{newest}", "userrefs") == "1", "held for the target"
    assert site.nightly(64 * KiB) < 1 << 20, "replication goes on incrementally"
