"""The pure parts of restoring files and ``zbak find``: paths an admin names, the file verbs'
requests, the order of snapshots across places, versions folded
(docs/decisions.md#a-file-path-is-relative-to-the-dataset,
docs/decisions.md#zbak-find-folds-equal-neighbours-into-one-version)."""

from __future__ import annotations

import pytest

from zrepl_py.errors import CommandRefused, ExitStatus
from zrepl_py.files import verbs
from zrepl_py.files.paths import (
    ROOT,
    InvalidPath,
    covering,
    member_path,
    parents,
    parse_path,
    within,
)
from zrepl_py.files.versions import ABSENT, FileState, merge_orders, number_versions
from zrepl_py.proc.openssh import remote_command
from zrepl_py.serve.cmdline import split_command_line


@pytest.mark.parametrize(("text", "expected"), [
    ("home/alice/notes.txt", "home/alice/notes.txt"),
    ("./home//alice/./x", "home/alice/x"),
    ("home/", "home"),
    (".", ROOT),
    ("./", ROOT),
    ("-rf", "-rf"),
    ("a b/c'd", "a b/c'd"),
    ("new\nline", "new\nline"),
    ("caf\udce9", "caf\udce9"),  # a non-UTF-8 byte, as Python carries it in argv
])
def test_a_path_is_relative_to_the_dataset_and_keeps_every_byte_a_name_may_hold(text, expected):
    assert parse_path(text) == expected


@pytest.mark.parametrize("text", ["", "/etc/passwd", "/tank/data/home", "../x", "a/../../x",
                                  "a/..", "..", "a\x00b"])
def test_absolute_parent_empty_and_nul_paths_are_refused_as_usage_errors(text):
    with pytest.raises(InvalidPath) as caught:
        parse_path(text, "--path")
    assert caught.value.exit_status == ExitStatus.USAGE
    assert "--path" in str(caught.value)


def test_an_absolute_path_is_refused_with_the_relative_form_as_hint():
    with pytest.raises(InvalidPath, match="relative to the dataset's mountpoint"):
        parse_path("/tank/data/home/x")


def test_covering_drops_paths_inside_others_and_root_covers_everything():
    assert covering(["a/b", "a", "ab", "c/d", "c/d/e"]) == ("a", "ab", "c/d")
    assert covering(["x", ROOT, "y"]) == (ROOT,)


def test_members_of_a_stream_are_normalised_or_rejected():
    assert member_path("./a/b/") == "a/b"
    assert member_path(".") == ROOT
    for bad in ("/etc/passwd", "a/../../b", "..", "a\x00"):
        assert member_path(bad) is None
    assert parents("a/b/c") == ["a", "a/b"] and parents("a") == [] and parents(ROOT) == []
    assert within("a/b", ["a"]) and within("a", ["a"]) and not within("ab", ["a"])
    assert within("anything", [ROOT])


def test_verb_requests_survive_the_one_quoting_point_and_serve_s_grammar():
    paths = ["new\nline", "a b", "-x", "q'uote", "$(touch canary)"]
    argv = verbs.read_argv("tank/data@zbak_20260101T000000Z", paths)
    [split] = split_command_line(remote_command(argv, sudo=False))
    request = verbs.parse_request(split)
    assert isinstance(request, verbs.ReadFiles)
    assert request.paths == tuple(paths) and request.snapshot == "tank/data@zbak_20260101T000000Z"
    found = verbs.parse_request(verbs.versions_argv("tank/data", "a/b", [3, 1]))
    assert found == verbs.FileVersions("tank/data", "a/b", (3, 1))
    assert verbs.parse_request(verbs.probe_argv()) == verbs.Probe()


@pytest.mark.parametrize("argv", [
    ["zbak-files"],
    ["zbak-files", "read", "tank/data@s"],
    ["zbak-files", "read", "tank/data", "a"],
    ["zbak-files", "read", "tank/data@s", "../etc/shadow"],
    ["zbak-files", "read", "tank/data@s", "/etc/shadow"],
    ["zbak-files", "versions", "tank/data", "a", "12x"],
    ["zbak-files", "versions", "tank/../x", "a"],
    ["zbak-files", "probe", "extra"],
    ["zbak-files", "shell"],
])
def test_malformed_verb_requests_are_refused(argv):
    with pytest.raises(CommandRefused):
        verbs.parse_request(argv)


def state(name: str, guid: int, kind: str = "file", size: int = 1, mtime: int = 1,
          digest: str = "aa", target: str = "") -> FileState:
    return FileState(name, guid, kind, size, mtime, digest, target)


def test_neighbours_with_the_same_content_are_one_version_and_a_change_undone_is_a_new_one():
    states = [state("s1", 1), state("s2", 2), state("s3", 3, digest="bb"),
              FileState("s4", 4, ABSENT), state("s5", 5, digest="bb"), state("s6", 6),
              state("s7", 7, mtime=2)]
    rows = number_versions(states, {1: ["local:t/d"], 5: ["b:r/d"]})
    assert [r.number for r in rows] == [1, 1, 2, 0, 3, 4, 5]
    assert rows[0].where == ("local:t/d",) and rows[1].where == ()


def test_same_size_and_mtime_with_another_content_is_another_version():
    rows = number_versions([state("s1", 1, digest="aa"), state("s2", 2, digest="bb")], {})
    assert [r.number for r in rows] == [1, 2]


def test_listings_merge_by_guid_keeping_each_listing_s_order():
    source = [10, 20, 40]            # 30 pruned on the source
    replica = [5, 10, 20, 30, 40]    # the replica kept an older one and 30
    assert merge_orders([source, replica]) == [5, 10, 20, 30, 40]
    assert merge_orders([[1, 2], [3]]) == [1, 2, 3]
    assert merge_orders([[], [7, 8]]) == [7, 8]


def test_a_file_state_round_trips_through_the_verb_s_json():
    one = FileState("s\n1", 2**64 - 1, "symlink", 4, 10**18 + 7, "", "../x")
    assert FileState.from_json(one.to_json()) == one
    with pytest.raises(ValueError):
        FileState.from_json({"snapshot": "s"})
