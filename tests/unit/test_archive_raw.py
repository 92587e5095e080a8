"""docs/reliability.md#r38-encrypted-datasets, the archive side (unit): an encrypted dataset is
archived raw (``zfs send -w``) or not at all, its manifest says so, and raw streams walk correctly.

The guest test tests/e2e/test_archive_encrypted_openzfs.py proves the same on real OpenZFS
2.3 (no plaintext in the store, restore, audit --deep); here are the argv, the refusal on a
host without ``-w``, the manifest field (old manifests still load), the planner's new chain,
and raw stream records built in the zfs_ioctl.h layout (OBJECT_RANGE, WRITE payloads of
``drr_compressed_size``, BEGIN feature ``DMU_BACKUP_FEATURE_RAW``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import struct

import pytest
from support.records import walk

from zrepl_py.archive.job import archive_send
from zrepl_py.archive.planner import ChainPolicy, PlannedStream, plan_archive
from zrepl_py.catalog.rows import StreamRow
from zrepl_py.errors import RawSendUnavailable, SendArgsInvalid, StreamCorrupt
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest, VolumeRecord
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.streams.records import (
    DMU_BACKUP_FEATURE_RAW,
    DMU_BACKUP_MAGIC,
    DRR_BEGIN,
    DRR_END,
    DRR_OBJECT,
    DRR_OBJECT_RANGE,
    DRR_WRITE,
    RECORD_SIZE,
)
from zrepl_py.zfs.capabilities import Capabilities
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.encryption import Encryption, probe_encryption
from zrepl_py.zfs.names import DatasetName

OPENZFS = Capabilities(parsable_list=True, resume_tokens=True, bookmarks=True, raw_send=True,
                       compressed_send=True, holds=True, multi_snapshot=True, pool_version=5000,
                       list_holds=True)
NO_RAW = dataclasses.replace(OPENZFS, raw_send=False)
ZFS_FUSE = Capabilities(parsable_list=False, resume_tokens=False, bookmarks=False,
                        raw_send=False, compressed_send=False, holds=True, multi_snapshot=False,
                        pool_version=23, list_holds=False)
DS = DatasetName("tank/secret data")
A, B = CarriedSnapshot("a", 11, 10), CarriedSnapshot("b", 22, 20)
FULL = PlannedStream("full", None, A, (A,), None, "no chain yet")
INCR = PlannedStream("incremental", A, B, (B,), 7, "continues")
NOW = dt.datetime(2026, 1, 10, tzinfo=dt.UTC)


# -- the send argv ------------------------------------------------------------------------

def test_an_encrypted_full_is_sent_raw_and_its_manifest_flags_say_w():
    argv, flags = archive_send(FULL, DS, OPENZFS, encrypted=True)
    assert argv == ["zfs", "send", "-w", "tank/secret data@a"]
    assert flags == ("-w",)


def test_an_encrypted_incremental_is_sent_raw_with_dash_capital_i():
    argv, flags = archive_send(INCR, DS, OPENZFS, encrypted=True, zfs="/sbin/zfs")
    assert argv == ["/sbin/zfs", "send", "-w", "-I", "tank/secret data@a", "tank/secret data@b"]
    assert flags == ("-w", "-I")


def test_an_unencrypted_dataset_is_sent_plain_without_w_c_l_or_e_even_on_openzfs():
    assert archive_send(INCR, DS, OPENZFS, encrypted=False) == (
        ["zfs", "send", "-I", "tank/secret data@a", "tank/secret data@b"], ("-I",))
    assert archive_send(FULL, DS, ZFS_FUSE, encrypted=False) == (
        ["zfs", "send", "tank/secret data@a"], ())


@pytest.mark.parametrize("planned", [FULL, INCR], ids=["full", "incremental"])
@pytest.mark.parametrize("caps", [NO_RAW, ZFS_FUSE], ids=["openzfs-0.7", "zfs-fuse"])
def test_an_encrypted_dataset_on_a_host_without_raw_send_is_refused_not_sent_decrypted(
        planned, caps):
    with pytest.raises(RawSendUnavailable, match="refusing to archive it decrypted") as info:
        archive_send(planned, DS, caps, encrypted=True)
    assert isinstance(info.value, SendArgsInvalid)  # the type replication raises for the same
    assert str(DS) in str(info.value)


def test_a_host_whose_pool_cannot_hold_encrypted_datasets_is_not_asked_about_encryption():
    # zfs-fuse (pool v23, no -w): no `zfs get encryption`, which it would refuse. The command
    # path does not exist, so running anything would raise.
    zfs = Zfs(LocalExecutor(), zfs="/nonexistent/zfs", capabilities=ZFS_FUSE)
    assert probe_encryption(zfs, [DS]) == Encryption()
    assert probe_encryption(Zfs(LocalExecutor(), zfs="/nonexistent/zfs",
                                capabilities=OPENZFS), []) == Encryption()


# -- the manifest -------------------------------------------------------------------------

def manifest(send_flags: tuple[str, ...]) -> Manifest:
    return Manifest(
        host="vm", dataset=str(DS), kind="full", from_snap=None, to_snap=A, snapshots=(A,),
        volumes=(VolumeRecord(0, "k/vol-000000.zst", 10, 4, "a" * 64),),
        compression="zstd", compression_level=3, send_flags=send_flags,
        storage_class="STANDARD", tool="zbak 0.1.0", created_at=NOW)


def test_a_raw_stream_manifest_says_raw_and_survives_the_round_trip():
    m = manifest(("-w",))
    data = m.to_json()
    assert json.loads(data)["raw"] is True and json.loads(data)["send_flags"] == ["-w"]
    back = Manifest.from_json(data, "here")
    assert back == m and back.raw
    assert json.loads(manifest(()).to_json())["raw"] is False


def test_a_manifest_written_before_the_raw_field_still_loads_and_reads_raw_from_its_flags():
    for flags, raw in ((("-I",), False), (("-w", "-I"), True)):
        obj = json.loads(manifest(flags).to_json())
        del obj["raw"], obj["sha256"]  # an old writer: neither field
        loaded = Manifest.from_json(json.dumps(obj).encode(), "old")
        assert loaded.raw is raw and loaded.send_flags == flags


def test_a_manifest_whose_raw_field_contradicts_its_send_flags_is_refused():
    obj = json.loads(manifest(()).to_json())
    del obj["sha256"]
    obj["raw"] = True
    with pytest.raises(StreamCorrupt, match="raw is True"):
        Manifest.from_json(json.dumps(obj).encode(), "store:k/manifest.json")


# -- the planner --------------------------------------------------------------------------

def row(**changes) -> StreamRow:
    fields = dict(id=1, host="vm", dataset=str(DS), store="s", kind="full", from_guid=None,
                  from_name=None, to_guid=A.guid, to_name=A.name, to_createtxg=A.createtxg,
                  parent_id=None, object_prefix="vm/p/", storage_class="STANDARD",
                  compression="zstd", raw_bytes=10, stored_bytes=4, state="uploaded",
                  created_at=NOW, uploaded_at=NOW, verified_at=None)
    fields.update(changes)
    return StreamRow(**fields)


def test_a_caller_reason_for_a_new_chain_starts_a_full_of_the_newest_snapshot():
    policy = ChainPolicy(dt.timedelta(days=30), 10)
    why = "its chain was archived decrypted"
    plan = plan_archive([A, B], [row()], policy, NOW, new_chain=why)
    assert [(p.kind, p.to_snap, p.reason) for p in plan.streams] == [("full", B, why)]
    assert plan_archive([A, B], [row()], policy, NOW).streams[0].kind == "incremental"
    # nothing newer than the tip: the new chain waits for the next snapshot, as --full does
    assert plan_archive([A], [row()], policy, NOW, new_chain=why).streams == ()


# -- raw stream records -------------------------------------------------------------------

def record(kind: int, body: bytes = b"", payloadlen: int = 0) -> bytes:
    head = struct.pack("<II", kind, payloadlen) + body
    return head + bytes(RECORD_SIZE - len(head))


def begin(toguid: int, fromguid: int, *, raw: bool, hdrtype: int = 1, payload: bytes = b"") -> bytes:
    features = (DMU_BACKUP_FEATURE_RAW | (1 << 22)) if raw and hdrtype == 1 else 0
    body = struct.pack("<QQQIIQQ256s", DMU_BACKUP_MAGIC, hdrtype | (features << 2), 1_700_000_000,
                       2, 0xC, toguid, fromguid, f"tank/e@{toguid}".encode())
    return record(DRR_BEGIN, body, len(payload)) + payload


def object_range() -> bytes:
    # drr_firstobj, drr_numslots, drr_toguid, then salt/iv/mac in the header: no payload
    return record(DRR_OBJECT_RANGE, struct.pack("<QQQ", 0, 32, 77) + b"\x5a" * 44)


def raw_object(bonuslen: int, raw_bonuslen: int) -> bytes:
    body = struct.pack("<QIIII4xI", 5, 19, 44, 131072, bonuslen, raw_bonuslen)
    return record(DRR_OBJECT, body) + b"\xbb" * raw_bonuslen


def raw_write(logical: int, psize: int, compression: int) -> bytes:
    """A raw WRITE: drr_compressiontype is the block's own (2 = off), payload psize bytes."""
    body = bytearray(struct.pack("<QI4xQQQ", 5, 19, 0, logical, 77))
    body += bytes(88 - len(body))
    body[42] = compression  # drr_compressiontype (record offset 50)
    body[88:96] = struct.pack("<Q", psize)  # drr_compressed_size (record offset 96)
    body += b"\x01" * 12 + b"\x02" * 12 + b"\x03" * 16  # salt, iv, mac
    return record(DRR_WRITE, bytes(body)) + b"\xcc" * psize


def raw_substream(toguid: int, fromguid: int, raw: bool = True) -> bytes:
    keydata = b"\x00\x01" * 60  # stands in for the nvlist with the wrapped key
    return (begin(toguid, fromguid, raw=raw, payload=keydata) + object_range()
            + raw_object(192, 320) + raw_write(131072, 131072, 2)  # uncompressed block
            + raw_write(131072, 4096, 15) + record(DRR_END))


def test_a_raw_stream_walks_with_object_ranges_and_encrypted_write_payloads():
    stream = raw_substream(22, 0)
    summary = walk([stream[i:i + 1000] for i in range(0, len(stream), 1000)], "raw")
    assert summary.raw and summary.bytes == len(stream)
    assert [(b.toguid, b.fromguid, b.raw) for b in summary.substreams] == [(22, 0, True)]


def test_a_raw_dash_capital_i_stream_is_raw_although_its_compound_header_has_no_features():
    stream = (begin(0, 0, raw=True, hdrtype=2) + record(DRR_END)
              + raw_substream(22, 11) + raw_substream(33, 22) + record(DRR_END))
    summary = walk([stream], "raw -I")
    assert summary.compound and summary.raw
    assert [b.toguid for b in summary.substreams] == [22, 33]


def test_a_stream_mixing_raw_and_non_raw_substreams_is_corrupt():
    stream = (begin(0, 0, raw=True, hdrtype=2) + record(DRR_END)
              + raw_substream(22, 11) + raw_substream(33, 22, raw=False) + record(DRR_END))
    with pytest.raises(StreamCorrupt, match="is not raw but the one before it is raw"):
        walk([stream], "mixed")
