"""The failover verbs of ``zbak serve`` and the marks they carry (docs/security.md#failover-through-zbak-serve,
docs/decisions.md#failover-goes-through-verbs-zbak-serve-checks): the three verbs pass only
with ``--allow-failover``, one dataset inside a root, a mark zbak writes and a mountpoint at
or below ``--failover-mounts``; raw ``readonly=off``, mount, clone, promote, rename and
dataset destroy stay refused, with or without the flag."""

from __future__ import annotations

import datetime as dt
import shlex

import pytest

from zrepl_py.errors import CommandRefused, InvalidName
from zrepl_py.failover.replica import SERVE_REFUSED, verb_argv
from zrepl_py.serve.cmdline import split_command_line
from zrepl_py.serve.execute import REFUSED
from zrepl_py.serve.policy import Policy, check
from zrepl_py.values.failover import (
    FailoverMark,
    InvalidMark,
    SourceMark,
    hold_tag,
    kept_name,
)
from zrepl_py.zfs.names import DatasetName

ROOT = "backup/replicas"
AT = dt.datetime(2026, 3, 1, 9, 30, 0, tzinfo=dt.UTC)
MARK = FailoverMark(AT, "nightly", False, "zbak_20260301T000000Z")
ALLOWED = Policy(roots=(ROOT,), allow_failover=True, failover_mounts=("/srv", "/home/users"))
PLAIN = Policy(roots=(ROOT,))


def decide(argv: list[str], policy: Policy = ALLOWED):
    """What serve decides for the request zbak would send for ``argv``."""
    return check(split_command_line(shlex.join(argv)), policy)


def refused(argv: list[str], policy: Policy = ALLOWED) -> str:
    with pytest.raises(CommandRefused) as caught:
        decide(argv, policy)
    return str(caught.value)


def test_the_three_verbs_pass_as_zbak_sends_them():
    ds = DatasetName(f"{ROOT}/data")
    promote = decide(verb_argv("promote", ds, mark=MARK, mountpoint="/srv/data")).verb
    assert promote is not None and (promote.verb, promote.dataset, promote.mark,
                                    promote.mountpoint) == ("promote", ds, MARK, "/srv/data")
    for verb in ("demote", "release"):
        approved = decide(verb_argv(verb, ds))
        assert approved.verb is not None and approved.verb.verb == verb and not approved.argvs
    kept = decide(verb_argv("promote", ds, mark=MARK)).verb
    assert kept is not None and kept.mountpoint is None


VERB_REFUSALS = [
    # id, argv, words of the refusal
    ("outside the root", verb_argv("demote", DatasetName("backup/other")), "outside the allowed"),
    ("another root by prefix", verb_argv("demote", DatasetName("backup/replicas2")),
     "outside the allowed"),
    ("a mark zbak does not write", ["zbak", "replica", "promote", "--mark", "readonly=off",
                                    f"{ROOT}/d"], "not a value zbak writes"),
    ("no mark", ["zbak", "replica", "promote", f"{ROOT}/d"], "needs --mark"),
    ("mountpoint outside --failover-mounts",
     verb_argv("promote", DatasetName(f"{ROOT}/d"), mark=MARK, mountpoint="/etc"), "outside"),
    ("a prefix of an allowed directory",
     verb_argv("promote", DatasetName(f"{ROOT}/d"), mark=MARK, mountpoint="/srvx/a"), "outside"),
    ("dot-dot", verb_argv("promote", DatasetName(f"{ROOT}/d"), mark=MARK,
                          mountpoint="/srv/../root/.ssh"), "not a normalised"),
    ("relative", verb_argv("promote", DatasetName(f"{ROOT}/d"), mark=MARK,
                           mountpoint="srv/d"), "not a normalised"),
    ("two datasets", ["zbak", "replica", "demote", f"{ROOT}/a", f"{ROOT}/b"], "exactly one"),
    ("an option as the dataset", ["zbak", "replica", "demote", "--force"], "exactly one"),
    ("another verb", ["zbak", "replica", "destroy", f"{ROOT}/d"], "not a verb"),
    ("another command", ["zbak", "restore", "--to", "@x", f"{ROOT}/d"], "not a verb"),
    ("in a pipeline", ["zbak", "replica", "demote", f"{ROOT}/d", "|", "zfs", "receive", "-u",
                       f"{ROOT}/d"], None),
]


@pytest.mark.parametrize("argv,words", [c[1:] for c in VERB_REFUSALS],
                         ids=[c[0] for c in VERB_REFUSALS])
def test_a_verb_outside_its_shape_is_refused(argv, words):
    if words is None:  # a pipeline: shlex.join quotes the pipe, so send it as zbak writes them
        with pytest.raises(CommandRefused):
            check(split_command_line(" | ".join([shlex.join(argv[:4]),
                                                 shlex.join(argv[5:])])), ALLOWED)
        return
    assert words in refused(argv)


def test_without_allow_failover_every_verb_is_refused():
    for verb in ("promote", "demote", "release"):
        argv = verb_argv(verb, DatasetName(f"{ROOT}/d"), mark=MARK)
        assert "--allow-failover" in refused(argv, PLAIN)


def test_without_failover_mounts_a_promoted_replica_keeps_its_inherited_mountpoint():
    policy = Policy(roots=(ROOT,), allow_failover=True)
    ds = DatasetName(f"{ROOT}/d")
    assert decide(verb_argv("promote", ds, mark=MARK), policy).verb is not None
    assert "--failover-mounts" in refused(verb_argv("promote", ds, mark=MARK,
                                                    mountpoint="/srv/d"), policy)
    for word in ("none", "legacy"):
        verb = decide(verb_argv("promote", ds, mark=MARK, mountpoint=word), policy).verb
        assert verb is not None and verb.mountpoint == word


RAW = [
    ["zfs", "set", "readonly=off", f"{ROOT}/d"],
    ["zfs", "set", "canmount=on", f"{ROOT}/d"],
    ["zfs", "set", "mountpoint=/srv/d", f"{ROOT}/d"],
    ["zfs", "set", "zbak:failover=x", f"{ROOT}/d"],
    ["zfs", "inherit", "zbak:failover", f"{ROOT}/d"],
    ["zfs", "mount", f"{ROOT}/d"],
    ["zfs", "unmount", f"{ROOT}/d"],
    ["zfs", "clone", f"{ROOT}/d@zbak_20260301T000000Z", f"{ROOT}/e"],
    ["zfs", "promote", f"{ROOT}/e"],
    ["zfs", "rename", f"{ROOT}/d", f"{ROOT}/e"],
    ["zfs", "destroy", f"{ROOT}/d"],
]


@pytest.mark.parametrize("argv", RAW, ids=[" ".join(a[:3]) for a in RAW])
@pytest.mark.parametrize("policy", [PLAIN, ALLOWED], ids=["plain", "allow-failover"])
def test_the_raw_commands_a_failover_needs_stay_refused(argv, policy):
    with pytest.raises(CommandRefused):
        decide(argv, policy)


SOURCE_MOUNTPOINT = [
    (["zfs", "set", "zbak:source-mountpoint=/srv/data", f"{ROOT}/d"], True),
    (["zfs", "set", "zbak:source-mountpoint=legacy", f"{ROOT}/d"], True),
    (["zfs", "inherit", "zbak:source-mountpoint", f"{ROOT}/d"], True),
    (["zfs", "set", "zbak:source-mountpoint=srv", f"{ROOT}/d"], False),
    (["zfs", "set", "zbak:source-mountpoint=/srv/../etc", f"{ROOT}/d"], False),
    (["zfs", "set", "zbak:source-mountpoint=/srv", f"{ROOT}/d", f"{ROOT}/e"], False),
    (["zfs", "set", "zbak:source-mountpoint=/srv", "backup/other"], False),
]


@pytest.mark.parametrize("argv,ok", SOURCE_MOUNTPOINT, ids=[" ".join(a[2:]) for a, _ in
                                                             SOURCE_MOUNTPOINT])
def test_replication_may_record_the_sources_mountpoint_and_nothing_else_by_that_name(argv, ok):
    if ok:
        assert decide(argv, PLAIN).argvs
    else:
        with pytest.raises(CommandRefused):
            decide(argv, PLAIN)


def test_failover_mounts_must_be_normalised_absolute_directories():
    for bad in ("srv", "/srv/", "/srv/../x", "/"):
        with pytest.raises(ValueError):
            Policy(roots=(ROOT,), allow_failover=True, failover_mounts=(bad,))


def test_a_refusal_exits_with_the_status_the_client_reads_as_refused():
    assert SERVE_REFUSED == REFUSED == 126


# -- the marks ----------------------------------------------------------------------------


def test_marks_read_back_as_written_and_nothing_else_reads_as_a_mark():
    assert FailoverMark.parse(MARK.value()) == MARK
    assert MARK.value() == "at=2026-03-01T09:30:00Z;job=nightly;planned=no;base=zbak_20260301T000000Z"
    bare = FailoverMark(AT.replace(microsecond=5), "j", True)
    assert FailoverMark.parse(bare.value()) == bare and bare.at == AT
    source = SourceMark(AT, "nightly", "off")
    assert SourceMark.parse(source.value()) == source
    assert SourceMark.parse(SourceMark(AT, "j").value()).readonly is None
    for junk in ("", "at=2026-03-01T09:30:00Z", "at=x;job=j;planned=no",
                 "at=2026-03-01T09:30:00Z;job=j;planned=maybe",
                 "at=2026-03-01T09:30:00Z;job=j;planned=no;planned=yes",
                 "at=2026-03-01T09:30:00Z;job=-bad;planned=no",
                 "at=2026-03-01T09:30:00Z;job=j;planned=no;base=-x",
                 "at=2026-03-01T09:30:00Z;job=j;planned=no;rm=-rf"):
        with pytest.raises(InvalidMark):
            FailoverMark.parse(junk)
    with pytest.raises(InvalidMark):
        SourceMark.parse("at=2026-03-01T09:30:00Z;job=j;readonly=maybe")


def test_the_kept_dataset_and_the_hold_are_named_from_the_failover():
    assert kept_name(DatasetName("tank/data"), MARK) == \
        "tank/data-before-failback-20260301T093000Z"
    assert hold_tag("nightly") == "zbak:nightly:failover"
    with pytest.raises(InvalidName):
        kept_name(DatasetName("tank"), MARK)
    with pytest.raises(InvalidName):
        kept_name(DatasetName("tank/" + "x" * 230), MARK)
