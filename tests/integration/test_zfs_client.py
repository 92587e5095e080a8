"""The ZFS client and capability probes on real zfs-fuse pools (sparse files, 512 MB)."""

from __future__ import annotations

import subprocess

import pytest
from support.executor import RecordingExecutor
from support.zfs import COMMAND_TIMEOUT

from zrepl_py.clock import from_epoch
from zrepl_py.errors import (
    DatasetExists,
    DatasetNotFound,
    HoldExists,
    HoldNotFound,
    InvalidName,
    SnapshotHasClones,
    SnapshotHeld,
    Unsupported,
    ZfsError,
)
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.zfs.capabilities import Capabilities, detect
from zrepl_py.zfs.client import TREE_PROPERTIES, Zfs, batches, parse_get_output, parse_list_output
from zrepl_py.zfs.model import SnapshotInfo, Tree, build_tree
from zrepl_py.zfs.names import DatasetName, SnapshotName


def zfs_get(name: str, prop: str) -> str:
    """The parsable value of one property, read with zfs itself (not through the client)."""
    done = subprocess.run(["zfs", "get", "-Hp", "-o", "value", prop, name],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def every_snapshot(tree: Tree) -> list[SnapshotInfo]:
    """Every snapshot of the listing, dataset by dataset, each dataset's oldest first."""
    return [snap for info in tree.datasets for snap in tree.snapshots(info.name)]


@pytest.fixture
def zfs(zpool) -> Zfs:
    """A client for this machine with capabilities detected on the test pool."""
    executor = LocalExecutor()
    caps = detect(executor, zpool.name, timeout=COMMAND_TIMEOUT)
    return Zfs(executor, capabilities=caps, timeout=COMMAND_TIMEOUT)


@pytest.fixture
def root(zpool) -> DatasetName:
    return DatasetName(zpool.name)


def test_tree_reports_the_guid_createtxg_and_creation_that_zfs_get_reports(zfs, root):
    odd = root.child("a b:c")
    zfs.create_filesystem(root.child("data"))
    zfs.create_filesystem(odd)
    zfs.create_filesystem(odd.child("kid"))
    zfs.snapshot(SnapshotName.of(root, "first"), recursive=True)
    zfs.snapshot(SnapshotName.of(odd, "s 1:x"))

    tree = zfs.tree(root, recursive=True)

    assert [d.name for d in tree.datasets] == [root, odd, odd.child("kid"), root.child("data")]
    for info in tree.datasets:
        assert info.guid == int(zfs_get(info.name, "guid"))
        assert info.createtxg == int(zfs_get(info.name, "createtxg"))
        assert info.kind == "filesystem" and info.origin is None
    snaps = every_snapshot(tree)
    assert sorted(s.name for s in snaps) == sorted(
        [f"{root}@first", f"{odd}@first", f"{odd}@s 1:x", f"{odd}/kid@first",
         f"{root}/data@first"])
    for snap in snaps:
        assert snap.guid == int(zfs_get(snap.name, "guid"))
        assert snap.createtxg == int(zfs_get(snap.name, "createtxg"))
        assert snap.creation == from_epoch(int(zfs_get(snap.name, "creation")))
        assert snap.creation.utcoffset().total_seconds() == 0
        assert snap.userrefs == 0
    assert [s.short for s in tree.snapshots(odd)] == ["first", "s 1:x"]
    assert tree.snapshots(odd)[1].dataset == odd


def test_tree_without_recursion_lists_only_the_root_and_its_snapshots(zfs, root):
    zfs.create_filesystem(root.child("child"))
    zfs.snapshot(SnapshotName.of(root, "s"), recursive=True)

    tree = zfs.tree(root, recursive=False)

    assert [d.name for d in tree.datasets] == [root]
    assert [s.name for s in every_snapshot(tree)] == [f"{root}@s"]
    with pytest.raises(KeyError):
        tree.snapshots(root.child("child"))


def test_snapshots_are_ordered_by_createtxg_not_by_name(zfs, root):
    for short in ("zz", "aa", "mm"):
        zfs.snapshot(SnapshotName.of(root, short))

    snaps = zfs.tree(root, recursive=False).snapshots(root)

    assert [s.short for s in snaps] == ["zz", "aa", "mm"]
    assert [s.createtxg for s in snaps] == sorted(s.createtxg for s in snaps)


def test_a_recursive_snapshot_covers_every_descendant_in_one_transaction_group(zfs, root):
    zfs.create_filesystem(root.child("a/b"), parents=True)

    zfs.snapshot(SnapshotName.of(root, "r"), recursive=True)

    snaps = every_snapshot(zfs.tree(root, recursive=True))
    assert [s.name for s in snaps] == [f"{root}@r", f"{root}/a@r", f"{root}/a/b@r"]
    assert len({s.createtxg for s in snaps}) == 1


def test_snapshotting_an_existing_name_raises_dataset_exists(zfs, root):
    zfs.snapshot(SnapshotName.of(root, "s"))
    with pytest.raises(DatasetExists):
        zfs.snapshot(SnapshotName.of(root, "s"))


def test_destroy_snapshot_removes_exactly_that_snapshot(zfs, root):
    zfs.snapshot(SnapshotName.of(root, "keep"))
    zfs.snapshot(SnapshotName.of(root, "drop"))

    zfs.destroy_snapshot(SnapshotName.of(root, "drop"))

    assert [s.short for s in zfs.tree(root, recursive=False).snapshots(root)] == ["keep"]
    with pytest.raises(DatasetNotFound):
        zfs.destroy_snapshot(SnapshotName.of(root, "drop"))


def test_a_held_snapshot_cannot_be_destroyed_until_its_hold_is_released(zfs, root):
    snap = SnapshotName.of(root, "base")
    zfs.snapshot(snap)
    zfs.hold(snap, "zbak:job:target")

    with pytest.raises(SnapshotHeld):
        zfs.destroy_snapshot(snap)
    assert zfs.tree(root, recursive=False).snapshots(root)[0].userrefs == 1
    with pytest.raises(HoldExists):
        zfs.hold(snap, "zbak:job:target")

    zfs.release(snap, "zbak:job:target")
    with pytest.raises(HoldNotFound):
        zfs.release(snap, "zbak:job:target")
    zfs.destroy_snapshot(snap)
    assert not zfs.exists(snap)


def test_holds_releases_and_settings_of_many_names_take_one_command_and_go_on_past_a_failure(
        zfs, root):
    datasets = [root.child(f"d{i}") for i in range(3)]
    for ds in datasets:
        zfs.create_filesystem(ds)
    snaps = [SnapshotName.of(ds, "s") for ds in datasets]
    zfs.snapshot(SnapshotName.of(root, "s"), recursive=True)
    recording = RecordingExecutor(zfs.executor)
    zfs = Zfs(recording, capabilities=zfs.capabilities, timeout=COMMAND_TIMEOUT)

    zfs.hold_many(snaps, "zbak:j:t")
    zfs.set_property_many(datasets, "com.example:role", "replica")
    assert [argv[1] for argv in recording.calls] == ["hold", "set"], "one command each"
    assert [int(zfs_get(s, "userrefs")) for s in snaps] == [1, 1, 1]
    assert {zfs_get(ds, "com.example:role") for ds in datasets} == {"replica"}

    zfs.release(snaps[1], "zbak:j:t")
    with pytest.raises(HoldExists):  # snaps[0] and [2] had the tag: zfs still held snaps[1]
        zfs.hold_many(snaps, "zbak:j:t")
    assert int(zfs_get(snaps[1], "userrefs")) == 1
    zfs.release(snaps[0], "zbak:j:t")
    with pytest.raises(HoldNotFound):
        zfs.release_many(snaps, "zbak:j:t")
    assert [int(zfs_get(s, "userrefs")) for s in snaps] == [0, 0, 0]
    zfs.hold_many([], "zbak:j:t")
    zfs.release_many([], "zbak:j:t")


def test_a_long_list_of_names_is_split_over_commands_each_within_the_bound():
    names = [f"pool/data/d{i:05d}@zbak_20260101T000000Z" for i in range(3000)]
    runs = batches(names, limit=32 * 1024)
    assert [n for run in runs for n in run] == names
    assert len(runs) > 1 and all(sum(len(n) + 1 for n in run) <= 32 * 1024 for run in runs)
    assert batches([]) == [] and batches(["x" * 40], limit=10) == [["x" * 40]]


def test_holds_lists_tags_where_zfs_can_and_raises_unsupported_where_it_cannot(zfs, root):
    snap = SnapshotName.of(root, "s")
    zfs.snapshot(snap)
    zfs.hold(snap, "t2")
    zfs.hold(snap, "t1")
    if zfs.capabilities.list_holds:
        assert zfs.holds([snap]) == {snap: ["t1", "t2"]}
    else:
        with pytest.raises(Unsupported):
            zfs.holds([snap])
    assert zfs.holds([]) == {}


def test_a_clone_blocks_destroying_its_origin_and_is_found_by_the_pool_wide_clones(zfs, root):
    snap = SnapshotName.of(root, "origin")
    clone = root.child("restore tmp")
    zfs.snapshot(snap)
    zfs.clone(snap, clone, {"mountpoint": "none"})

    assert zfs.clones(root.pool).get(snap) == [clone]
    assert zfs.tree(root, recursive=True).dataset(clone).origin == snap
    with pytest.raises(SnapshotHasClones):
        zfs.destroy_snapshot(snap)

    zfs.destroy_filesystem(clone)
    zfs.destroy_snapshot(snap)
    assert not zfs.exists(clone)


def test_destroy_filesystem_refuses_a_filesystem_with_snapshots_and_never_recurses(zfs, root):
    fs = root.child("busyfs")
    zfs.create_filesystem(fs)
    zfs.snapshot(SnapshotName.of(fs, "s"))

    with pytest.raises(ZfsError):
        zfs.destroy_filesystem(fs, attempts=1)

    assert zfs.exists(fs) and zfs.exists(SnapshotName.of(fs, "s"))


def test_capabilities_on_zfs_fuse_are_detected_without_changing_the_pool(root):
    executor = LocalExecutor()
    before = subprocess.run(["zfs", "list", "-H", "-r", "-t", "all", "-o", "name", root],
                            capture_output=True, text=True, check=True).stdout

    caps = detect(executor, root, timeout=COMMAND_TIMEOUT)

    assert caps == Capabilities(
        parsable_list=False, resume_tokens=False, bookmarks=False, raw_send=False,
        compressed_send=False, holds=True, multi_snapshot=False, pool_version=23,
        list_holds=False, receive_properties=False, features=(),
        typed_get=False, written=False,
    )
    after = subprocess.run(["zfs", "list", "-H", "-r", "-t", "all", "-o", "name", root],
                           capture_output=True, text=True, check=True).stdout
    assert after == before


def test_capability_detection_on_a_missing_pool_raises_dataset_not_found(zfs_daemon):
    with pytest.raises(DatasetNotFound):
        detect(LocalExecutor(), "zbaknosuchpool", timeout=COMMAND_TIMEOUT)


def test_snapshot_many_raises_unsupported_on_zfs_fuse_and_creates_nothing(zfs, root):
    zfs.create_filesystem(root.child("a"))
    names = [SnapshotName.of(root, "m"), SnapshotName.of(root.child("a"), "m")]

    with pytest.raises(Unsupported):
        zfs.snapshot_many(names)
    claimed = Zfs(zfs.executor, timeout=COMMAND_TIMEOUT, capabilities=Capabilities(
        parsable_list=False, resume_tokens=False, bookmarks=False, raw_send=False,
        compressed_send=False, holds=True, multi_snapshot=True, pool_version=23))
    with pytest.raises(Unsupported):
        claimed.snapshot_many(names)

    assert every_snapshot(zfs.tree(root, recursive=True)) == []


def test_snapshot_many_refuses_two_snapshots_of_one_dataset(zfs, root):
    with pytest.raises(ValueError):
        zfs.snapshot_many([SnapshotName.of(root, "a"), SnapshotName.of(root, "b")])


def test_create_exists_get_and_set_round_trip_on_a_name_with_space_and_colon(zfs, root):
    fs = root.child("x y:z")
    assert not zfs.exists(fs)

    zfs.create_filesystem(fs, properties={"compression": "on", "com.example:note": "two words"})

    assert zfs.exists(fs)
    assert zfs.get_properties(fs, ["compression", "com.example:note", "used"]) == {
        "compression": "on", "com.example:note": "two words", "used": zfs_get(fs, "used")}
    zfs.set_property(fs, "com.example:note", "changed")
    assert zfs.get_properties(fs, ["com.example:note"]) == {"com.example:note": "changed"}
    assert int(zfs.get_properties(fs, ["guid"])["guid"]) == int(zfs_get(fs, "guid"))
    with pytest.raises(DatasetExists):
        zfs.create_filesystem(fs)


def test_create_without_parents_needs_the_parent_and_with_parents_makes_it(zfs, root):
    deep = root.child("p/q/r")
    with pytest.raises(DatasetNotFound):
        zfs.create_filesystem(deep)
    zfs.create_filesystem(deep, parents=True)
    assert zfs.exists(root.child("p/q")) and zfs.exists(deep)


def test_missing_datasets_raise_dataset_not_found_everywhere(zfs, root):
    missing = root.child("nope")
    assert not zfs.exists(missing)
    assert not zfs.exists(SnapshotName.of(root, "nope"))
    with pytest.raises(DatasetNotFound):
        zfs.tree(missing, recursive=True)
    with pytest.raises(DatasetNotFound):
        zfs.get_properties(missing, ["guid"])
    with pytest.raises(DatasetNotFound):
        zfs.snapshot(SnapshotName.of(missing, "s"))
    with pytest.raises(DatasetNotFound):
        zfs.hold(SnapshotName.of(root, "nope"), "t")
    with pytest.raises(DatasetNotFound):
        zfs.destroy_filesystem(missing)


def test_unknown_properties_raise_unsupported_and_bad_names_never_reach_zfs(zfs, root):
    with pytest.raises(Unsupported):
        zfs.get_properties(root, ["receive_resume_token"])
    with pytest.raises(InvalidName):
        zfs.get_properties(root, ["-r"])
    with pytest.raises(InvalidName):
        zfs.exists(f"{root}/a;rm -rf x")
    with pytest.raises(InvalidName):
        zfs.set_property(root, "com.example:x", "line\nbreak")


def test_pool_health_of_a_fresh_pool_is_online_with_free_bytes(zfs, zpool):
    health = zfs.pool_health(zpool.name)

    assert health.state == "ONLINE" and health.online
    assert 0 < health.free_bytes < 512 * 2**20
    assert health.free_bytes == int(zfs_get(zpool.name, "available"))
    assert zpool.name in health.status_text and "state: ONLINE" in health.status_text


def test_pool_health_of_a_missing_pool_raises_dataset_not_found(zfs):
    with pytest.raises(DatasetNotFound):
        zfs.pool_health("zbaknosuchpool")


def test_two_pools_from_make_pool_are_independent(make_pool):
    first, second = make_pool("256M"), make_pool("256M")
    assert first.name != second.name
    zfs = Zfs(LocalExecutor(), timeout=COMMAND_TIMEOUT)
    zfs.snapshot(SnapshotName.of(first.name, "only-here"))
    assert every_snapshot(zfs.tree(DatasetName(second.name), recursive=True)) == []


# -- pure parsing: both listing commands give the same Tree ------------------------------

GET_OUTPUT = "\n".join([
    "p\ttype\tfilesystem", "p\tguid\t11", "p\tcreatetxg\t1", "p\tcreation\t1700000000",
    "p\tuserrefs\t-", "p\torigin\t-",
    "p@b\ttype\tsnapshot", "p@b\tguid\t18446744073709551615", "p@b\tcreatetxg\t9",
    "p@b\tcreation\t1700000100", "p@b\tuserrefs\t2", "p@b\torigin\t-",
    "p@a\ttype\tsnapshot", "p@a\tguid\t13", "p@a\tcreatetxg\t5", "p@a\tcreation\t1700000050",
    "p@a\tuserrefs\t0", "p@a\torigin\t-",
    "p/c l:o\ttype\tfilesystem", "p/c l:o\tguid\t14", "p/c l:o\tcreatetxg\t10",
    "p/c l:o\tcreation\t1700000200", "p/c l:o\tuserrefs\t-", "p/c l:o\torigin\tp@a",
    "p#mark\ttype\tbookmark", "p#mark\tguid\t13", "p#mark\tcreatetxg\t5",
    "p#mark\tcreation\t1700000050", "p#mark\tuserrefs\t-", "p#mark\torigin\t-",
    "p/%recv\ttype\tfilesystem", "p/%recv\tguid\t15", "p/%recv\tcreatetxg\t11",
    "p/%recv\tcreation\t1700000300", "p/%recv\tuserrefs\t-", "p/%recv\torigin\t-",
    "",
])

LIST_OUTPUT = "\n".join([
    "p\tfilesystem\t11\t1\t1700000000\t-\t-",
    "p/c l:o\tfilesystem\t14\t10\t1700000200\t-\tp@a",
    "p@a\tsnapshot\t13\t5\t1700000050\t0\t-",
    "p@b\tsnapshot\t18446744073709551615\t9\t1700000100\t2\t-",
    "",
])


def test_zfs_get_and_zfs_list_outputs_build_the_same_tree():
    root = DatasetName("p")
    from_get = build_tree(root, parse_get_output(GET_OUTPUT), recursive=True)
    from_list = build_tree(root, parse_list_output(LIST_OUTPUT, TREE_PROPERTIES), recursive=True)

    assert from_get == from_list
    assert [s.short for s in from_get.snapshots(root)] == ["a", "b"]
    assert from_get.snapshots(root)[1].guid == 2**64 - 1
    assert from_get.snapshots(root)[1].userrefs == 2
    assert from_get.dataset("p/c l:o").origin == SnapshotName("p@a")
    assert [d.name for d in from_get.datasets] == ["p", "p/c l:o"]


def test_a_listing_line_of_the_wrong_shape_is_an_error_not_a_guess():
    from zrepl_py.zfs.model import ListingError

    with pytest.raises(ListingError):
        parse_get_output("p\ttype")
    with pytest.raises(ListingError):
        parse_list_output("p\tfilesystem\t11", TREE_PROPERTIES)
    with pytest.raises(ListingError):
        build_tree(DatasetName("p"), [("p", {"type": "filesystem", "guid": "x"})], recursive=True)


def test_dataset_properties_give_each_datasets_value_and_source_and_no_snapshots(zfs, root):
    """zfs-fuse has no `zfs get -t`: its recursive listing holds every snapshot, which the
    client leaves out; a value sent with `zfs send -p` is listed with source `received`."""
    data, child = root.child("data"), root.child("data/child")
    zfs.create_filesystem(child, parents=True)
    zfs.set_property(data, "zbak:job", "nightly")
    zfs.snapshot(SnapshotName.of(data, "s"), recursive=True)
    send = subprocess.Popen(["zfs", "send", "-p", f"{data}@s"], stdout=subprocess.PIPE)
    subprocess.run(["zfs", "receive", f"{root}/copy"], stdin=send.stdout, check=True,
                   timeout=COMMAND_TIMEOUT)
    assert send.wait(COMMAND_TIMEOUT) == 0

    got = zfs.dataset_properties(root, ["zbak:job"], recursive=True)
    alone = zfs.dataset_properties(data, ["zbak:job"], recursive=False)

    assert {name: (v["zbak:job"].value, v["zbak:job"].source) for name, v in got.items()} == {
        root: ("-", "-"), data: ("nightly", "local"),
        child: ("nightly", f"inherited from {data}"), root.child("copy"): ("nightly", "received")}
    assert got[child]["zbak:job"].inherited_from == data
    assert list(alone) == [data]


def test_sync_pool_is_refused_by_zfs_fuse_which_has_no_zpool_sync(zfs, root):
    with pytest.raises(ZfsError):
        zfs.sync_pool(root)
