"""``zbak failover`` and ``zbak failback`` end to end (docs/design.md#replica-failover-and-failback):
real zfs-fuse pools on both sides, the target (push) or the source (pull) over the real sshd,
``zbak`` as a real process. The master dies (its pool is exported), the replica takes over and
is written to, the master's pool comes back, and the failback brings every byte written on
the replica to the source, sends the changes only (asserted against the full's size), keeps
what the source wrote after the common snapshot under the name the plan shows, and leaves the
replica a read-only replica that replication updates again."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from support.cli import prop, tree_digest, zfs
from support.failover import ZBAK, Site

pytestmark = [pytest.mark.zfs, pytest.mark.ssh]

MiB = 1 << 20
NEW = 64 * 1024
"""Bytes written in the dataset ``_made_on_the_replica`` makes."""
CHANGES = 2 * MiB + 256 * 1024
"""Bytes ``_live_replica_writes`` writes (and the few of one rewritten file); with a new
dataset, ``NEW`` more."""


def _only_the_changes(sent: int, full: int) -> None:
    """The failback sent the replica's changes (a stream's own overhead on top), far less
    than the full of the dataset."""
    assert CHANGES < sent < CHANGES + 512 * 1024 < full, \
        f"{sent} bytes sent: the changes ({CHANGES}), not the dataset ({full})"


def _live_replica_writes(site: Site, *, new: bool = False) -> dict[str, str]:
    """Write on the promoted replica (root and child; with ``new`` in a dataset made there,
    ``data/new``); return its files' digests (the root's with the children's below it)."""
    site.write(site.live, "on-replica", 2 * MiB)
    (site.live / "n1").write_bytes(b"changed on the replica\n")
    kid = Path(prop(f"{site.replica}/kid", "mountpoint"))
    site.write(kid, "kid-on-replica", 256 * 1024)
    if new:
        _made_on_the_replica(site)
    return {"": tree_digest(site.live), "kid": tree_digest(kid)}


def _made_on_the_replica(site: Site) -> None:
    """A dataset made on the live replica after the failover, ``data/new``, with a file:
    the failback sends it whole (in ``CHANGES``) and it must show at its place below the
    source's mountpoint, which the callers' digests of the whole tree check."""
    zfs("create", f"{site.replica}/new")
    site.write(Path(prop(f"{site.replica}/new", "mountpoint")), "made-there", NEW)


@pytest.mark.parametrize("mode,source_wrote", [("push", True), ("pull", False)],
                         ids=["push-source-wrote", "pull-quiet-source"])
def test_the_whole_cycle_keeps_every_byte_and_sends_only_the_changes(
        make_pool, sshd, tmp_path, mode, source_wrote):
    """zfs-fuse has no ``written``: a mounted source counts as written and the plan keeps it
    aside (renamed); a quiet one, unmounted after its import, is planned to receive directly,
    and the import's mount has written it, so zfs receive refuses it and the driver plans
    again, keeping it (docs/decisions.md#failback-keeps-the-source-aside-by-rename-and-clone).
    Either way it is kept, never rolled back."""
    site = Site(make_pool, sshd, tmp_path, mode=mode)
    full = site.nightly(4 * MiB)
    site.nightly(512 * 1024)
    later = None
    if source_wrote:  # after the last replication: a snapshot, and writes after it
        site.write(site.source_dir, "after-last-replication", MiB)
        later = "zbak_20990101T000000Z"
        zfs("snapshot", f"{site.data}@{later}")
        site.write(site.source_dir, "unsnapshotted", 300 * 1024)
        wrote = tree_digest(site.source_dir)
    common = site.snaps(site.replica)[-1]
    site.export()

    site.ok("failover", "j")
    assert site.marks(site.replica).keys() == {site.replica, f"{site.replica}/kid"}
    assert prop(site.replica, "readonly") == "off" and os.path.ismount(site.live)
    status = json.loads(site.ok("status", "--json", "--offline").stdout)
    assert status[0]["targets"][0]["failed_over"]["failed_over_at"]
    written = _live_replica_writes(site, new=True)
    site.import_()
    if not source_wrote:
        zfs("unmount", f"{site.data}/kid")
        zfs("unmount", site.data)

    refused = site.zbak("replicate")
    assert refused.returncode == 1 and "failed over by job j" in refused.stdout + refused.stderr
    plan = site.zbak("failback", "j")
    assert plan.returncode == 2 and "--yes" in plan.stderr, "no terminal: it needs --yes"
    assert site.marks(site.replica), "nothing was changed"

    done = site.ok("failback", "j", "--yes")
    kept = f"{site.data}-before-failback-"
    assert kept in done.stdout, done.stdout
    assert ("renamed to" in done.stdout) is source_wrote, "the plan shown first"
    assert tree_digest(site.source_dir) == written[""], "every byte written on the replica"
    assert tree_digest(Path(prop(f"{site.data}/kid", "mountpoint"))) == written["kid"]
    assert prop(f"{site.data}/new", "mounted") == "yes"
    _only_the_changes(site.run_bytes("failback") - NEW, full)
    assert site.marks(site.replica) == {} and prop(site.replica, "readonly") == "on"
    assert prop(site.replica, "mounted") == "no"
    assert common in site.snaps(site.data)
    if source_wrote:
        (name,) = [d for d in zfs("list", "-H", "-o", "name", "-r", site.src.name).split()
                   if d.startswith(kept) and "/" not in d[len(kept):]]
        assert name in done.stdout, "the plan named it"
        assert later in site.snaps(name), "the source's later snapshot is kept"
        assert prop(name, "readonly") == "on" and prop(name, "canmount") == "noauto"
        zfs("mount", name)
        assert tree_digest(Path(prop(name, "mountpoint"))) == wrote
    assert site.nightly(64 * 1024) < MiB, "replication goes on incrementally"


@pytest.fixture
def served(make_pool, sshd_factory, tmp_path):
    """A push site whose backup host's key runs zbak serve (floor, --allow-failover)."""
    log = tmp_path / "serve.log"
    src, bak = make_pool(), make_pool()
    command = (f"{ZBAK} serve --root {bak.name}/rep --log {log} --allow-destroy-own "
               f"--keep-newer-than 7d --floor-journal {tmp_path / 'journal.tsv'} "
               f"--allow-failover --failover-mounts {tmp_path}")
    server = sshd_factory(forced_command=command)
    pools = iter([src, bak])
    site = Site(lambda: next(pools), server, tmp_path, mode="push")
    return site, log


def test_failover_and_failback_through_a_zbak_serve_forced_command_with_a_floor(served):
    site, log = served
    full = site.nightly(4 * MiB)
    site.export()
    site.ok("failover", "j")
    written = _live_replica_writes(site)
    site.import_()
    site.ok("failback", "j", "--yes")
    assert tree_digest(site.source_dir) == written[""]
    _only_the_changes(site.run_bytes("failback"), full)
    lines = log.read_text().splitlines()
    assert not [line for line in lines if " REFUSED " in line], "nothing was refused"
    allowed = "\n".join(line for line in lines if " ALLOWED " in line)
    for verb in ("promote", "demote", "release"):
        assert f"zbak replica {verb}" in allowed
    assert site.marks(site.replica) == {}
    assert site.nightly(64 * 1024) < MiB


def test_a_planned_switchover_loses_nothing_written_before_it(make_pool, sshd, tmp_path):
    """With the source up and writable, an unplanned failover is refused (two writable
    copies); a planned one freezes the source and sends its last writes first."""
    site = Site(make_pool, sshd, tmp_path)
    site.nightly(MiB)
    site.write(site.source_dir, "last-minute", 700 * 1024)  # no snapshot, not replicated
    before = tree_digest(site.source_dir)
    unplanned = site.zbak("failover", "j")
    assert unplanned.returncode == 1
    assert "answers and is writable" in unplanned.stderr and "--planned" in unplanned.stderr
    assert site.marks(site.replica) == {} and prop(site.replica, "readonly") == "on"
    site.ok("failover", "j", "--planned")
    assert tree_digest(site.live) == before, "nothing written before the switch is lost"
    with pytest.raises(OSError):
        (site.source_dir / "after-the-switch").write_bytes(b"x")  # the source is read-only
    site.write(site.live, "on-replica", MiB)
    _made_on_the_replica(site)
    after = tree_digest(site.live)
    done = site.ok("failback", "j", "--yes")
    assert "before-failback" not in done.stdout, "the frozen source receives directly"
    assert tree_digest(site.source_dir) == after
    (site.source_dir / "writable-again").write_bytes(b"x")
    assert site.run_bytes("failback") < 2 * MiB


def test_an_empty_source_pool_is_offered_the_full_resend(make_pool, sshd, tmp_path):
    site = Site(make_pool, sshd, tmp_path, recursive=False)
    full = site.nightly(3 * MiB)
    site.export()
    site.ok("failover", "j")
    site.write(site.live, "on-replica", MiB)
    written = tree_digest(site.live)
    site.new_disk()  # the pool comes back empty
    plan = site.zbak("failback", "j", "--yes")
    assert plan.returncode == 1 and "--full" in plan.stderr
    assert "does not exist" in plan.stderr
    site.ok("failback", "j", "--yes", "--full")
    assert tree_digest(site.source_dir) == written
    assert site.run_bytes("failback") > full, "the full resend it offered"
    assert site.nightly(64 * 1024) < MiB


def test_a_source_seeded_from_the_archive_gets_only_the_changes(make_pool, sshd, tmp_path):
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    site = Site(make_pool, sshd, tmp_path, recursive=False, extra=textwrap.dedent(f"""
        [stores.cold]
        url = "file://{store}"
        [jobs.j.archive]
        store = "cold"
    """))
    full = site.nightly(4 * MiB)
    site.ok("archive")
    common = site.snaps(site.replica)[-1]
    site.export()
    site.ok("failover", "j")
    site.write(site.live, "on-replica", MiB)
    written = tree_digest(site.live)
    site.new_disk()  # then the archive's chain, which keeps the guids, into it
    site.ok("restore", site.data, "--to", f"@{common}", "--from", "cold", "--yes")
    done = site.ok("failback", "j", "--yes")
    assert "before-failback" not in done.stdout, "the seed receives directly"
    assert tree_digest(site.source_dir) == written
    assert site.run_bytes("failback") < full / 2


def test_a_master_with_a_stale_catalog_and_rollback_never_rolls_back_the_live_replica(
        make_pool, sshd, tmp_path):
    """The failover runs from another host (its own config and catalog); the master comes
    back with on_divergence = "rollback" and a catalog that knows nothing of it: the mark on
    the replica stops it, and its catalog learns of the failover for zbak status."""
    site = Site(make_pool, sshd, tmp_path, recursive=False,
                extra='on_divergence = "rollback"\n')
    site.nightly(MiB)
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    other = elsewhere / "zbak.toml"
    other.write_text(site.config.read_text().replace(str(tmp_path / "state"),
                                                     str(elsewhere / "state")))
    site.export()
    done = subprocess.run([str(ZBAK), "--config", str(other), "failover", "j"],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    site.write(site.live, "precious", MiB)  # unsnapshotted: what a rollback would discard
    before = (site.snaps(site.replica), tree_digest(site.live))
    site.import_()
    site.ok("snapshot")  # something to send: a receive, then the rollback it needs
    refused = site.zbak("replicate")
    assert (site.snaps(site.replica), tree_digest(site.live)) == before, "nothing rolled back"
    assert refused.returncode == 1 and "it is the live copy now" in refused.stdout + refused.stderr
    status = json.loads(site.ok("status", "--json", "--offline").stdout)
    assert status[0]["targets"][0]["failed_over"] is not None
