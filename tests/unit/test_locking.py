"""Per-dataset locks: exclusive across processes, released when the holder dies, private files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from zrepl_py.errors import Locked
from zrepl_py.locking import dataset_lock, lock_path


def test_a_second_holder_of_the_same_dataset_fails_fast_with_locked(tmp_path):
    """docs/reliability.md#r28-concurrent-runs: the second run fails at once with Locked (exit
    3)."""
    with dataset_lock(tmp_path, "local:tank/a", "replicate"):
        with pytest.raises(Locked, match="replicate"):
            with dataset_lock(tmp_path, "local:tank/a", "snapshot"):
                pass


def test_different_datasets_lock_independently(tmp_path):
    """docs/reliability.md#r28-concurrent-runs: different datasets proceed in parallel."""
    with dataset_lock(tmp_path, "local:tank/a", "x"):
        with dataset_lock(tmp_path, "local:tank/b", "y"):
            pass


def test_a_lock_held_by_a_killed_process_is_free_again(tmp_path):
    """docs/reliability.md#r28-concurrent-runs, docs/reliability.md#r29-stale-locks: a killed holder
    on this host leaves no lock behind."""
    code = textwrap.dedent(f"""
        import sys, time
        from zrepl_py.locking import dataset_lock
        with dataset_lock(__import__('pathlib').Path({str(tmp_path)!r}), 'local:tank/a', 'x'):
            print('held', flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(Locked, match=f"pid {proc.pid}"):
        with dataset_lock(tmp_path, "local:tank/a", "y"):
            pass
    proc.kill()
    proc.wait()
    with dataset_lock(tmp_path, "local:tank/a", "y"):
        pass


def test_lock_files_are_0600_in_a_0700_directory_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        with dataset_lock(tmp_path / "state", "local:tank/a", "x"):
            pass
    finally:
        os.umask(old)
    path = lock_path(tmp_path / "state", "local:tank/a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


# --- docs/reliability.md#r29-stale-locks: stale locks (restic lock_file.go stale(); borg
# test_refresh_stale_lock) ---

from zrepl_py.errors import LockBroken
from zrepl_py.locking import LockRecord, is_stale

HERE, THERE = "backup-a", "backup-b"
T = 1_800_000_000.0


@pytest.mark.parametrize("record_host, pid_running, age, stale", [
    (HERE, False, 5, True),       # dead pid on this host: stale at once
    (HERE, True, 5, False),       # live pid on this host, fresh: held
    (THERE, False, 5, False),     # another host: its pid means nothing here
    (THERE, True, 1799, False),   # another host within the ttl: held
    (THERE, False, 1801, True),   # another host past the ttl: stale
    (HERE, True, 1801, True),     # nobody refreshed it for longer than the ttl
])
def test_staleness_follows_host_pid_and_ttl(record_host, pid_running, age, stale):
    """docs/reliability.md#r29-stale-locks (U): a dead pid on this host is stale, another host's
    lock only after its ttl."""
    record = LockRecord(record_host, 4242, "replicate", "t0", T - age)
    assert is_stale(record, host=HERE, now=T, ttl=1800, alive=lambda pid: pid_running) is stale


def _take_over_in_place(path, until, timeout: float = 20.0) -> None:
    """Write another host's record into the lock file ``path`` in place, as a taker does, and
    keep it there until ``until()`` is true. A refresh racing the write can put the holder's
    record back; a real taker's own heartbeat then stops the taker instead (locking.py's module
    doc), this one writes its record again, so that the holder's next refresh finds it."""
    theirs = LockRecord(THERE, 1, "prune", "theirs", T).dumps()
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        if path.read_bytes() != theirs:
            path.write_bytes(theirs)
        time.sleep(0.01)


def _plant(state_dir, key, record: LockRecord) -> None:
    path = lock_path(state_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(record.dumps())


def test_a_record_of_a_dead_process_on_this_host_is_taken_over(tmp_path):
    """docs/reliability.md#r29-stale-locks: a crash left a record (flock free) whose pid no longer
    runs here."""
    dead = 4_194_304 + 17  # above Linux's largest pid_max: never a running process
    _plant(tmp_path, "k", LockRecord(HERE, dead, "replicate", "old", T))
    with dataset_lock(tmp_path, "k", "prune", host=HERE, clock=lambda: T + 1,
                      heartbeat=0) as lease:
        assert lease.record.action == "prune" and lease.record.token != "old"
    assert lock_path(tmp_path, "k").read_bytes() == b"", "a clean release leaves no record"


def test_another_hosts_lock_is_respected_until_its_ttl_then_taken_over(tmp_path):
    """docs/reliability.md#r29-stale-locks: on a state dir shared with another host (whose flock
    this host cannot see), its record blocks with Locked until it was not refreshed for the ttl."""
    _plant(tmp_path, "k", LockRecord(THERE, os.getpid(), "replicate", "theirs", T))
    with pytest.raises(Locked, match=f"on {THERE}"):
        with dataset_lock(tmp_path, "k", "prune", host=HERE, clock=lambda: T + 1799,
                          ttl=1800, heartbeat=0):
            pass
    assert LockRecord.loads(lock_path(tmp_path, "k").read_bytes()).token == "theirs"
    with dataset_lock(tmp_path, "k", "prune", host=HERE, clock=lambda: T + 1801, ttl=1800,
                      heartbeat=0) as lease:
        assert LockRecord.loads(lock_path(tmp_path, "k").read_bytes()) == lease.record


def test_a_holder_whose_own_lock_went_stale_can_refresh_it(tmp_path):
    """docs/reliability.md#r29-stale-locks (borg test_refresh_stale_lock): the record aged past the
    ttl, nobody took it: refresh succeeds and writes the new time."""
    now = [T]
    with dataset_lock(tmp_path, "k", "replicate", host=HERE, clock=lambda: now[0], ttl=60,
                      heartbeat=0) as lease:
        now[0] = T + 3600
        assert is_stale(lease.record, host=THERE, now=now[0], ttl=60)
        lease.refresh()
        on_disk = LockRecord.loads(lock_path(tmp_path, "k").read_bytes())
        assert on_disk.refreshed == T + 3600 and not is_stale(on_disk, host=THERE, now=now[0],
                                                              ttl=60)


@pytest.mark.parametrize("how", ["rewritten by another host", "removed"])
def test_a_holder_whose_lock_was_broken_stops_with_lock_broken(tmp_path, how):
    """docs/reliability.md#r29-stale-locks (borg test_refresh_killed_lock): once another process
    took the lock over, refresh raises LockBroken, and the heartbeat makes the block end with
    LockBroken."""
    broken = threading.Event()
    with pytest.raises(LockBroken, match="taken over"):
        with dataset_lock(tmp_path, "k", "replicate", host=HERE, heartbeat=0.05,
                          on_broken=lambda exc: broken.set()) as lease:
            path = lock_path(tmp_path, "k")
            if how == "removed":
                path.unlink()
            else:
                _take_over_in_place(path, broken.is_set, timeout=10)
            assert broken.wait(10), "the heartbeat noticed"
            with pytest.raises(LockBroken):
                lease.refresh()


@pytest.mark.parametrize("sigint", ["default_int_handler", "SIG_IGN"])
def test_the_process_holding_a_broken_lock_aborts(tmp_path, sigint):
    """docs/reliability.md#r29-stale-locks: with the default handler the heartbeat interrupts the
    main thread: the process stops with LockBroken instead of working on unprotected. Also when it
    started with SIGINT ignored (bash starts a script's `zbak replicate &` so, and Python keeps it):
    that SIGINT was lost and the run went on; another SIGINT is still ignored then."""
    code = textwrap.dedent(f"""
        import os, pathlib, signal, time
        signal.signal(signal.SIGINT, signal.{sigint})
        from zrepl_py.locking import dataset_lock
        with dataset_lock(pathlib.Path({str(tmp_path)!r}), 'k', 'replicate', heartbeat=0.05):
            if signal.{sigint} is signal.SIG_IGN:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                print('an outside SIGINT is ignored', flush=True)
            print('held', flush=True)
            time.sleep(30)
        print('finished unprotected', flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if sigint == "SIG_IGN":
        assert proc.stdout.readline().strip() == "an outside SIGINT is ignored"
    assert proc.stdout.readline().strip() == "held"
    _take_over_in_place(lock_path(tmp_path, "k"), lambda: proc.poll() is not None)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode != 0 and "LockBroken" in err and "unprotected" not in out


def test_a_lock_released_with_sigint_ignored_leaves_it_ignored(tmp_path):
    """The handler a lock installs while SIGINT is ignored (see above) goes with the lock,
    and a lock inside it installs none of its own."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with dataset_lock(tmp_path, "outer", "replicate", heartbeat=0):
            during = signal.getsignal(signal.SIGINT)
            assert callable(during)
            with dataset_lock(tmp_path, "inner", "replicate", heartbeat=0):
                assert signal.getsignal(signal.SIGINT) is during
            assert signal.getsignal(signal.SIGINT) is during
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
