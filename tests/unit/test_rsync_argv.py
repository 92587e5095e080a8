"""The rsync fallback's pure parts: argv, exit-status mapping, stats, link and current choice."""

from __future__ import annotations

import datetime as dt
import shlex
from pathlib import Path

import pytest

from zrepl_py.config.hosts import HostConfig
from zrepl_py.proc.openssh import ssh_argv, ssh_argv_without_address
from zrepl_py.replication.rsync import (
    Location,
    TargetLayout,
    bwlimit_kib,
    exit_outcome,
    looks_like_missing_rsync,
    newest_present,
    parse_stats,
    pick_link_dests,
    rsync_argv,
)
from zrepl_py.zfs.model import SnapshotInfo
from zrepl_py.zfs.names import SnapshotName

BASE = ["rsync", "-aHAX", "--numeric-ids", "--delete", "--partial", "--checksum",
        "--stats", "--no-human-readable"]
SSH = ["ssh", "-o", "BatchMode=yes", "-p", "2222", "-l", "root", "--"]


@pytest.mark.parametrize(
    ("source", "destination", "kwargs", "expected"),
    [
        pytest.param(
            Location("/tmp/view"), Location("/backup/partial/7"), {},
            BASE + ["--", "/tmp/view/", "/backup/partial/7/"],
            id="local to local: no -s, no -e",
        ),
        pytest.param(
            Location("/tmp/view/"), Location("/back up/partial/7", "backup.example.org"),
            {"ssh": SSH, "bandwidth_limit": 1_048_576, "link_dest": ["/back up/snapshots/a"]},
            BASE + ["-s", "--bwlimit=1024",
                    "-e", "ssh -o BatchMode=yes -p 2222 -l root --",
                    "--link-dest=/back up/snapshots/a", "--", "/tmp/view/",
                    "backup.example.org:/back up/partial/7/"],
            id="push: -s protects the space, -e is one string, address without user",
        ),
        pytest.param(
            Location("/tmp/zbak-view.x", "10.0.0.5"), Location("/srv/b/partial/7"),
            {"ssh": SSH, "rsync_path": "sudo -n rsync",
             "link_dest": ["/srv/b/snapshots/old", "/srv/b/snapshots/new"]},
            BASE + ["-s", "-e", "ssh -o BatchMode=yes -p 2222 -l root --",
                    "--rsync-path=sudo -n rsync", "--link-dest=/srv/b/snapshots/old",
                    "--link-dest=/srv/b/snapshots/new", "--", "10.0.0.5:/tmp/zbak-view.x/",
                    "/srv/b/partial/7/"],
            id="pull with sudo on the source and two link directories in order",
        ),
        pytest.param(
            Location("/v"), Location("/d", "fe80::1%eth0"), {"ssh": SSH},
            BASE + ["-s", "-e", "ssh -o BatchMode=yes -p 2222 -l root --", "--", "/v/",
                    "[fe80::1%eth0]:/d/"],
            id="an IPv6 address goes in brackets",
        ),
    ],
)
def test_rsync_argv_builds_the_documented_command(source, destination, kwargs, expected):
    """docs/reliability.md#r43-rsync-exit-codes."""
    assert rsync_argv(source, destination, **kwargs) == expected


@pytest.mark.parametrize(
    ("source", "destination", "kwargs"),
    [
        pytest.param(Location("/a", "h1"), Location("/b", "h2"), {"ssh": SSH}, id="two remotes"),
        pytest.param(Location("/a"), Location("/b", "h"), {}, id="remote without ssh"),
        pytest.param(Location("/a"), Location("/b"), {"ssh": SSH}, id="ssh without remote"),
        pytest.param(Location("/a"), Location("/b"), {"rsync_path": "sudo -n rsync"},
                     id="rsync_path without remote"),
        pytest.param(Location("a"), Location("/b"), {}, id="relative source"),
        pytest.param(Location("/a"), Location("/b"), {"link_dest": ["rel"]},
                     id="relative link dir"),
        pytest.param(Location("/a"), Location("/b"), {"link_dest": [f"/s/{i}" for i in range(21)]},
                     id="21 link dirs"),
        pytest.param(Location("/a"), Location("/b"), {"bandwidth_limit": 0}, id="zero bandwidth"),
    ],
)
def test_rsync_argv_refuses_impossible_or_unsafe_requests(source, destination, kwargs):
    with pytest.raises(ValueError):
        rsync_argv(source, destination, **kwargs)


@pytest.mark.parametrize(
    ("limit", "kib"), [(1, 1), (1023, 1), (1024, 1), (1536, 1), (10 * 1024**2, 10240)]
)
def test_bandwidth_limit_in_bytes_becomes_whole_kib_never_above_and_never_zero(limit, kib):
    assert bwlimit_kib(limit) == kib


@pytest.mark.parametrize(
    ("code", "outcome"),
    [(0, "ok"), (24, "warning"), (23, "failed"), (1, "failed"), (12, "failed"),
     (20, "failed"), (30, "failed"), (255, "failed"), (-9, "failed"), (None, "failed")],
)
def test_only_exit_24_is_a_warning_and_23_and_every_other_nonzero_status_fail(code, outcome):
    """docs/reliability.md#r43-rsync-exit-codes."""
    assert exit_outcome(code) == outcome


def test_stats_are_read_as_plain_integers_and_times_are_skipped():
    output = (
        "Number of files: 7 (reg: 3, dir: 3, link: 1)\n"
        "Total file size: 2010 bytes\n"
        "File list generation time: 0.001 seconds\n"
        "Total bytes sent: 1336\n"
        "Total bytes received: 92\n"
        "\nsent 1336 bytes  received 92 bytes  2856.00 bytes/sec\n"
    )
    stats = parse_stats(output)
    assert stats["Total bytes sent"] == 1336
    assert stats["Total bytes received"] == 92
    assert stats["Number of files"] == 7
    assert stats["Total file size"] == 2010
    assert "File list generation time" not in stats


@pytest.mark.parametrize(
    ("stderr", "missing"),
    [
        ("bash: line 1: rsync: command not found\nrsync: connection unexpectedly closed", True),
        ("sh: 1: rsync: not found", True),
        ("sudo: rsync: command not found", True),
        ("env: 'rsync': No such file or directory", True),
        ("env: \u2018rsync\u2019: No such file or directory", True),
        ("bash: line 1: /opt/bin/rsync: No such file or directory", True),
        ('rsync: [sender] change_dir "/x" failed: No such file or directory (2)', False),
        ("rsync error: some files/attrs were not transferred (code 23)", False),
    ],
)
def test_a_missing_rsync_is_recognised_from_the_shell_message_only(stderr, missing):
    assert looks_like_missing_rsync(stderr) is missing


def _snaps(*shorts: str) -> list[SnapshotInfo]:
    when = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    return [SnapshotInfo(SnapshotName(f"tank/d@{s}"), guid=100 + i, createtxg=10 * (i + 1),
                         creation=when, userrefs=0) for i, s in enumerate(shorts)]


@pytest.mark.parametrize(
    ("present", "wanted", "expected"),
    [
        (set(), "c", []),
        ({"a", "b"}, "c", ["b"]),
        ({"a"}, "c", ["a"]),
        ({"a", "d"}, "c", ["a", "d"]),
        ({"d", "e"}, "c", ["d"]),
        ({"zzz-not-on-source"}, "c", []),
        ({"a"}, "not-on-source", []),
    ],
)
def test_link_directories_are_the_nearest_older_then_nearest_newer_tree_by_createtxg(
    present, wanted, expected
):
    assert pick_link_dests(_snaps("a", "b", "c", "d", "e"), SnapshotName(f"tank/d@{wanted}"),
                           present) == expected


def test_the_newest_tree_is_chosen_by_createtxg_not_by_name():
    snaps = _snaps("zz-old", "aa-new")
    assert newest_present(snaps, {"zz-old", "aa-new"}) == "aa-new"
    assert newest_present(snaps, {"zz-old", "elsewhere"}) == "zz-old"
    assert newest_present(snaps, set()) is None


def test_target_layout_puts_trees_partials_and_current_under_the_directory():
    layout = TargetLayout("/back up/d")
    assert layout.tree("snap one") == "/back up/d/snapshots/snap one"
    assert layout.partial_tree(123) == "/back up/d/partial/123"
    assert layout.current == "/back up/d/current"


def test_ssh_argv_without_address_is_ssh_argv_minus_the_address_and_ends_with_double_dash():
    host = HostConfig(address="backup.example.org", port=2222, user="zbak",
                      identity_file=Path("/keys/it's here"), known_hosts=Path("/k h/known"))
    full = ssh_argv(host, known_hosts_default=Path("/unused"))
    short = ssh_argv_without_address(host, known_hosts_default=Path("/unused"))
    assert short == full[:-1]
    assert short[-1] == "--"


def test_the_ssh_command_string_for_rsync_splits_back_into_the_same_argv():
    host = HostConfig(address="h", identity_file=Path("/keys/it's here"),
                      known_hosts=Path("/k h/known"))
    ssh = ssh_argv_without_address(host, known_hosts_default=Path("/unused"))
    argv = rsync_argv(Location("/a"), Location("/b", "h"), ssh=ssh)
    command = argv[argv.index("-e") + 1]
    assert shlex.split(command) == ssh
