"""Dataset locks across hosts sharing a PostgreSQL catalog (``catalog.fleetlock``), on the test
session's real PostgreSQL 15: two state directories stand for two hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import sqlalchemy as sa

from zrepl_py.catalog.fleetlock import FleetLocks, advisory_key, described, parse_described
from zrepl_py.errors import LockBroken, Locked
from zrepl_py.locking import LockRecord, dataset_lock, holder

pytestmark = pytest.mark.pg
KEY = "master:tank/db"


@pytest.fixture
def fleet(pg_url):
    locks = FleetLocks(pg_url)
    yield locks
    locks.close()


def test_a_dataset_locked_on_one_host_is_locked_for_another_and_free_once_released(
        fleet, pg_url, tmp_path):
    other = FleetLocks(pg_url)
    try:
        with dataset_lock(tmp_path / "one", KEY, "archive", shared=fleet):
            found = holder(tmp_path / "two", KEY, shared=other)
            assert found is not None and (found.action, found.pid) == ("archive", os.getpid())
            with pytest.raises(Locked, match=rf"locked by pid {os.getpid()} \(archive\) on"):
                with dataset_lock(tmp_path / "two", KEY, "prune", shared=other):
                    pass
            with dataset_lock(tmp_path / "two", "master:tank/other", "prune", shared=other):
                pass  # another dataset is free
        assert holder(tmp_path / "two", KEY, shared=other) is None
        with dataset_lock(tmp_path / "two", KEY, "prune", shared=other):
            pass
    finally:
        other.close()


def test_the_lock_of_a_killed_holder_is_free_as_soon_as_its_session_ends(fleet, pg_url, tmp_path):
    code = textwrap.dedent(f"""
        import pathlib, time
        from zrepl_py.catalog.fleetlock import FleetLocks
        from zrepl_py.locking import dataset_lock
        with dataset_lock(pathlib.Path({str(tmp_path / 'one')!r}), {KEY!r}, 'archive',
                          shared=FleetLocks({pg_url!r})):
            print('held', flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(Locked, match=f"pid {proc.pid}"):
            with dataset_lock(tmp_path / "two", KEY, "archive", shared=fleet):
                pass
    finally:
        proc.kill()
        proc.wait()
    # the server ends the session once it reads the closed socket: wait for that, not a time
    deadline = time.monotonic() + 30
    while holder(tmp_path / "two", KEY, shared=fleet) is not None:
        assert time.monotonic() < deadline, "the killed holder's session never ended"
        time.sleep(0.05)
    with dataset_lock(tmp_path / "two", KEY, "archive", shared=fleet):
        pass


def test_a_holder_whose_session_is_lost_stops_with_lock_broken(fleet, pg_url, tmp_path):
    """The server ends the holder's session (as a lost connection or a vanished host would):
    its heartbeat finds the lock gone and stops the run, since another host may take it."""
    broken: list[LockBroken] = []
    seen = threading.Event()

    def stop(exc: LockBroken) -> None:
        broken.append(exc)
        seen.set()

    with pytest.raises(LockBroken, match="lost with its database session"), \
            dataset_lock(tmp_path / "one", KEY, "archive", shared=fleet, heartbeat=0.05,
                         on_broken=stop):
        engine = sa.create_engine(pg_url)
        try:
            with engine.connect() as connection:
                ended = connection.execute(sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name LIKE :name"),
                    {"name": f"zbak archive pid {os.getpid()} on %"}).scalars().all()
        finally:
            engine.dispose()
        assert ended == [True]
        assert seen.wait(30), "the heartbeat never noticed"
    assert "lost with its database session" in str(broken[0])
    with dataset_lock(tmp_path / "two", KEY, "archive", shared=fleet):
        pass


def test_lock_keys_and_holder_names():
    assert advisory_key(KEY) == advisory_key(KEY) != advisory_key("master:tank/db2")
    assert -2**63 <= advisory_key(KEY) < 2**63
    record = LockRecord("backup-1", 4242, "audit --repair", "t", 5.0)
    name = described(record)
    assert name == "zbak audit --repair pid 4242 on backup-1"
    assert parse_described(name, 9.0) == LockRecord("backup-1", 4242, "audit --repair", "", 9.0)
    long = described(LockRecord("h" * 100, 1, "archive", "t", 0.0))
    assert len(long.encode()) == 63 and long.startswith("zbak archive pid 1 on hhh")
    assert parse_described("psql", 0.0) is None
