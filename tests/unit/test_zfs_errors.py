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
    NewerSnapshotsExist,
    PermissionDenied,
    PipelineCancelled,
    PipelineFailed,
    ResumeTokenRefused,
    SnapshotHasClones,
    SnapshotHeld,
    StreamInvalid,
    StreamUnsupported,
    TargetModified,
    Unsupported,
    ZfsError,
)
from zrepl_py.proc.pipeline import StageResult
from zrepl_py.zfs.errors import (
    classify,
    classify_receive,
    map_error,
    parsed_names,
    receive_refusal,
    refused_option,
    wants_snapshot,
)

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
    ("openzfs rollback", "cannot rollback to 'p/a@s': more recent snapshots or bookmarks exist\n"
     "use '-r' to force deletion of the following snapshots and bookmarks:\np/a@t",
     NewerSnapshotsExist),
    ("fuse rollback", "cannot rollback to 'p/a@s': more recent snapshots exist",
     NewerSnapshotsExist),
    ("openzfs bookmark twice", "cannot create bookmark 'p/a#b': bookmark exists", DatasetExists),
    ("openzfs corrupt token", "cannot resume send: resume token is corrupt (invalid format)",
     ResumeTokenRefused),
    ("openzfs token checksum", "cannot resume send: resume token is corrupt (incorrect"
     " checksum)", ResumeTokenRefused),
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
    # the target was written to: libzfs zfs_receive_one, zfs-fuse 0.7 and OpenZFS 2.x
    ("receive modified", "cannot receive incremental stream: destination p/b has been modified\n"
     "since most recent snapshot", TargetModified),
    # the stream's own bytes: zfs-fuse 0.7 observed, OpenZFS libzfs_sendrecv.c
    ("fuse bad magic", "cannot receive: invalid stream (bad magic number)", StreamInvalid),
    ("fuse checksum", "cannot receive incremental stream: invalid stream (checksum mismatch)",
     StreamInvalid),
    ("fuse invalid backup", "cannot receive new filesystem stream: invalid backup stream",
     StreamInvalid),
    ("openzfs incomplete", "cannot receive: checksum mismatch or incomplete stream",
     StreamInvalid),
    # none of those: the usual classes
    ("receive exists", "cannot receive new filesystem stream: destination 'p/b' exists\n"
     "must specify -F to overwrite it", DatasetExists),
]


@pytest.mark.parametrize(("source", "stderr", "expected"), RECEIVE_CASES,
                         ids=[c[0] for c in RECEIVE_CASES])
def test_a_receive_that_refuses_the_stream_maps_to_the_class_of_its_reason(source, stderr,
                                                                          expected):
    assert classify_receive(stderr) is expected


def test_stream_unsupported_is_caught_as_unsupported_and_as_zfs_error():
    assert issubclass(StreamUnsupported, Unsupported) and issubclass(StreamUnsupported, ZfsError)


def _failed(*stages: tuple[str, int, str], cls: type[PipelineFailed] = PipelineFailed):
    results = tuple(StageResult(name, (name,), code, stderr, broken_pipe=False)
                    for name, code, stderr in stages)
    return cls(results, results[0])


def test_the_receives_refusal_is_read_from_the_last_stage_even_when_the_sender_is_blamed():
    failed = _failed(("zfs send", 255, ""), ("zfs receive", 1, "cannot receive: stream has"
                     " unsupported feature, feature flags = 4\nmbuffer: error: outputThread:"
                     " error writing to <stdout> at offset 0x0: Broken pipe"))
    refusal = receive_refusal(failed, ["zfs", "receive", "p/b"], "backup1")
    assert type(refusal) is StreamUnsupported
    assert (refusal.argv, refusal.returncode, refusal.host) == (["zfs", "receive", "p/b"], 1,
                                                                "backup1")
    assert refusal.stderr == "cannot receive: stream has unsupported feature, feature flags = 4"


@pytest.mark.parametrize(("stderr", "expected"), [
    ("cannot receive incremental stream: destination p/b has been modified\nsince most recent"
     " snapshot", TargetModified),
    ("cannot receive: invalid stream (bad magic number)", StreamInvalid),
    ("cannot receive new filesystem stream: destination 'p/b' exists", None),
    ("", None),
])
def test_only_a_refusal_of_the_stream_or_its_target_is_a_receive_refusal(stderr, expected):
    refusal = receive_refusal(_failed(("zfs send", 0, ""), ("zfs receive", 1, stderr)),
                              ["zfs", "receive"], "local")
    assert type(refusal) is (expected or type(None))


def test_a_stopped_pipeline_or_a_receive_that_succeeded_is_no_refusal():
    words = "cannot receive: invalid stream (bad magic number)"
    assert receive_refusal(_failed(("zfs receive", 1, words), cls=PipelineCancelled),
                           ["zfs"], "local") is None
    assert receive_refusal(_failed(("zfs send", 1, words), ("zfs receive", 0, words)),
                           ["zfs"], "local") is None


@pytest.mark.parametrize(("stderr", "option"), [
    ("invalid option 'c'\nusage:\n\tsend [-DnPpRvLec] ...", "c"),  # zfs-fuse 0.7
    ("invalid option 'w'\nusage:", "w"),  # OpenZFS 0.7
    ("missing snapshot argument\nusage:", None),  # OpenZFS 2.x: every option parsed
])
def test_the_option_zfs_refused_is_named(stderr, option):
    assert refused_option(stderr) == option


def test_the_probe_answers_of_multi_snapshot_and_receive_options_are_told_apart():
    assert parsed_names("cannot create snapshot 'p@zbak%probe1': invalid character '%' in name")
    assert not parsed_names("too many arguments\nusage:")  # zfs-fuse
    assert wants_snapshot("missing snapshot argument\nusage:")
    assert not wants_snapshot("invalid option 'x'\nusage:")  # zfs-fuse
