"""The stderr -> typed error table of ``zrepl_py.zfs.errors`` (zfs-fuse observed, OpenZFS 2.x)."""

from __future__ import annotations

import pytest

from zrepl_py.errors import (
    CommandFailed,
    DatasetBusy,
    DatasetExists,
    DatasetNotFound,
    HoldExists,
    HoldNotFound,
    PermissionDenied,
    SnapshotHasClones,
    SnapshotHeld,
    StreamUnsupported,
    Unsupported,
    ZfsError,
)
from zrepl_py.zfs.errors import classify, classify_receive, map_error

# (where the wording comes from, stderr, expected class)
CASES = [
    # zfs-fuse 0.7, observed on the test bed
    ("fuse get missing", "cannot open 'p/nope': dataset does not exist", DatasetNotFound),
    ("fuse missing pool", "cannot open 'nopool': no such pool", DatasetNotFound),
    ("fuse create exists", "cannot create 'p/a': dataset already exists", DatasetExists),
    ("fuse snapshot exists", "cannot create snapshot 'p/a@s1': dataset already exists",
     DatasetExists),
    ("fuse no parent", "cannot create 'p/x/y/z': parent does not exist", DatasetNotFound),
    ("fuse held destroy", "cannot destroy 'p/a@s1': dataset is busy", DatasetBusy),
    ("fuse clones", "cannot destroy 'p/a@r1': snapshot has dependent clones\n"
     "use '-R' to destroy the following datasets:\np/cl", SnapshotHasClones),
    ("fuse hold twice", "cannot hold 'p/a@s1': tag already exists on this dataset", HoldExists),
    ("fuse release unknown tag", "cannot release 't2' from 'p/a@s1': no such tag on this dataset",
     HoldNotFound),
    ("fuse holds listing", "internal error: /usr/lib/zfs/pyzfs.py not found", Unsupported),
    ("fuse multi snapshot", "too many arguments\nusage:\n\tsnapshot [-r] ...", Unsupported),
    ("fuse list -p", "invalid option 'p'\nusage:\n\tlist [-rH] ...", Unsupported),
    ("fuse no bookmarks", "unrecognized command 'bookmark'\nusage: zfs command args ...",
     Unsupported),
    ("fuse resume property", "bad property list: invalid property 'receive_resume_token'",
     Unsupported),
    ("fuse non-root", "connect: Permission denied\ninternal error: failed to initialize ZFS library",
     PermissionDenied),
    ("fuse fs children", "cannot destroy 'p/a': filesystem has children\n"
     "use '-r' to destroy the following datasets:\np/a@s1", ZfsError),
    ("fuse bad value", "cannot set property for 'p/a': 'compression' must be one of 'on | off'",
     ZfsError),
    # OpenZFS 2.x (libzfs_util.c, libzfs_dataset.c, zfs_main.c; demo.log of OpenZFS 2.3.2)
    ("openzfs held", "cannot destroy snapshot src/data@0: it's being held. "
     "Run 'zfs holds -r src/data@0' to see holders.", SnapshotHeld),
    ("openzfs cloned race", "cannot destroy snapshot p/a@s: snapshot is cloned", SnapshotHasClones),
    ("openzfs no snapshot", "could not find any snapshots to destroy; check snapshot names.",
     DatasetNotFound),
    ("openzfs hold missing", "cannot hold snapshot 'p/a@nope': dataset does not exist",
     DatasetNotFound),
    ("openzfs hold twice", "cannot hold snapshot 'p/a@s': tag already exists on this dataset",
     HoldExists),
    ("openzfs release", "cannot release hold from snapshot 'p/a@s': no such tag on this dataset",
     HoldNotFound),
    ("openzfs no parent", "cannot create 'p/x/y': no such parent 'p/x'", DatasetNotFound),
    ("openzfs busy", "cannot destroy 'p/a': dataset is busy", DatasetBusy),
    ("openzfs unmount busy", "cannot unmount '/p/a': pool or dataset is busy", DatasetBusy),
    ("openzfs perm", "cannot create snapshot 'p/a@s': permission denied", PermissionDenied),
    ("openzfs not root", "Permission denied the ZFS utilities must be run as root.",
     PermissionDenied),
    ("openzfs upgrade", "cannot create 'p/a': pool must be upgraded to set this property or value",
     Unsupported),
    ("openzfs receive exists", "cannot receive new filesystem stream: destination 'p/b' exists\n"
     "must specify -F to overwrite it", DatasetExists),
    ("openzfs no space", "cannot create snapshot 'p/a@s': out of space", ZfsError),
    ("unknown", "something went wrong", ZfsError),
]


@pytest.mark.parametrize(("source", "stderr", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_known_zfs_message_maps_to_its_error_class(source, stderr, expected):
    assert classify(stderr) is expected


def test_mapping_is_case_insensitive():
    assert classify("CANNOT OPEN 'X': DATASET DOES NOT EXIST") is DatasetNotFound


def test_mapped_error_keeps_argv_returncode_stderr_and_host():
    failed = CommandFailed(["zfs", "get", "guid", "p/nope"], 1,
                           "cannot open 'p/nope': dataset does not exist", "backup1")
    mapped = map_error(failed)
    assert type(mapped) is DatasetNotFound
    assert (mapped.argv, mapped.returncode, mapped.stderr, mapped.host) == (
        ["zfs", "get", "guid", "p/nope"], 1, "cannot open 'p/nope': dataset does not exist",
        "backup1")
    assert "backup1" in str(mapped)


def test_a_timeout_maps_to_plain_zfs_error_whatever_its_text():
    failed = CommandFailed(["zfs", "list"], None, "timed out after 5 s (dataset is busy?)")
    assert type(map_error(failed)) is ZfsError


def test_an_already_mapped_error_is_returned_unchanged():
    busy = DatasetBusy(["zfs", "destroy", "p/a"], 1, "dataset is busy")
    assert map_error(busy) is busy


def test_every_mapped_class_is_a_zfs_error_so_one_except_catches_all():
    for _source, stderr, _expected in CASES:
        assert isinstance(map_error(CommandFailed(["zfs"], 1, stderr)), ZfsError)


# (where the wording comes from, stderr of a failed `zfs receive`, expected class)
RECEIVE_CASES = [
    # zfs-fuse 0.7 receiving OpenZFS 2.3.2 streams, observed (plain, -c, -e, -w sends)
    ("fuse plain OpenZFS stream",
     "cannot receive: stream has unsupported feature, feature flags = 4", StreamUnsupported),
    ("fuse -c stream", "cannot receive: stream has unsupported feature, feature flags = 420004\n",
     StreamUnsupported),
    ("fuse -w stream", "cannot receive: stream has unsupported feature, feature flags = 430004",
     StreamUnsupported),
    # OpenZFS libzfs_sendrecv.c / libzfs_util.c wordings
    ("openzfs pool feature", "cannot receive new filesystem stream: pool must be upgraded to "
     "receive this stream.", StreamUnsupported),
    ("openzfs kernel", "cannot receive new filesystem stream: the loaded zfs module does not "
     "support this operation. A reboot may be required to enable this operation.",
     StreamUnsupported),
    ("openzfs badversion", "cannot receive: unsupported version or feature", StreamUnsupported),
    # not the stream's fault: the usual classes
    ("receive exists", "cannot receive new filesystem stream: destination 'p/b' exists\n"
     "must specify -F to overwrite it", DatasetExists),
    ("receive modified", "cannot receive incremental stream: destination p/b has been modified\n"
     "since most recent snapshot", ZfsError),
]


@pytest.mark.parametrize(("source", "stderr", "expected"), RECEIVE_CASES,
                         ids=[c[0] for c in RECEIVE_CASES])
def test_a_receive_that_rejects_the_stream_maps_to_stream_unsupported(source, stderr, expected):
    assert classify_receive(stderr) is expected


def test_stream_unsupported_is_caught_as_unsupported_and_as_zfs_error():
    assert issubclass(StreamUnsupported, Unsupported) and issubclass(StreamUnsupported, ZfsError)
