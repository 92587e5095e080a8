"""Name validation (``zrepl_py.zfs.names``) against the OpenZFS rules of zfs_namecheck.c."""

from __future__ import annotations

import pytest

from zrepl_py.errors import InvalidName
from zrepl_py.zfs.names import (
    MAX_NAME_LEN,
    BookmarkName,
    DatasetName,
    SnapshotName,
    check_hold_tag,
    check_short_name,
)

EVERY_VALID_CHAR = "aZ09_-.: "

VALID_DATASETS = [
    "tank",
    "tank/data",
    f"tank/{EVERY_VALID_CHAR}",
    "tank/a b:c/d-e_f.g",
    "Tank9/x",
    "tank/...",  # three dots is a name, only "." and ".." are reserved
    "tank/-leading-dash-below-the-pool",
    "mirrorpool/x",  # only exact reserved words (and c<digit>...) are refused
    "t/" + "x" * (MAX_NAME_LEN - 2),  # exactly 255 bytes
    "p" * 239,  # the longest pool: pool_namecheck leaves room for POOL/$ORIGIN@$ORIGIN
]

SHELL_METACHARACTERS = [
    ">", "<", "`", "'", '"', "&", "$", "(", ")", "\\", "*", "!", ";", "|", "\n", "${x}", "$x",
    "{", "}", "[", "]", "?", "~", "=", "%",
]

INVALID_DATASETS = [
    ("", "empty"),
    ("t/" + "x" * (MAX_NAME_LEN - 1), "256 bytes"),
    ("p" * 240 + "/x", "a pool name of 240 bytes"),
    ("tank/./bar", "dot component"),
    ("tank/../bar", "dotdot component"),
    ("tank//b", "empty component"),
    ("tank/", "trailing slash"),
    ("/tank", "leading slash"),
    ("tank/a\tb", "tab"),
    ("tank/a\nb", "newline"),
    ("tank/a\rb", "carriage return"),
    ("tank/a\x00b", "NUL"),
    ("tank/caf\u00e9", "non-ASCII"),
    ("tank/a\u00a0b", "non-breaking space"),
    ("tank@snap", "snapshot delimiter"),
    ("tank#mark", "bookmark delimiter"),
    ("9tank/a", "pool starts with a digit"),
    ("_tank", "pool starts with underscore"),
    ("-tank", "pool starts with a dash"),
    (" tank", "pool starts with a space"),
    ("mirror", "reserved pool"),
    ("raidz", "reserved pool"),
    ("raidz2/x", "reserved pool"),
    ("draid1", "reserved pool"),
    ("spare", "reserved pool"),
    ("log/x", "reserved pool"),
    ("c0t0d0", "looks like a disk"),
    ("tank/%recv", "percent (ZFS-internal)"),
] + [(f"tank/a{c}b", f"metacharacter {c!r}") for c in SHELL_METACHARACTERS]


@pytest.mark.parametrize("name", VALID_DATASETS)
def test_valid_dataset_names_are_accepted_unchanged(name):
    assert DatasetName(name) == name


@pytest.mark.parametrize(("name", "why"), INVALID_DATASETS, ids=[w for _, w in INVALID_DATASETS])
def test_invalid_dataset_names_are_rejected(name, why):
    """docs/reliability.md#r34-name-validation-table."""
    with pytest.raises(InvalidName):
        DatasetName(name)


def test_a_non_string_dataset_name_is_rejected():
    """docs/reliability.md#r34-name-validation-table."""
    with pytest.raises(InvalidName):
        DatasetName(42)  # type: ignore[arg-type]


VALID_SNAPSHOTS = [
    "tank@s",
    f"tank/{EVERY_VALID_CHAR}@{EVERY_VALID_CHAR}",
    "tank/a b:c@zbak_20240101T000000Z",
    "tank/x@0",
    "tank/x@a.b",
]

INVALID_SNAPSHOTS = [
    ("tank", "no @"),
    ("tank@", "empty short name"),
    ("@s", "empty dataset"),
    ("tank@a@b", "two @"),
    ("tank@a/b", "slash in short name"),
    ("tank@a#b", "# in short name"),
    ("tank#m@s", "# in dataset"),
    ("tank@-x", "leading dash in short name"),
    ("tank@.", "dot short name"),
    ("tank@..", "dotdot short name"),
    ("tank@a\tb", "tab"),
    ("tank@a\nb", "newline"),
    ("tank@caf\u00e9", "non-ASCII"),
    ("tank@a%b", "percent"),
    ("tank/" + "x" * 240 + "@" + "y" * 20, "over 255 bytes in total"),
] + [(f"tank@a{c}b", f"metacharacter {c!r}") for c in SHELL_METACHARACTERS]


@pytest.mark.parametrize("name", VALID_SNAPSHOTS)
def test_valid_snapshot_names_are_accepted_and_split(name):
    snap = SnapshotName(name)
    assert snap == name
    assert f"{snap.dataset}@{snap.short}" == name


@pytest.mark.parametrize(("name", "why"), INVALID_SNAPSHOTS, ids=[w for _, w in INVALID_SNAPSHOTS])
def test_invalid_snapshot_names_are_rejected(name, why):
    """docs/reliability.md#r34-name-validation-table."""
    with pytest.raises(InvalidName):
        SnapshotName(name)


def test_snapshot_of_builds_and_validates_the_full_name():
    assert SnapshotName.of(DatasetName("tank/a"), "s1") == "tank/a@s1"
    with pytest.raises(InvalidName):
        SnapshotName.of("tank/a", "bad/short")


def test_bookmark_names_follow_the_snapshot_rules_with_a_hash():
    assert BookmarkName("tank/a b#m:1") == "tank/a b#m:1"
    for bad in ("tank#", "tank#a#b", "tank@s#m", "tank#-m", "tank#a b\n"):
        with pytest.raises(InvalidName):
            BookmarkName(bad)


def test_short_names_refuse_a_leading_dash_so_they_cannot_become_options():
    """docs/reliability.md#r34-name-validation-table."""
    assert check_short_name("a-b") == "a-b"
    with pytest.raises(InvalidName):
        check_short_name("-r")


def test_dataset_helpers_give_pool_child_and_relative_path():
    ds = DatasetName("tank/a b")
    assert ds.pool == "tank"
    assert ds.child("c:d") == "tank/a b/c:d"
    assert ds.child("") == ds
    assert DatasetName("tank/a b/c").relative_to(ds) == "c"
    assert ds.relative_to(ds) == ""
    with pytest.raises(ValueError):
        DatasetName("tank/a bc").relative_to(ds)
    with pytest.raises(InvalidName):
        ds.child("../x")


@pytest.mark.parametrize("tag", ["zbak:nightly:backup1", "a", "with space", "x" * MAX_NAME_LEN])
def test_valid_hold_tags_are_accepted(tag):
    assert check_hold_tag(tag) == tag


@pytest.mark.parametrize(
    "tag", ["", "-r", "tab\there", "new\nline", "caf\u00e9", "x" * (MAX_NAME_LEN + 1), None]
)
def test_invalid_hold_tags_are_rejected(tag):
    """docs/reliability.md#r34-name-validation-table."""
    with pytest.raises(InvalidName):
        check_hold_tag(tag)  # type: ignore[arg-type]
