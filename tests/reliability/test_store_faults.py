"""docs/reliability.md#r13-incomplete-upload, docs/reliability.md#r14-wrong-checksum,
docs/reliability.md#r15-multipart-edge-cases, docs/reliability.md#r18-zero-length-object at the
store contract level (C), against the ``file://`` store and moto's S3 server over HTTP, and the
fault wrappers themselves (a fault that does not fire would make every test above it pass for
nothing).

docs/reliability.md#r13-incomplete-upload in zbak's API: ``Backend.put`` takes chunks of unknown
length, so "fewer bytes than declared" has no direct equivalent; its two real forms are a source
that fails midway and a process killed mid-upload. Both must leave no visible object.
docs/reliability.md#r14-wrong-checksum: the S3 store sends ``x-amz-checksum-sha256`` with every
PutObject and UploadPart; S3 rejects a mismatch (BadDigest) and stores nothing. moto 5.2.5 does not
verify the header, so the S3 tests go through ``support.s3proxy.S3Proxy``, which emulates S3's check
in front of moto (a control test shows moto alone storing the damaged bytes). A ``file://`` put has
no transit to check: what is proven there is that the SHA-256 it returns is that of the file it
leaves; the client-side defence, the catalog's SHA-256 checked before any receive, is tested
with bytes corrupted in transit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from support.backend import FaultyBackend
from support.s3proxy import S3Proxy

from zrepl_py.catalog.rows import VolumeRow
from zrepl_py.errors import (
    ObjectNotFound,
    StorePermanent,
    StoreReadCorrupt,
    StoreTransient,
    StreamCorrupt,
)
from zrepl_py.restore.fetch import VolumeFetch
from zrepl_py.stores.file import FileBackend
from zrepl_py.stores.retry import RetryPolicy
from zrepl_py.stores.s3 import S3Backend
from zrepl_py.streams.frames import Digest, compress_frame

MiB = 1 << 20
FAST = RetryPolicy(attempts=3, initial_wait=0.01, max_wait=0.02)


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def store(request, tmp_path):
    """A real store: a temporary directory, or a fresh bucket on moto's S3 server."""
    if request.param == "file":
        root = tmp_path / "store"
        root.mkdir()
        backend = FileBackend("cold", root)
        backend.spec = {"kind": "file", "root": str(root)}
    else:
        server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")
        backend = S3Backend("cold", bucket, "zbak", endpoint_url=server.endpoint_url,
                            region=server.region, part_size=5 * MiB, concurrency=2, retry=FAST)
        backend.spec = {"kind": "s3", "bucket": bucket, "endpoint": server.endpoint_url,
                        "region": server.region}
    yield backend
    backend.close()


def payload(size: int) -> bytes:
    return os.urandom(size)


# -- the fault wrappers fire as documented -----------------------------------------------------


def test_faulty_reads_truncate_flip_and_append_at_absolute_offsets_across_chunks(store):
    data = payload(300_000)
    store.put("k", [data])

    def read(**faults) -> bytes:
        return b"".join(FaultyBackend(store, **faults).get("k", chunk_size=7_000))

    assert read(truncate_at=123_457) == data[:123_457]
    flipped = read(flip_byte_at=200_001, flip_mask=0x80)
    assert flipped[200_001] == data[200_001] ^ 0x80
    assert flipped[:200_001] + flipped[200_002:] == data[:200_001] + data[200_002:]
    assert read(append=b"junk") == data + b"junk"
    assert read(truncate_at=0) == b""
    assert FaultyBackend(store, truncate_at=5).stat("k").size == 300_000


def test_faulty_reads_apply_to_the_selected_keys_and_only_to_the_first_n_reads(store):
    store.put("a/vol", [b"abcdef"])
    store.put("a/other", [b"abcdef"])
    faulty = FaultyBackend(store, truncate_at=2, faulty_reads=1, keys="vol")
    assert b"".join(faulty.get("a/vol")) == b"ab"
    assert b"".join(faulty.get("a/vol")) == b"abcdef"
    assert b"".join(faulty.get("a/other")) == b"abcdef"
    assert faulty.local_path("a/vol") is None


def test_call_faults_fail_once_fail_after_n_hang_and_report_each_step(store):
    steps = []
    faulty = FaultyBackend(store, fail_once={"stat"}, fail_after_calls=2,
                           after_call=lambda n, op, key: steps.append((n, op, key)),
                           hang={"list": 0.3})
    faulty.put("x", [b"1"])
    with pytest.raises(StoreTransient, match="injected fault"):
        faulty.stat("x")
    assert faulty.stat("x").size == 1
    faulty.delete("x")
    with pytest.raises(StorePermanent, match="injected fault"):
        faulty.put("y", [b"2"])
    with pytest.raises(ObjectNotFound):
        store.stat("y")  # refused before it reached the store
    started = time.monotonic()
    assert list(faulty.list("")) == []
    assert time.monotonic() - started >= 0.3
    assert steps == [(1, "put", "x"), (2, "delete", "x")]
    assert [op for op, _ in faulty.calls] == ["put", "stat", "stat", "delete", "put", "list"]


# -- 13: incomplete upload ----------------------------------------------------------------------

KILLED_PUT = textwrap.dedent("""
    import json, os, signal, sys
    spec = json.loads(sys.argv[1])
    if spec["kind"] == "file":
        from zrepl_py.stores.file import FileBackend
        from pathlib import Path
        backend = FileBackend("cold", Path(spec["root"]))
    else:
        from zrepl_py.stores.s3 import S3Backend
        backend = S3Backend("cold", spec["bucket"], "zbak", endpoint_url=spec["endpoint"],
                            region=spec["region"], part_size=5 << 20, concurrency=2)
    def chunks():
        for i in range(40):
            yield os.urandom(1 << 20)
            if i == 11:  # 12 MiB handed over: two S3 parts may be on their way
                os.kill(os.getpid(), signal.SIGKILL)
    backend.put("streams/obj", chunks())
""")


def test_a_process_killed_mid_upload_leaves_no_visible_object(store):
    """docs/reliability.md#r13-incomplete-upload: SIGKILL in the middle of ``put`` (no abort can
    run): ``list`` and ``stat`` show nothing. (S3 may keep the multipart upload's parts: invisible,
    but billed until an AbortIncompleteMultipartUpload rule or ``zbak audit --repair`` aborts it,
    docs/reliability.md#r15-multipart-edge-cases.)"""
    done = subprocess.run([sys.executable, "-c", KILLED_PUT, json.dumps(store.spec)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert list(store.list("")) == []
    with pytest.raises(ObjectNotFound):
        store.stat("streams/obj")


def test_what_a_put_killed_midway_left_behind_is_removed_by_abort_stale_uploads(store, request):
    """docs/reliability.md#r15-multipart-edge-cases (C, both stores): after a SIGKILL mid-put, the
    store still holds the put's leftover (S3: an open multipart upload with its parts; ``file://``:
    the temporary file), invisible to ``list``; ``abort_stale_uploads`` removes it and names the
    key, and a second call finds nothing."""
    done = subprocess.run([sys.executable, "-c", KILLED_PUT, json.dumps(store.spec)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr

    def leftovers() -> list:
        if isinstance(store, S3Backend):
            client = request.getfixturevalue("s3_server").client()
            return client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
        return [p for p in store.root.rglob("*") if p.is_file()]

    assert len(leftovers()) == 1 and list(store.list("")) == []
    removed = store.abort_stale_uploads(0)
    assert len(removed) == 1 and removed[0].startswith("streams/obj ("), removed
    assert leftovers() == []
    assert store.abort_stale_uploads(0) == []


def test_a_source_failing_midway_leaves_no_object_and_no_open_upload(store, request):
    """docs/reliability.md#r13-incomplete-upload: the chunks raise after 11 MiB (two S3 parts sent):
    the caller's error comes out, nothing is visible, and the S3 multipart upload was aborted."""

    class ShortRead(Exception):
        pass

    def chunks():
        for _ in range(11):
            yield payload(MiB)
        raise ShortRead("the source ended before its declared length")

    with pytest.raises(ShortRead):
        store.put("streams/obj", chunks())
    assert list(store.list("")) == []
    if isinstance(store, S3Backend):
        client = request.getfixturevalue("s3_server").client()
        uploads = client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
        assert uploads == []


# -- 14: wrong checksum -------------------------------------------------------------------------


def _corrupting_client(server, *, operations=("PutObject", "UploadPart"),
                       response_checksums: str = "when_supported"):
    """A real boto3 client whose request bodies get one bit flipped after botocore computed
    the checksum header: corruption in transit, seen by the server. ``response_checksums``
    is botocore's ``response_checksum_validation`` for downloads."""
    import boto3
    import botocore.config

    client = boto3.client("s3", endpoint_url=server.endpoint_url, region_name=server.region,
                          aws_access_key_id=server.access_key,
                          aws_secret_access_key=server.secret_key,
                          config=botocore.config.Config(
                              response_checksum_validation=response_checksums))

    def corrupt(request, **_kwargs):
        body = request.body
        raw = body.read() if hasattr(body, "read") else bytes(body or b"")
        if hasattr(body, "seek"):
            body.seek(0)
        if raw:
            changed = bytearray(raw)
            changed[len(changed) // 2] ^= 0x01
            request.body = bytes(changed)

    for op in operations:
        client.meta.events.register(f"before-send.s3.{op}", corrupt)
    return client


@pytest.fixture
def verifying(s3_server):
    """moto behind ``support.s3proxy.S3Proxy`` emulating S3's checksum check: the server
    to give clients (``S3Server`` with the proxy's endpoint) and the proxy."""
    proxy = S3Proxy(s3_server.endpoint_url, verify_checksums=True)
    try:
        yield dataclasses.replace(s3_server, endpoint_url=proxy.url), proxy
    finally:
        proxy.close()


SIZES = pytest.mark.parametrize("size", [MiB, 11 * MiB], ids=["put-object", "multipart"])


@pytest.mark.s3
@SIZES
def test_an_upload_whose_bytes_do_not_match_their_checksum_is_refused_and_leaves_no_object(
        s3_server, s3_bucket, verifying, size):
    """docs/reliability.md#r14-wrong-checksum: bytes damaged after zbak computed their
    x-amz-checksum-sha256 are refused with BadDigest (as S3 does; moto does not check, the proxy in
    front of it does): the put fails, nothing is stored, and the multipart upload of the large
    object is aborted."""
    server, proxy = verifying
    backend = S3Backend("cold", s3_bucket, "zbak", client=_corrupting_client(server),
                        part_size=5 * MiB, retry=FAST)
    with pytest.raises(StorePermanent, match="BadDigest"):
        backend.put("streams/obj", [payload(size)])
    assert proxy.refused, "the proxy saw no damaged upload"
    with pytest.raises(ObjectNotFound):
        backend.stat("streams/obj")
    direct = s3_server.client()
    assert direct.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0
    assert direct.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


@pytest.mark.s3
def test_without_the_proxys_check_moto_stores_the_damaged_upload(s3_server, s3_bucket):
    """The control of the test above: moto alone keeps bytes that do not match their
    checksum header, so what refuses them there is the emulated S3 check. The day moto
    checks, this fails and the proxy can go."""
    proxy = S3Proxy(s3_server.endpoint_url)
    try:
        server = dataclasses.replace(s3_server, endpoint_url=proxy.url)
        backend = S3Backend("cold", s3_bucket, "zbak", client=_corrupting_client(server),
                            part_size=5 * MiB, retry=FAST)
        data = payload(MiB)
        backend.put("streams/obj", [data])
    finally:
        proxy.close()
    (seen,) = [r for r in proxy.requests if r.uploads_bytes]
    assert seen.checksum != seen.sha256
    # Read without botocore's own check of the stored checksum, which would fail it.
    reader = _corrupting_client(s3_server, operations=(), response_checksums="when_required")
    stored = reader.get_object(Bucket=s3_bucket, Key="zbak/streams/obj")["Body"].read()
    assert len(stored) == len(data) and stored != data


@pytest.mark.s3
@SIZES
def test_every_put_object_and_upload_part_carries_the_sha256_of_its_body(
        s3_bucket, verifying, size):
    """docs/reliability.md#r14-wrong-checksum: what makes S3 refuse damaged bytes: each PutObject,
    and each part of a multipart upload, carries x-amz-checksum-sha256 of its own body, as the proxy
    saw the request on the wire (header or aws-chunked trailer), and the undamaged upload is
    stored."""
    server, proxy = verifying
    backend = S3Backend("cold", s3_bucket, "zbak", endpoint_url=server.endpoint_url,
                        region=server.region, part_size=5 * MiB, retry=FAST)
    data = payload(size)
    backend.put("streams/obj", [data[:MiB // 3], data[MiB // 3:]])
    uploads = [r for r in proxy.requests if r.uploads_bytes]
    assert len(uploads) == (1 if size <= 5 * MiB else 3), proxy.requests
    assert all(r.checksum is not None and r.checksum == r.sha256 for r in uploads), uploads
    assert ("uploadId=" in uploads[0].path) == (size > 5 * MiB)
    assert b"".join(backend.get("streams/obj")) == data and not proxy.refused


def test_a_file_store_stores_exactly_the_bytes_it_hashed(tmp_path):
    """docs/reliability.md#r14-wrong-checksum on ``file://``, where no transit exists to check: the
    put hashes the chunks in the process that writes them, and the SHA-256 it returns, which the
    catalog records and every restore checks (docs/reliability.md#r9-bit-flip-in-an-object), is
    that of the file it leaves, here for 40 chunks of uneven sizes going through its writer
    and hasher threads."""
    root = tmp_path / "store"
    root.mkdir()
    store = FileBackend("cold", root)
    chunks = [payload(size) for size in (1, 65_536, 3 * MiB, 7, 1_000_003) * 8]
    result = store.put("streams/obj", chunks)
    written = (root / "streams" / "obj").read_bytes()
    assert written == b"".join(chunks)
    assert result.sha256 == hashlib.sha256(written).hexdigest()
    assert result.size == len(written)


@pytest.mark.s3
@pytest.mark.parametrize("response_checksums", ["when_supported", "when_required"])
def test_a_volume_corrupted_in_transit_on_upload_is_refused_before_any_receive(
        s3_server, s3_bucket, tmp_path, response_checksums):
    """docs/reliability.md#r14-wrong-checksum: the defences that hold whatever the server checks:
    botocore compares the download with the stored object's SHA-256 checksum (which moto kept from
    the upload's header: a StoreReadCorrupt, read again once as a flaky read would be, then
    refused), and, with that off, the catalog's SHA-256 of the bytes zbak produced fails the
    volume."""
    client = _corrupting_client(s3_server, response_checksums=response_checksums)
    backend = S3Backend("cold", s3_bucket, "zbak", client=client, retry=FAST)
    digest = Digest()
    backend.put("s/vol-000000.zst", compress_frame([payload(300_000)], 3, digest))
    volume = VolumeRow(id=1, stream_id=1, index=0, key="s/vol-000000.zst",
                       raw_bytes=digest.raw_bytes, stored_bytes=digest.stored_bytes,
                       sha256=digest.sha256)
    expected = ((StoreReadCorrupt, "did not match calculated checksum")
                if response_checksums == "when_supported" else (StreamCorrupt, "SHA-256"))
    with pytest.raises(expected[0], match=expected[1]), \
            VolumeFetch(backend, [volume], tmp_path / "spool", 1) as fetch:
        fetch.wait_all()


# -- 18: zero-length object ---------------------------------------------------------------------


def test_a_zero_length_object_round_trips(store):
    """docs/reliability.md#r18-zero-length-object (pgBackRest "write zero-length file"): put, stat,
    list, get, delete."""
    result = store.put("streams/empty", iter(()))
    assert (result.size, result.sha256) == (0, hashlib.sha256(b"").hexdigest())
    assert store.stat("streams/empty").size == 0
    assert [(i.key, i.size) for i in store.list("streams/")] == [("streams/empty", 0)]
    assert b"".join(store.get("streams/empty")) == b""
    store.delete("streams/empty")
    with pytest.raises(ObjectNotFound):
        store.stat("streams/empty")


def test_a_hanging_store_read_can_be_abandoned_by_its_caller(store):
    """The ``hang`` fault holds a call for the time asked, in its own thread, so a caller
    with a deadline (a test, a timeout wrapper) regains control."""
    store.put("k", [b"data"])
    faulty = FaultyBackend(store, hang={"get": 2.0})
    result = []
    worker = threading.Thread(target=lambda: result.append(b"".join(faulty.get("k"))),
                              daemon=True)
    worker.start()
    worker.join(0.2)
    assert worker.is_alive() and not result
    worker.join(5)
    assert result == [b"data"]


# -- 11: flaky read at the store level ------------------------------------------------------------


def _stored_volume(store, key: str = "s/vol-000000.zst") -> VolumeRow:
    digest = Digest()
    store.put(key, compress_frame([os.urandom(200_000)], 3, digest))
    return VolumeRow(id=1, stream_id=1, index=0, key=key, raw_bytes=digest.raw_bytes,
                     stored_bytes=digest.stored_bytes, sha256=digest.sha256)


@pytest.mark.parametrize("fault", [{"flip_byte_at": 1000}, {"truncate_at": 1000},
                                   {"append": b"\0" * 10}], ids=["flip", "truncate", "append"])
def test_a_volume_bad_on_the_first_read_only_verifies_on_the_second_and_is_reported(
        store, tmp_path, caplog, fault):
    """docs/reliability.md#r11-flaky-read (C): against each store, a read that is bad once is read
    again; the warning names the volume and says the first read failed."""
    volume = _stored_volume(store)
    faulty = FaultyBackend(store, faulty_reads=1, **fault)
    with caplog.at_level("WARNING", logger="zrepl_py.restore.fetch"), \
            VolumeFetch(faulty, [volume], tmp_path / "spool", 1) as fetch:
        files = fetch.wait_all()
    assert hashlib.sha256(files[1].read_bytes()).hexdigest() == volume.sha256
    assert faulty.calls.count(("get", volume.key)) == 2
    warned = [r.getMessage() for r in caplog.records if volume.key in r.getMessage()]
    assert any("failed verification on the first read" in m for m in warned), warned
    assert any("verified on the second read" in m for m in warned), warned
