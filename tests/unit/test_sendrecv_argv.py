"""zfs send / receive argv builders: the flags each capability and pool allows, and the
refusals."""

from __future__ import annotations

import dataclasses

import pytest

from zrepl_py.errors import InvalidName, ResumeTokenInvalid, SendArgsInvalid
from zrepl_py.replication.planner import ResumeToken
from zrepl_py.zfs.capabilities import Capabilities
from zrepl_py.zfs.properties import ReceiveProperties
from zrepl_py.zfs.sendrecv import abort_argv, receive_argv, send_argv, stream_flags
from zrepl_py.zfs.steps import (
    AbortResume,
    BookmarkRef,
    Full,
    Incremental,
    Resume,
    Rollback,
    SnapRef,
)

FEATURES = (("bookmarks", "enabled"), ("embedded_data", "active"),
            ("extensible_dataset", "active"), ("large_blocks", "enabled"),
            ("lz4_compress", "active"), ("zstd_compress", "enabled"))
"""A new OpenZFS 2.3 pool's stream features after its first writes (``zpool get``)."""
OPENZFS = Capabilities(parsable_list=True, resume_tokens=True, bookmarks=True, raw_send=True,
                       compressed_send=True, holds=True, multi_snapshot=True, pool_version=5000,
                       list_holds=True, receive_properties=True, features=FEATURES)
LEGACY = dataclasses.replace(OPENZFS, features=(), bookmarks=False, resume_tokens=False)
"""OpenZFS with a pool made by ``zpool create -d`` (or ``-o compatibility=legacy``)."""
ZFS_FUSE = Capabilities(parsable_list=False, resume_tokens=False, bookmarks=False,
                        raw_send=False, compressed_send=False, holds=True, multi_snapshot=False,
                        pool_version=23, list_holds=False)
NO_RAW = dataclasses.replace(OPENZFS, raw_send=False)
DS = "tank/my data"
A, B, C = SnapRef("a", 1, 10), SnapRef("b 2", 2, 20), SnapRef("c", 3, 30)
MARK = BookmarkRef("zbak_cursor", 2, 20)


def token(*, dataset: str = DS, raw: bool = False) -> ResumeToken:
    return ResumeToken(token="1-10f6e0d6b9-f0-789c63", toguid=2, toname=f"{dataset}@b 2",
                       fromguid=1, raw=raw, compressed=True, bytes=1234)


SEND_CASES = [
    ("a full send on zfs-fuse has no flags", Full(A), ZFS_FUSE, False,
     ["zfs", "send", "tank/my data@a"]),
    ("a full send on OpenZFS is compressed with large blocks and embedded data", Full(A),
     OPENZFS, False, ["zfs", "send", "-c", "-L", "-e", "tank/my data@a"]),
    ("a raw full send uses -w alone (it implies -Lec)", Full(A), OPENZFS, True,
     ["zfs", "send", "-w", "tank/my data@a"]),
    ("an incremental with intermediates uses -I", Incremental(A, C, True), ZFS_FUSE, False,
     ["zfs", "send", "-I", "tank/my data@a", "tank/my data@c"]),
    ("an incremental without intermediates uses -i", Incremental(A, B, False), OPENZFS, False,
     ["zfs", "send", "-c", "-L", "-e", "-i", "tank/my data@a", "tank/my data@b 2"]),
    ("an incremental from a bookmark names DS#bookmark with -i", Incremental(MARK, C, False),
     OPENZFS, False,
     ["zfs", "send", "-c", "-L", "-e", "-i", "tank/my data#zbak_cursor", "tank/my data@c"]),
    ("a raw incremental uses -w", Incremental(A, C, True), OPENZFS, True,
     ["zfs", "send", "-w", "-I", "tank/my data@a", "tank/my data@c"]),
    ("a resume sends -t with the token and nothing else", Resume(token(), B), OPENZFS, False,
     ["zfs", "send", "-t", "1-10f6e0d6b9-f0-789c63"]),
    ("a raw resume of a raw token sends -t alone", Resume(token(raw=True), B), OPENZFS, True,
     ["zfs", "send", "-t", "1-10f6e0d6b9-f0-789c63"]),
]


@pytest.mark.parametrize("case", SEND_CASES, ids=[c[0] for c in SEND_CASES])
def test_send_argv(case):
    _, step, caps, raw, argv = case
    assert send_argv(step, source_dataset=DS, caps=caps, raw=raw) == argv


def test_send_argv_uses_the_given_zfs_command():
    assert send_argv(Full(A), source_dataset=DS, caps=ZFS_FUSE, raw=False,
                     zfs="/sbin/zfs")[0] == "/sbin/zfs"


def test_no_send_argv_ever_replicates_children_and_properties_only_when_asked():
    steps = [Full(A), Incremental(A, C, True), Incremental(MARK, C, False), Resume(token(), B)]
    for step in steps:
        for caps in (OPENZFS, ZFS_FUSE, NO_RAW):
            for properties in (True, False):
                try:
                    argv = send_argv(step, source_dataset=DS, caps=caps, raw=False,
                                     properties=properties)
                except SendArgsInvalid:
                    continue
                assert "-R" not in argv
                assert ("-p" in argv) == (properties and not isinstance(step, Resume))


def test_properties_are_sent_with_p_after_the_stream_flags():
    assert send_argv(Incremental(A, C, True), source_dataset=DS, caps=OPENZFS, raw=True,
                     properties=True) == ["zfs", "send", "-w", "-p", "-I", f"{DS}@a", f"{DS}@c"]


def flags_between(sender_features, receiver_features):
    sender = dataclasses.replace(OPENZFS, features=tuple(sender_features))
    receiver = dataclasses.replace(OPENZFS, features=tuple(receiver_features))
    return stream_flags(sender, receiver)


FLAG_CASES = [
    ("a pool with every feature gets -c -L -e", FEATURES, FEATURES, ["-c", "-L", "-e"]),
    ("a pool without feature flags (zpool create -d) gets a plain stream", FEATURES, (), []),
    ("without large_blocks the large blocks are split: no -L",
     FEATURES, [f for f in FEATURES if f[0] != "large_blocks"], ["-c", "-e"]),
    ("without embedded_data no -e", FEATURES,
     [f for f in FEATURES if f[0] != "embedded_data"], ["-c", "-L"]),
    ("without lz4 neither -c nor -e while the sender's lz4 is active",
     FEATURES, [f for f in FEATURES if f[0] != "lz4_compress"], ["-L"]),
    ("without zstd no -c once the sender's zstd is active",
     [*FEATURES[:-1], ("zstd_compress", "active")],
     [f for f in FEATURES if f[0] != "zstd_compress"], ["-L", "-e"]),
    ("a zstd feature only enabled on the sender needs none on the receiver",
     FEATURES, [f for f in FEATURES if f[0] != "zstd_compress"], ["-c", "-L", "-e"]),
    ("an old pool with lz4 and embedded data but no large blocks (OpenZFS 0.6.4)",
     FEATURES, [("embedded_data", "enabled"), ("lz4_compress", "active")], ["-c", "-e"]),
]


@pytest.mark.parametrize("case", FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_stream_flags_are_what_the_receiving_pool_can_take(case):
    _, sender, receiver, flags = case
    assert flags_between(sender, receiver) == flags


def test_no_stream_flags_toward_or_from_a_zfs_without_them():
    assert stream_flags(OPENZFS, ZFS_FUSE) == []
    assert stream_flags(ZFS_FUSE, OPENZFS) == []
    assert stream_flags(OPENZFS, None) == ["-c", "-L", "-e"]


def test_a_send_to_a_legacy_pool_is_plain_and_a_raw_send_stays_raw():
    assert send_argv(Full(A), source_dataset=DS, caps=OPENZFS, raw=False,
                     receiver=LEGACY) == ["zfs", "send", "tank/my data@a"]
    assert send_argv(Full(A), source_dataset=DS, caps=OPENZFS, raw=True,
                     receiver=LEGACY)[:3] == ["zfs", "send", "-w"]


REFUSALS = [
    ("a raw send where the host has no -w is refused, never sent decrypted",
     Full(A), NO_RAW, True, "no raw send"),
    ("a raw send on zfs-fuse is refused", Incremental(A, C, True), ZFS_FUSE, True, "raw"),
    ("a resume without send -t is refused", Resume(token(), B), ZFS_FUSE, False, "send -t"),
    # docs/reliability.md#r4-token-for-another-operation-is-rejected
    ("a token of another dataset is refused",
     Resume(token(dataset="tank/other"), B), OPENZFS, False, "tank/other@b 2, not for"),
    # docs/reliability.md#r4-token-for-another-operation-is-rejected
    ("a non-raw token for a raw send is refused",
     Resume(token(raw=False), B), OPENZFS, True, "non-raw stream"),
    ("a raw token for a non-raw send is refused", Resume(token(raw=True), B), OPENZFS, False,
     "a raw stream"),
    ("an abort is not a send", AbortResume("stale"), OPENZFS, False, "not a send"),
    ("a rollback is not a send", Rollback(A, ()), OPENZFS, False, "not a send"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_send_argv_refusals(case):
    """docs/reliability.md#r4-token-for-another-operation-is-rejected."""
    _, step, caps, raw, words = case
    with pytest.raises(SendArgsInvalid, match=words):
        send_argv(step, source_dataset=DS, caps=caps, raw=raw)


def test_send_argv_validates_every_name():
    with pytest.raises(InvalidName):
        send_argv(Full(SnapRef("-R", 1, 1)), source_dataset=DS, caps=OPENZFS, raw=False)
    with pytest.raises(InvalidName):
        send_argv(Full(A), source_dataset="tank/$(x)", caps=OPENZFS, raw=False)
    with pytest.raises(InvalidName):
        send_argv(Incremental(BookmarkRef("a@b", 1, 1), C, False), source_dataset=DS,
                  caps=OPENZFS, raw=False)


def test_send_argv_refuses_a_malformed_token():
    bad = dataclasses.replace(token(), token="--replicate")
    with pytest.raises(ResumeTokenInvalid):
        send_argv(Resume(bad, B), source_dataset=DS, caps=OPENZFS, raw=False)


def test_receive_is_unmounted_and_resumable_where_supported():
    assert receive_argv(DS, caps=OPENZFS, resumable=True) == ["zfs", "receive", "-u", "-s", DS]


def test_receive_is_not_resumable_when_not_asked_or_not_supported():
    assert receive_argv(DS, caps=OPENZFS, resumable=False) == ["zfs", "receive", "-u", DS]
    assert receive_argv(DS, caps=ZFS_FUSE, resumable=True) == ["zfs", "receive", "-u", DS]


def test_receive_never_forces():
    for caps in (OPENZFS, ZFS_FUSE):
        for resumable in (True, False):
            for props in (None, ReceiveProperties.of()):
                assert "-F" not in receive_argv(DS, caps=caps, resumable=resumable,
                                                properties=props)


def test_receive_sets_and_excludes_the_replica_properties_where_zfs_takes_them():
    props = ReceiveProperties.of({"com.example:tag": "x"}, ["mountpoint"])
    assert receive_argv(DS, caps=OPENZFS, resumable=True, properties=props) == [
        "zfs", "receive", "-u", "-s", "-o", "canmount=noauto", "-o", "com.example:tag=x",
        "-o", "readonly=on", "-x", "mountpoint", DS]
    assert receive_argv(DS, caps=ZFS_FUSE, resumable=True, properties=props) == [
        "zfs", "receive", "-u", DS], "zfs-fuse has no receive -o/-x: set after, never sent"


def test_receive_and_abort_validate_the_target_name():
    with pytest.raises(InvalidName):
        receive_argv("-F", caps=OPENZFS, resumable=True)
    with pytest.raises(InvalidName):
        abort_argv("pool/x@snap")


def test_abort_argv_is_receive_minus_a():
    assert abort_argv(DS, zfs="/sbin/zfs") == ["/sbin/zfs", "receive", "-A", DS]
