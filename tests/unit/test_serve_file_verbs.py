"""``zbak serve``'s file verbs in the allow-list (pure): only with ``--allow-file-read``, only
inside a root, never in a pipeline; the raw commands a direct read uses stay refused
(docs/security.md#reading-files-through-zbak-serve)."""

from __future__ import annotations

import dataclasses

import pytest

from zrepl_py.errors import CommandRefused
from zrepl_py.files import verbs
from zrepl_py.files.snapshot_files import tar_argv
from zrepl_py.proc.openssh import remote_command, remote_pipeline
from zrepl_py.serve.cmdline import split_command_line
from zrepl_py.serve.policy import Policy, check

POLICY = Policy(roots=("backup/replicas",))
READER = dataclasses.replace(POLICY, allow_file_read=True)
SNAP = "backup/replicas/data@zbak_20260101T000000Z"


def decide(argv: list[str], policy: Policy):
    return check(split_command_line(remote_command(argv, sudo=False)), policy)


def refusal(argv: list[str], policy: Policy) -> str:
    with pytest.raises(CommandRefused) as caught:
        decide(argv, policy)
    return str(caught.value)


def test_file_verbs_are_refused_without_allow_file_read():
    for argv in (verbs.probe_argv(), verbs.read_argv(SNAP, ["a"]),
                 verbs.versions_argv("backup/replicas/data", "a")):
        assert "--allow-file-read" in refusal(argv, POLICY)


def test_with_allow_file_read_the_verbs_inside_the_root_are_run_by_serve_itself():
    approved = decide(verbs.read_argv(SNAP, ["home/a b", "new\nline"]), READER)
    assert approved.argvs == () and approved.files == verbs.ReadFiles(SNAP, ("home/a b", "new\nline"))
    approved = decide(verbs.versions_argv("backup/replicas/data", "x", [1, 2]), READER)
    assert approved.files == verbs.FileVersions("backup/replicas/data", "x", (1, 2))
    assert decide(verbs.probe_argv(), READER).files == verbs.Probe()


@pytest.mark.parametrize("argv", [
    verbs.read_argv("backup/other@zbak_20260101T000000Z", ["a"]),
    verbs.read_argv("backup/replicas2/x@zbak_20260101T000000Z", ["a"]),
    verbs.versions_argv("backup", "a"),
    verbs.read_argv(SNAP, ["../../etc/shadow"]),
    verbs.read_argv(SNAP, ["/etc/shadow"]),
])
def test_a_file_verb_outside_the_root_or_with_a_hostile_path_is_refused(argv):
    refusal(argv, READER)


def test_a_file_verb_never_runs_in_a_pipeline():
    text = remote_pipeline([verbs.read_argv(SNAP, ["a"]), ["zstd", "-q", "-c"]], sudo=False)
    with pytest.raises(CommandRefused, match="alone"):
        check(split_command_line(text), READER)


@pytest.mark.parametrize("argv", [
    ["zfs", "clone", SNAP, "backup/zbak-view-0123456789ab"],
    ["zfs", "destroy", "backup/zbak-view-0123456789ab"],
    ["zfs", "rename", "backup/replicas/data", "backup/x"],
    ["zfs", "promote", "backup/replicas/data"],
    ["zfs", "set", "readonly=off", "backup/replicas/data"],
    ["mktemp", "-d", "/tmp/zbak-view.XXXXXXXXXX"],
    tar_argv("/tmp/zbak-view.abc", ["a"]),
    ["find", "-P", "/tmp/x", "-maxdepth", "0"],
    ["sha256sum", "-z", "-b", "--", "/etc/shadow"],
])
def test_the_raw_commands_of_a_direct_read_stay_refused_with_allow_file_read(argv):
    refusal(argv, READER)
