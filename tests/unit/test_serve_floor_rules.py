"""The floor of ``zbak serve`` (pure rules, ``zrepl_py.serve.floor``), how the master reads
its refusals (``zfs.errors``), and the option rules at start (a real ``zbak serve``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from zrepl_py.errors import CommandFailed, CommandRefused, DatasetNotFound, KeptByFloor
from zrepl_py.serve import journal as floor_journal
from zrepl_py.serve.cmdline import split_command_line
from zrepl_py.serve.execute import REFUSED, decide
from zrepl_py.serve.floor import (
    Floor,
    FloorAction,
    Snap,
    Witness,
    check_destroy,
    check_rollback,
    compacted,
    first_seen,
    floor_action,
    parse_journal,
    why_kept,
    worth_recording,
)
from zrepl_py.serve.policy import Policy
from zrepl_py.zfs.errors import classify, floor_reasons, map_error

NOW = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
POOL = 1234
FLOOR = Floor(dt.timedelta(days=7), 2, Path("/j"), "7d")
DS = "backup/replicas/data"
OWN = "zbak_20260101T000000Z"
SNAPS = [Snap(f"{DS}@zbak_2026010{i}T000000Z", 100 + 10 * i) for i in range(1, 6)]
"""Five snapshots, createtxg 110 .. 150."""


def days_ago(days: float) -> dt.datetime:
    return NOW - dt.timedelta(days=days)


def witness(days: float, txg: int, pool: int = POOL) -> Witness:
    return Witness(days_ago(days).replace(microsecond=0), pool, txg, "backup")


def test_a_snapshot_is_dated_by_the_earliest_witness_that_covers_its_createtxg():
    journal = [witness(20, 105), witness(10, 125), witness(3, 150)]
    assert first_seen(110, POOL, journal) == journal[1].at, "20 days ago txg 110 did not exist"
    assert first_seen(125, POOL, journal) == journal[1].at
    assert first_seen(126, POOL, journal) == journal[2].at
    assert first_seen(151, POOL, journal) is None
    assert first_seen(110, POOL + 1, journal) is None, "another pool's txgs say nothing"


def test_an_old_snapshot_outside_the_newest_n_may_go_and_everything_else_stays():
    journal = [witness(10, 120), witness(1, 150)]
    reasons = {s.name[-16:-8]: why_kept(s, SNAPS, FLOOR, POOL, journal, NOW) for s in SNAPS}
    assert reasons["20260101"] == reasons["20260102"] == []
    assert reasons["20260103"] == ["on this host since "
                                   f"{journal[1].at:%Y-%m-%dT%H:%M:%SZ} at the latest, less "
                                   "than 7d ago"]
    assert reasons["20260105"][1] == "one of the newest 2 snapshots of its dataset (receive order)"
    unwitnessed = why_kept(SNAPS[0], SNAPS, FLOOR, POOL, [], NOW)
    assert unwitnessed and unwitnessed[0].startswith("not yet witnessed")


def test_the_newest_n_are_counted_by_createtxg_not_by_name():
    """A snapshot named as the oldest but received last is the newest."""
    renamed = SNAPS[:4] + [Snap(f"{DS}@zbak_19990101T000000Z", 150)]
    journal = [witness(30, 150)]
    assert why_kept(renamed[-1], renamed, FLOOR, POOL, journal, NOW) == [
        "one of the newest 2 snapshots of its dataset (receive order)"]
    assert why_kept(renamed[2], renamed, FLOOR, POOL, journal, NOW) == []


def test_a_witness_is_recorded_only_when_it_tells_something_new():
    known = [witness(5, 130)]
    assert worth_recording(witness(4, 131), known)
    assert not worth_recording(witness(4, 130), known), "no txg beyond the last"
    assert not worth_recording(witness(6, 140), known), "a clock set back"
    assert worth_recording(witness(6, 10, pool=POOL + 1), known), "another pool"
    assert worth_recording(witness(6, 10), [])


def test_compaction_never_dates_a_snapshot_earlier_and_keeps_the_journal_small():
    rng = random.Random(31)
    journal, txg = [], 0
    for minute in range(0, 60 * 24 * 90, 7):  # a witness every 7 minutes for 90 days
        txg += rng.randint(1, 40)
        journal.append(Witness(days_ago(90) + dt.timedelta(minutes=minute), POOL, txg, "b"))
    kept = compacted(journal, NOW)
    assert len(kept) < 31 * 24 + 60 + 2, len(kept)
    for createtxg in [1, *(rng.randint(1, txg) for _ in range(2000)), txg]:
        full, small = first_seen(createtxg, POOL, journal), first_seen(createtxg, POOL, kept)
        assert full is not None and small is not None and small >= full
        assert small - full <= dt.timedelta(days=1)


def test_a_journal_line_that_does_not_parse_is_skipped():
    good = witness(1, 42)
    text = (good.line() + "garbage\n" + "2026-13-01T00:00:00Z\t1\t2\tp\n"
            + "2026-01-01T00:00:00Z\tx\t2\tp\n" + "2026-01-01T00:00:00Z\t1\t2\tp\tmore\n")
    assert parse_journal(text) == [good]


def test_destroy_and_rollback_are_refused_past_what_the_floor_keeps():
    journal = [witness(10, 130), witness(1, 150)]
    check_destroy(SNAPS[0].name, SNAPS, FLOOR, POOL, journal, NOW)
    with pytest.raises(CommandRefused, match="is kept by the floor of zbak serve"):
        check_destroy(SNAPS[3].name, SNAPS, FLOOR, POOL, journal, NOW)
    with pytest.raises(CommandRefused, match="does not exist"):
        check_destroy(f"{DS}@gone", SNAPS, FLOOR, POOL, journal, NOW)
    with pytest.raises(CommandRefused, match=f"would roll back past .*{SNAPS[3].name} is kept"):
        check_rollback(SNAPS[0].name, SNAPS, FLOOR, POOL, journal, NOW)
    check_rollback(SNAPS[4].name, SNAPS, FLOOR, POOL, journal, NOW)  # nothing newer


def test_the_master_reads_a_floor_refusal_as_kept_and_a_missing_snapshot_as_gone():
    journal = [witness(1, 150)]
    for name, expected in ((SNAPS[3].name, KeptByFloor), (f"{DS}@gone", DatasetNotFound)):
        with pytest.raises(CommandRefused) as caught:
            check_destroy(name, SNAPS, FLOOR, POOL, journal, NOW)
        stderr = f"zbak serve: refused: {caught.value}\n"  # as serve.execute prints it
        assert classify(stderr) is expected
    error = map_error(CommandFailed(["zfs", "destroy", SNAPS[3].name], REFUSED, stderr))
    assert isinstance(error, DatasetNotFound)
    kept = map_error(CommandFailed(["zfs"], REFUSED, f"zbak serve: refused: zfs destroy: "
                                                      f"{DS}@x is kept by the floor of zbak "
                                                      "serve: why one; why two\n"))
    assert isinstance(kept, KeptByFloor) and floor_reasons(kept) == "why one; why two"


@pytest.mark.parametrize("request_text, action", [
    (f"zfs destroy {DS}@{OWN}", FloorAction("destroy", f"{DS}@{OWN}", (DS,))),
    (f"zfs rollback {DS}@{OWN}", FloorAction("rollback", f"{DS}@{OWN}", (DS,))),
    (f"zfs receive -u {DS}", FloorAction("creates", None, (DS,))),
    (f"zfs recv {DS} -u", FloorAction("creates", None, (DS,))),
    (f"zstd -q -d -c | zfs receive -u -s {DS}", FloorAction("creates", None, (DS,))),
    (f"zfs snapshot -r {DS}@zbak_20260101T000000Z",
     FloorAction("creates", None, (DS,))),
    (f"zfs destroy '{DS}#zbak_0a1b2c3d4e_1'", None),
    (f"zfs receive -A {DS}", None),
    ("zfs receive -x mountpoint", None),
    ("zfs snapshot backup@zbak%probe1 backup@zbak%probe2", None),
    (f"zfs release zbak:j:backup {DS}@{OWN}", None),
    (f"zfs list -H -o name {DS}", None),
])
def test_what_the_floor_does_around_each_request(request_text, action):
    policy = Policy(roots=("backup/replicas",), allow_destroy_own=True, floor=FLOOR)
    assert decide(request_text, policy).floor == action
    assert decide(request_text, dataclasses.replace(policy, floor=None)).floor is None
    assert floor_action(split_command_line(request_text)[-1]) == action


def test_with_a_floor_only_zbaks_own_holds_are_released():
    with pytest.raises(CommandRefused, match="'keep' is not a hold zbak places"):
        floor_action(["zfs", "release", "keep", f"{DS}@s"])


def test_a_floor_and_a_forced_receive_cannot_be_combined():
    with pytest.raises(ValueError, match="--allow-force-receive cannot be used with a floor"):
        Policy(roots=("backup/replicas",), allow_force_receive=True, floor=FLOOR)


@pytest.mark.parametrize("options, message", [
    (["--keep-newer-than", "7d", "--allow-force-receive"],
     "--allow-force-receive cannot be used with a floor"),
    (["--keep-last", "3"], "--keep-last and --floor-journal need --keep-newer-than"),
    (["--floor-journal", "/tmp/j"], "--keep-last and --floor-journal need --keep-newer-than"),
    (["--keep-newer-than", "0s"], "--keep-newer-than must be longer than 0"),
    (["--keep-newer-than", "soon"], "--keep-newer-than: expected a duration"),
    (["--keep-newer-than", "7d", "--keep-last", "0"], "--keep-last"),
])
def test_a_floor_serve_cannot_start_with_is_one_line_and_exit_2(tmp_path, options, message):
    """As sshd runs the forced command: every session of that key then fails this way."""
    zbak = Path(sys.executable).with_name("zbak")
    done = subprocess.run([str(zbak), "serve", "--root", "backup/replicas", *options],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SSH_ORIGINAL_COMMAND": "zfs version"})
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 or "Usage:" in done.stderr


def test_a_long_journal_is_rewritten_compacted_private_and_dating_nothing_earlier(tmp_path):
    path = tmp_path / "state" / "floor-journal.tsv"
    first = [Witness(days_ago(60) + dt.timedelta(minutes=10 * i), POOL, 10 + i, "b")
             for i in range(floor_journal.COMPACT_AFTER)]
    with floor_journal.locked(path):
        for w in first[:10]:
            floor_journal.add(path, w, floor_journal.read(path))
        assert floor_journal.read(path) == first[:10], "appended one line each"
        path.write_text("".join(w.line() for w in first))
        last = Witness(NOW.replace(microsecond=0), POOL, 10**6, "b")
        floor_journal.add(path, last, floor_journal.read(path))
    kept = floor_journal.read(path)
    assert kept[-1] == last and len(kept) < len(first) // 4, len(kept)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    for w in first[::97]:
        assert first_seen(w.txg, POOL, kept) >= first_seen(w.txg, POOL, first)


def test_the_journal_lock_excludes_another_process(tmp_path):
    """Two floor checks never interleave: the second serve waits on the same flock."""
    path = tmp_path / "floor-journal.tsv"
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
             "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)")
    lock = f"{path}.lock"
    with floor_journal.locked(path):
        busy = subprocess.run([sys.executable, "-c", probe, lock], capture_output=True,
                              text=True, timeout=60)
    free = subprocess.run([sys.executable, "-c", probe, lock], capture_output=True, text=True,
                          timeout=60)
    assert busy.returncode != 0 and "BlockingIOError" in busy.stderr
    assert free.returncode == 0, free.stderr
