"""The floor of ``zbak serve`` (``--keep-newer-than``, ``--keep-last``) through a real sshd
forced command, with real zfs-fuse pools: a master whose root an intruder holds asks the
backup host to release, destroy and roll back its replica snapshots, pushes junk snapshots to
defeat a count, and pushes a stream that claims its snapshot was made in 2001; the host keeps
what its floor protects, logs each refusal, and the master's own ``zbak prune`` reports those
snapshots as kept (floor) and still prunes the rest.

Each test runs the same attack without the floor (or past it), where it succeeds: so it can
fail. The intruder uses the master's own key and the real OpenSSH client, as root on the
master would. Time on the backup host is moved forward by moving the floor journal's
witnesses back (``age``): the journal is the host's own record of when it saw each txg, so
that is what "eight days later" means to the floor.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess

import pytest
from support.cli import prop, snapshots, zfs
from support.served import Backup

from zrepl_py.errors import ExitStatus

pytestmark = [pytest.mark.zfs, pytest.mark.ssh]

REFUSED = 126
FLOOR = "--allow-destroy-own --keep-newer-than 7d --keep-last 2"
TIME_FLOOR = "--allow-destroy-own --keep-newer-than 7d"
NO_FLOOR = "--allow-destroy-own"
KEPT = "is kept by the floor of zbak serve"


@pytest.mark.parametrize("options", [FLOOR, NO_FLOOR], ids=["floor", "no-floor"])
def test_an_intruder_with_the_masters_key_cannot_release_destroy_or_roll_back_young_snapshots(
        make_pool, sshd_factory, tmp_path, options):
    """docs/security.md#a-backup-host-that-defends-itself, the replica emptied in push mode: release
    the backup admin's hold, destroy every snapshot newest first, roll back to the oldest, destroy
    it."""
    backup = Backup(make_pool, sshd_factory, tmp_path, options)
    real = backup.replicate(4)
    oldest = f"{backup.replica}@{real[0]}"
    zfs("hold", "keep", oldest)  # the backup host's admin pins it, outside zbak
    asked = ([f"zfs release keep {oldest}"]
             + [f"zfs destroy {backup.replica}@{s}" for s in reversed(real[1:])]
             + [f"zfs rollback {oldest}", f"zfs destroy {oldest}"])
    done = [backup.intruder(request) for request in asked]
    if options == NO_FLOOR:
        assert [d.returncode for d in done] == [0] * len(asked), [d.stderr for d in done]
        assert snapshots(backup.replica) == [], "without the floor the attack succeeds"
        return
    assert [d.returncode for d in done] == [REFUSED] * len(asked), [d.stderr for d in done]
    assert snapshots(backup.replica) == real
    assert prop(oldest, "userrefs") == "1", "the admin's hold stays"
    errors = [d.stderr.decode() for d in done]
    assert "not a hold zbak places" in errors[0]
    assert all(KEPT in e and "less than 7d ago" in e for e in errors[1:]), errors
    assert "would roll back past" in errors[4]
    refused = backup.refusals()
    assert len(refused) == len(asked)
    assert all(request in line for request, line in zip(asked, refused, strict=True))


@pytest.mark.parametrize("days", [0, 8], ids=["young", "older-than-the-floor"])
def test_junk_snapshots_cannot_push_young_snapshots_out_of_the_floor(
        make_pool, sshd_factory, tmp_path, days):
    """The count alone is no guarantee: the intruder makes three junk snapshots, so the
    real ones are no longer among the newest 2 (``--keep-last 2``), then destroys the real
    ones. The time floor keeps them while they are younger than 7 days; eight days later
    (the second case) nothing keeps them, which shows the count did not."""
    backup = Backup(make_pool, sshd_factory, tmp_path, FLOOR)
    real = backup.replicate(3)
    if days:
        backup.age(days)
    junk = [f"zbak_2099010{i}T000000Z" for i in range(1, 4)]
    for name in junk:
        assert backup.intruder(f"zfs snapshot {backup.replica}@{name}").returncode == 0
    done = [backup.intruder(f"zfs destroy {backup.replica}@{s}") for s in real]
    if days:
        assert [d.returncode for d in done] == [0, 0, 0], [d.stderr for d in done]
        assert snapshots(backup.replica) == junk
        return
    assert [d.returncode for d in done] == [REFUSED] * 3, [d.stderr for d in done]
    for d in done:
        assert KEPT in d.stderr.decode() and "less than 7d ago" in d.stderr.decode()
        assert "newest" not in d.stderr.decode(), "the count no longer covers them"
    assert snapshots(backup.replica) == real + junk


def forge_creation(stream: bytes, creation: int) -> bytes:
    """A one-snapshot send stream (BEGIN ... END, zfs-fuse's format) whose BEGIN record's
    ``drr_creation_time`` says ``creation`` (seconds since the epoch), with the END record's
    fletcher-4 checksum of everything before it made right again, so zfs receive takes it.
    Offsets from OpenZFS ``include/sys/zfs_ioctl.h``: a record is 312 bytes, ``drr_type`` and
    ``drr_payloadlen`` (uint32 each), then ``drr_begin`` (``drr_magic``,
    ``drr_versioninfo``, ``drr_creation_time``, ...) or ``drr_end`` (``drr_checksum``)."""
    data = bytearray(stream)
    end = len(data) - 312
    assert struct.unpack_from("<I", data, end)[0] == 5, "the last record is END"
    struct.pack_into("<Q", data, 24, creation)
    a = b = c = d = 0
    for (word,) in struct.iter_unpack("<I", bytes(data[:end])):
        a = (a + word) % 2**64
        b = (b + a) % 2**64
        c = (c + b) % 2**64
        d = (d + c) % 2**64
    struct.pack_into("<4Q", data, end + 8, a, b, c, d)
    return bytes(data)


@pytest.mark.parametrize("options", [TIME_FLOOR, NO_FLOOR], ids=["floor", "no-floor"])
def test_a_snapshot_whose_stream_claims_2001_is_as_young_as_its_receive(
        make_pool, sshd_factory, tmp_path, options):
    """The master writes the stream, so a received snapshot's ``creation`` (and its name) say
    whatever the master wants: here 2001-01-01. The time floor (no count here) dates it by
    this host's witness of its receive, so it stays; without the floor the same destroy
    goes through."""
    backup = Backup(make_pool, sshd_factory, tmp_path, options)
    name = "zbak_20010101T000000Z"
    (backup.src.mountpoint / "data" / "f").write_bytes(os.urandom(50_000))
    zfs("snapshot", f"{backup.data}@{name}")
    stream = subprocess.run(["zfs", "send", f"{backup.data}@{name}"], capture_output=True,
                            check=True, timeout=60).stdout
    forged = f"{backup.root}/forged"
    done = backup.intruder(f"zfs receive -u {forged}", forge_creation(stream, 978307200))
    assert done.returncode == 0, done.stderr
    assert prop(f"{forged}@{name}", "creation") == "978307200", "zfs took the forged time"

    done = backup.intruder(f"zfs destroy {forged}@{name}")
    if options == NO_FLOOR:
        assert done.returncode == 0 and snapshots(forged) == []
        return
    assert done.returncode == REFUSED and KEPT in done.stderr.decode(), done.stderr
    assert snapshots(forged) == [name]


@pytest.mark.parametrize("options", [TIME_FLOOR, NO_FLOOR],
                         ids=["floor", "no-floor"])
def test_the_masters_prune_reports_what_the_floor_keeps_and_prunes_the_rest(
        make_pool, sshd_factory, tmp_path, options):
    """Replica retention ``keep_last = 1`` wants four of five replica snapshots gone. Three
    were received eight days ago (past the 7-day floor): destroyed. The fourth is a day
    young: the host refuses, and ``zbak prune`` exits 0 naming it "kept (floor)", also on
    the next run (``--json``: ``kept_by_floor``). Without the floor all four go."""
    backup = Backup(make_pool, sshd_factory, tmp_path, options,
                    replicate_extra="retention = { keep_last = 1 }\n")
    old = backup.replicate(3)
    if options != NO_FLOOR:
        backup.age(8)
    young = backup.replicate(2)
    done = backup.zbak("prune")
    assert done.returncode == ExitStatus.OK, done.stdout + done.stderr
    if options == NO_FLOOR:
        assert snapshots(backup.replica) == young[1:]
        assert "kept (floor)" not in done.stdout
        return
    assert snapshots(backup.replica) == young, done.stdout
    assert f"kept (floor) {backup.replica}@{young[0]}: on this host since" in done.stdout
    assert "destroyed 3, kept (floor) 1, skipped 0, failed 0" in done.stdout
    (refused,) = backup.refusals()
    assert f"zfs destroy {backup.replica}@{young[0]}" in refused and KEPT in refused
    assert not any(s in snapshots(backup.replica) for s in old)

    again = backup.zbak("prune", "--json")
    assert again.returncode == ExitStatus.OK, again.stdout + again.stderr
    outcome = json.loads(again.stdout)["replica_outcome"]["j"][f"backup:{backup.replica}"]
    assert [name for name, _ in outcome["kept_by_floor"]] == [f"{backup.replica}@{young[0]}"]
    assert outcome["failed"] == [] and outcome["destroyed"] == []


@pytest.mark.parametrize("options", [TIME_FLOOR, NO_FLOOR], ids=["floor", "no-floor"])
def test_a_rollback_on_divergence_stops_at_the_floor(make_pool, sshd_factory, tmp_path,
                                                     options):
    """``on_divergence = "rollback"`` destroys the replica's snapshots the source does not
    have, then rolls back: the floor keeps a young one, so the run fails and it stays;
    without the floor the run goes through."""
    backup = Backup(make_pool, sshd_factory, tmp_path, options,
                    replicate_extra='on_divergence = "rollback"\n')
    first = backup.replicate(1)
    diverged = "zbak_20260301T000000Z"
    zfs("snapshot", f"{backup.replica}@{diverged}")  # the replica gained one of its own
    (backup.src.mountpoint / "data" / "next").write_bytes(os.urandom(50_000))
    zfs("snapshot", f"{backup.data}@zbak_20260201T000000Z")
    done = backup.zbak("replicate")
    if options == NO_FLOOR:
        assert done.returncode == ExitStatus.OK, done.stdout + done.stderr
        assert snapshots(backup.replica) == [*first, "zbak_20260201T000000Z"]
        return
    assert done.returncode == ExitStatus.FAILED, done.stdout + done.stderr
    assert KEPT in done.stdout + done.stderr
    assert snapshots(backup.replica) == [*first, diverged]
