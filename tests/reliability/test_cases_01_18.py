"""docs/reliability.md#r1-interrupted-full-send-resumes,
docs/reliability.md#r2-interrupted-incremental-i-resumes, docs/reliability.md#r3-stale-token,
docs/reliability.md#r4-token-for-another-operation-is-rejected,
docs/reliability.md#r5-target-full-during-receive,
docs/reliability.md#r6-receiver-fails-while-the-sender-is-still-writing,
docs/reliability.md#r7-a-failing-pipeline-stage-is-detected,
docs/reliability.md#r8-truncated-stream-object, docs/reliability.md#r9-bit-flip-in-an-object,
docs/reliability.md#r10-trailing-garbage-after-the-last-frame-is-rejected,
docs/reliability.md#r11-flaky-read, docs/reliability.md#r12-valid-zstd-around-an-invalid-zfs-stream,
docs/reliability.md#r13-incomplete-upload, docs/reliability.md#r14-wrong-checksum,
docs/reliability.md#r15-multipart-edge-cases, docs/reliability.md#r16-retry-policy,
docs/reliability.md#r17-glacier, docs/reliability.md#r18-zero-length-object where the older test
files left a case or a level uncovered.

Object store (U with botocore's Stubber, C against moto's S3 server over real HTTP):

* 15: an error inside a 200 CompleteMultipartUpload answer fails the put and aborts the
  upload, both as botocore parses it (Stubber) and on the wire (a proxy in front of moto
  rewrites the answer, so botocore's own 200-error handling runs); the age filter of
  ``abort_stale_uploads`` (moto reports every upload as initiated in 2010).
* 16: the S3 error mapping under the retry policy: which codes are retried, which are not;
  a SIGINT during the backoff (what SIGTERM becomes in ``zbak``) stops the retries at once.
* 17 (U): ``InvalidObjectState`` on GET is ``NeedsThaw``, with no retry.
* 11 (C, S3): a GET whose body is damaged in transit once (the proxy flips a byte) fails
  botocore's checksum check; the restore's verifying fetch reads it again and reports it.

Real ZFS (Z, zfs-fuse pools; the OpenZFS guest where tokens are needed):

* 1: after an interrupted full send, the resumed (OpenZFS) or restarted (zfs-fuse) replica
  holds the same files, by content hash, not only the same snapshot GUID.
* 4 (Z): a real resume token of another filesystem is rejected before any send.
* 5: the target pool filled with ``dd``: the run fails with the receiver's typed error and
  exit 1, the catalog records no success, a resume token is kept (OpenZFS), and after space
  is freed the run completes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import random
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import boto3
import botocore.config
import pytest
from botocore.stub import ANY, Stubber
from support.cli import Ran, run_zbak, start_zbak, wait_for_bytes
from support.s3proxy import S3Proxy

from zrepl_py.catalog.rows import VolumeRow
from zrepl_py.errors import (
    ExitStatus,
    NeedsThaw,
    ObjectNotFound,
    StorePermanent,
    StoreReadCorrupt,
    StoreTransient,
    StreamCorrupt,
)
from zrepl_py.restore.fetch import VolumeFetch
from zrepl_py.stores.retry import RetryPolicy
from zrepl_py.stores.s3 import S3Backend
from zrepl_py.streams.frames import Digest, compress_frame

MiB = 1 << 20
PART = 5 * MiB
FAST = RetryPolicy(attempts=3, initial_wait=0.01, max_wait=0.02)


# -- botocore Stubber: the answers S3 gives, exactly as botocore parses them ------------------


@pytest.fixture
def stubbed():
    """An S3Backend on a real boto3 client whose answers come from a ``Stubber`` queue
    (nothing leaves the process); ``backend.stub`` is the Stubber."""
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k",
                          aws_secret_access_key="s",
                          config=botocore.config.Config(retries={"total_max_attempts": 1}))
    stub = Stubber(client)
    backend = S3Backend("stubbed", "bucket", "zbak", client=client, part_size=PART,
                        concurrency=1, retry=FAST)
    backend.stub = stub
    with stub:
        yield backend


def _queue_multipart_start(stub: Stubber, parts: int) -> None:
    stub.add_response("create_multipart_upload", {"UploadId": "u-1", "Key": "zbak/k"},
                      {"Bucket": "bucket", "Key": "zbak/k", "StorageClass": "STANDARD",
                       "ChecksumAlgorithm": "SHA256"})
    for number in range(1, parts + 1):
        stub.add_response("upload_part", {"ETag": f'"etag-{number}"'},
                          {"Bucket": "bucket", "Key": "zbak/k", "UploadId": "u-1",
                           "PartNumber": number, "Body": ANY, "ChecksumAlgorithm": "SHA256",
                           "ChecksumSHA256": ANY})


def _queue_abort(stub: Stubber) -> None:
    stub.add_response("abort_multipart_upload", {},
                      {"Bucket": "bucket", "Key": "zbak/k", "UploadId": "u-1"})


TWO_PARTS = [b"\1" * PART, b"\2" * 10]


def test_a_complete_multipart_upload_answering_200_with_an_error_body_fails_the_put_and_aborts(
        stubbed):
    """docs/reliability.md#r15-multipart-edge-cases (U, Stubber): the Stubber answers
    CompleteMultipartUpload with HTTP 200 and an ``<Error>`` (what botocore hands back for such a
    body when its own 200-error handler does not apply). The put is retried, then fails; the upload
    is aborted."""
    stub = stubbed.stub
    _queue_multipart_start(stub, 2)
    for _ in range(FAST.attempts):
        stub.add_client_error("complete_multipart_upload", "InternalError",
                              "We encountered an internal error. Please try again.",
                              http_status_code=200)
    _queue_abort(stub)
    with pytest.raises(StoreTransient, match="InternalError.*gave up after 3 attempts"):
        stubbed.put("k", TWO_PARTS)
    stub.assert_no_pending_responses()  # every answer used: 3 completes, then the abort


def test_a_complete_multipart_upload_answer_without_the_objects_etag_fails_the_put(stubbed):
    """docs/reliability.md#r15-multipart-edge-cases (U): an answer that parsed without error but
    names no ETag of the new object is not taken for a stored object; a permanent error code inside
    it is not retried."""
    stub = stubbed.stub
    _queue_multipart_start(stub, 2)
    for _ in range(FAST.attempts):
        stub.add_response("complete_multipart_upload", {"Bucket": "bucket", "Key": "zbak/k"})
    _queue_abort(stub)
    with pytest.raises(StoreTransient, match="no ETag"):
        stubbed.put("k", TWO_PARTS)
    stub.assert_no_pending_responses()

    _queue_multipart_start(stub, 2)
    stub.add_client_error("complete_multipart_upload", "InvalidPart", "One or more of the"
                          " specified parts could not be found.", http_status_code=200)
    _queue_abort(stub)
    with pytest.raises(StorePermanent, match="InvalidPart"):
        stubbed.put("k", TWO_PARTS)
    stub.assert_no_pending_responses()


def test_a_complete_multipart_upload_with_an_etag_is_a_stored_object(stubbed):
    """docs/reliability.md#r15-multipart-edge-cases: The control for the two tests above: the same
    exchange with a proper answer succeeds."""
    stub = stubbed.stub
    _queue_multipart_start(stub, 2)
    stub.add_response("complete_multipart_upload", {"Bucket": "bucket", "Key": "zbak/k",
                                                    "ETag": '"whole-2"'})
    result = stubbed.put("k", TWO_PARTS)
    assert result.size == PART + 10
    assert result.sha256 == hashlib.sha256(b"".join(TWO_PARTS)).hexdigest()
    stub.assert_no_pending_responses()


def test_abort_stale_uploads_aborts_only_uploads_initiated_before_the_age(stubbed):
    """docs/reliability.md#r15-multipart-edge-cases (U): of three open uploads under the prefix, the
    two initiated more than a day ago are aborted (across a truncated listing page); one started an
    hour ago may belong to a running put and stays. An upload gone meanwhile is skipped."""
    stub = stubbed.stub
    now = dt.datetime.now(dt.UTC)

    def upload(key: str, uid: str, age: dt.timedelta) -> dict:
        return {"Key": f"zbak/{key}", "UploadId": uid, "Initiated": now - age}

    stub.add_response("list_multipart_uploads", {
        "Uploads": [upload("a/old", "u-old", dt.timedelta(days=3)),
                    upload("a/young", "u-young", dt.timedelta(hours=1))],
        "IsTruncated": True, "NextKeyMarker": "zbak/a/young", "NextUploadIdMarker": "u-young",
    }, {"Bucket": "bucket", "Prefix": "zbak/"})
    stub.add_response("list_multipart_uploads", {
        "Uploads": [upload("b/older", "u-older", dt.timedelta(days=9)),
                    upload("b/gone", "u-gone", dt.timedelta(days=2))],
        "IsTruncated": False,
    }, {"Bucket": "bucket", "Prefix": "zbak/", "KeyMarker": "zbak/a/young",
        "UploadIdMarker": "u-young"})
    stub.add_response("abort_multipart_upload", {},
                      {"Bucket": "bucket", "Key": "zbak/a/old", "UploadId": "u-old"})
    stub.add_client_error("abort_multipart_upload", "NoSuchUpload", "gone", 404,
                          expected_params={"Bucket": "bucket", "Key": "zbak/b/gone",
                                           "UploadId": "u-gone"})
    stub.add_response("abort_multipart_upload", {},
                      {"Bucket": "bucket", "Key": "zbak/b/older", "UploadId": "u-older"})
    assert stubbed.abort_stale_uploads(86400) == [
        "a/old (multipart upload u-old)", "b/older (multipart upload u-older)"]
    stub.assert_no_pending_responses()


# -- 16 and 17: the S3 error mapping under the retry policy --------------------------------------


@pytest.mark.parametrize("code, status", [
    ("SlowDown", 503), ("InternalError", 500), ("ServiceUnavailable", 503),
    ("RequestTimeout", 400), ("ThrottlingException", 400), ("TooManyRequests", 429),
    ("", 502),
])
def test_transient_s3_errors_are_retried_with_backoff_until_the_attempts_are_used(
        stubbed, code, status):
    """docs/reliability.md#r16-retry-policy (U): throttling and 5xx answers are retried (three
    answers used by three attempts) and, when they persist, end in StoreTransient naming the
    attempts."""
    for _ in range(FAST.attempts):
        stubbed.stub.add_client_error("head_object", code, "try later", status)
    with pytest.raises(StoreTransient, match="gave up after 3 attempts"):
        stubbed.stat("k")
    stubbed.stub.assert_no_pending_responses()


def test_a_transient_s3_error_followed_by_success_is_invisible_to_the_caller(stubbed):
    """docs/reliability.md#r16-retry-policy (U): SlowDown then an answer: the call returns the
    answer."""
    stubbed.stub.add_client_error("head_object", "SlowDown", "reduce your rate", 503)
    stubbed.stub.add_response("head_object", {
        "ContentLength": 3, "LastModified": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)})
    assert stubbed.stat("k").size == 3
    stubbed.stub.assert_no_pending_responses()


@pytest.mark.parametrize("op, code, status, error", [
    ("get_object", "NoSuchKey", 404, ObjectNotFound),
    ("head_object", "404", 404, ObjectNotFound),
    ("get_object", "AccessDenied", 403, StorePermanent),
    ("get_object", "InvalidAccessKeyId", 403, StorePermanent),
    ("get_object", "NoSuchBucket", 404, StorePermanent),
    ("get_object", "InvalidObjectState", 403, NeedsThaw),  # docs/reliability.md#r17-glacier
])
def test_permanent_s3_errors_are_raised_at_once_without_a_retry(stubbed, op, code, status,
                                                                 error):
    """docs/reliability.md#r16-retry-policy (U): 404, 403 and InvalidObjectState are answered once:
    the only queued answer is used, no second request is made (a second one would find the Stubber
    queue empty and fail differently); docs/reliability.md#r17-glacier (U): InvalidObjectState is
    NeedsThaw."""
    stubbed.stub.add_client_error(op, code, "no", status)
    call = stubbed.get if op == "get_object" else stubbed.stat
    with pytest.raises(error) as caught:
        call("k")
    assert type(caught.value) is error
    stubbed.stub.assert_no_pending_responses()


def test_a_signal_during_the_retry_backoff_stops_the_retries_at_once():
    """docs/reliability.md#r16-retry-policy (U), cancellation: zbak turns SIGTERM into
    KeyboardInterrupt (``cli._terminate``); one arriving while the policy sleeps before a retry ends
    the call at once, with no further attempt."""
    calls = []
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))

    def always_transient():
        if not calls:
            timer.start()  # the signal lands in the wait after this first try
        calls.append(time.monotonic())
        raise StoreTransient("503 SlowDown", store="s", key="k")

    patient = RetryPolicy(attempts=5, initial_wait=60, max_wait=60)
    # tenacity draws the wait from the global ``random`` (uniform in [0, 60] s here): seeded,
    # the first wait is 57.4 s, so an uninterruptible sleep cannot pass the bound below on
    # any host, and a signal at 0.3 s passes it however loaded the host.
    state = random.getstate()
    random.seed(2)
    # Python's own SIGINT handler, whatever this test run started with (a shell running
    # the suite in the background gives it SIGINT ignored, and the signal would be lost).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            patient.call(always_transient)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
        random.setstate(state)
    assert len(calls) == 1
    assert time.monotonic() - started < 30, "the signal waited for the 57 s backoff"


# -- a reverse proxy in front of moto that can rewrite one answer (support.s3proxy) --------------


@contextlib.contextmanager
def proxied_backend(s3_server, bucket: str, rewrite=None, intercept=None):
    proxy = S3Proxy(s3_server.endpoint_url, rewrite=rewrite, intercept=intercept)
    backend = S3Backend("proxied", bucket, "zbak", endpoint_url=proxy.url,
                        region=s3_server.region, part_size=PART, concurrency=1, retry=FAST)
    try:
        yield backend, proxy
    finally:
        backend.close()
        proxy.close()


ERROR_200 = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
             b"<Message>We encountered an internal error. Please try again.</Message>"
             b"<RequestId>4442587FB7D0A2F9</RequestId></Error>")


@pytest.mark.s3
def test_a_200_complete_answer_carrying_an_error_on_the_wire_fails_the_put_and_aborts(
        s3_server, s3_bucket):
    """docs/reliability.md#r15-multipart-edge-cases (C): a proxy in front of moto answers every
    CompleteMultipartUpload itself with HTTP 200 and an ``<Error>`` body, as S3 does when it fails
    after sending the status line (botocore's ``_handle_200_error`` runs on the real answer). The
    put fails after its retries, nothing is visible, and no upload stays open."""
    def complete_fails(method, path):
        return (200, ERROR_200) if method == "POST" and "uploadId=" in path else None

    with proxied_backend(s3_server, s3_bucket, intercept=complete_fails) as (backend, proxy):
        with pytest.raises(StoreTransient, match="InternalError"):
            backend.put("streams/v", [os.urandom(PART), b"tail"])
        completes = [r for r in proxy.requests if r[0] == "POST" and "uploadId=" in r[1]]
        assert len(completes) == FAST.attempts
        with pytest.raises(ObjectNotFound):
            backend.stat("streams/v")
    raw = s3_server.client()
    assert raw.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []


def _stored_volume(backend, key: str) -> VolumeRow:
    digest = Digest()
    backend.put(key, compress_frame([os.urandom(200_000)], 3, digest))
    return VolumeRow(id=1, stream_id=1, index=0, key=key, raw_bytes=digest.raw_bytes,
                     stored_bytes=digest.stored_bytes, sha256=digest.sha256)


@pytest.mark.s3
def test_an_s3_read_damaged_in_transit_once_is_read_again_verified_and_reported(
        s3_server, s3_bucket, tmp_path, caplog):
    """docs/reliability.md#r11-flaky-read (C, S3): the first GET's body arrives with one byte
    flipped (the object in the bucket is intact). botocore's checksum check fails at the end of the
    body (StoreReadCorrupt: transient, and a corrupt read); the verifying fetch reads the volume
    again, succeeds, and warns that the first read failed."""
    flips = []

    def flip_first_get(method, path, status, body):
        if method == "GET" and "vol-" in path and not flips and len(body) > 1000:
            flips.append(path)
            changed = bytearray(body)
            changed[1000] ^= 0x04
            return status, bytes(changed)
        return status, body

    with proxied_backend(s3_server, s3_bucket, flip_first_get) as (backend, proxy):
        volume = _stored_volume(backend, "s/vol-000000.zst")
        with caplog.at_level("WARNING", logger="zrepl_py.restore.fetch"), \
                VolumeFetch(backend, [volume], tmp_path / "spool", 1) as fetch:
            files = fetch.wait_all()
        gets = [r for r in proxy.requests if r[0] == "GET" and "vol-" in r[1]]
    assert flips and len(gets) == 2
    assert hashlib.sha256(files[1].read_bytes()).hexdigest() == volume.sha256
    messages = [r.getMessage() for r in caplog.records]
    assert any("failed verification on the first read" in m and "checksum" in m
               for m in messages), messages
    assert any("verified on the second read" in m for m in messages), messages


@pytest.mark.s3
def test_a_checksum_mismatch_on_get_is_a_store_read_corrupt_error(s3_server, s3_bucket):
    """docs/reliability.md#r11-flaky-read (C, S3) at the store: the damaged read raises
    StoreReadCorrupt while iterating (a StreamCorrupt for verifying readers, a StoreTransient: worth
    reading again), not a permanent store error; the next read is whole."""
    def flip_every_get(method, path, status, body):
        if method == "GET" and path.endswith("/obj") and len(body) > 10:
            changed = bytearray(body)
            changed[10] ^= 0x01
            return status, bytes(changed)
        return status, body

    data = os.urandom(100_000)
    with proxied_backend(s3_server, s3_bucket, flip_every_get) as (backend, _):
        backend.put("obj", [data])
        with pytest.raises(StoreReadCorrupt) as caught:
            b"".join(backend.get("obj"))
    assert isinstance(caught.value, StreamCorrupt) and isinstance(caught.value, StoreTransient)
    assert "did not match calculated checksum" in str(caught.value)
    direct = S3Backend("direct", s3_bucket, "zbak", endpoint_url=s3_server.endpoint_url,
                       region=s3_server.region, retry=FAST)
    assert b"".join(direct.get("obj")) == data
    direct.close()


# -- Z on zfs-fuse over a real sshd: restart after a kill (1), a full target pool (5) ----------


def _zfs(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["zfs", *args], capture_output=True, text=True, timeout=120,
                          check=check)


def _guids(dataset: str) -> dict[str, int]:
    done = _zfs("get", "-Hp", "-r", "-o", "name,value", "guid", dataset, check=False)
    return {line.split("\t")[0].split("@", 1)[1]: int(line.split("\t")[1])
            for line in done.stdout.splitlines() if line.startswith(dataset + "@")}


def _tree_hashes(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every regular file under ``root``."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


class FuseRig:
    """A source pool, a small backup pool, and a config pushing SRC/data to
    backup:BAK/replica over the session's sshd (zbak's usual remote target)."""

    def __init__(self, make_pool, sshd, tmp_path, *, bak_size: str = "512M",
                 rate: int | None = None):
        from support.common import hosts_table

        self.src, self.bak = make_pool(), make_pool(bak_size)
        self.data, self.replica = f"{self.src.name}/data", f"{self.bak.name}/replica"
        self.mount = self.src.mountpoint / "data"
        _zfs("create", self.data)
        self.config = tmp_path / "zbak.toml"
        limit = f"bandwidth_limit = {rate}\n" if rate else ""
        self.config.write_text(
            f'state_dir = "{tmp_path / "state"}"\n'
            + hosts_table("backup", sshd.host_config(), connect_timeout=10)
            + textwrap.dedent(f"""
                [jobs.j]
                dataset = "{self.data}"
                [jobs.j.replicate]
                targets = ["backup:{self.replica}"]
            """) + limit)
        assert self("init", "--no-checks")[0] == ExitStatus.OK

    def __call__(self, *args: str) -> Ran:
        return run_zbak("--config", str(self.config), *args)

    def replicate(self) -> tuple[int, str, str]:
        return self("replicate", "--json")

    def last_replicate_result(self) -> str:
        status, out, err = self("status", "--json")
        assert status == ExitStatus.OK, out + err
        runs = [r for r in json.loads(out)[0]["last_runs"] if r["action"] == "replicate"]
        return runs[0]["result"]

    def replica_files(self) -> dict[str, str]:
        """Mount the (``receive -u``) replica and hash its files."""
        if _zfs("get", "-H", "-o", "value", "mounted", self.replica).stdout.strip() != "yes":
            _zfs("mount", self.replica)
        where = Path(_zfs("get", "-H", "-o", "value", "mountpoint", self.replica).stdout.strip())
        return _tree_hashes(where)


@pytest.mark.zfs
@pytest.mark.ssh
def test_a_full_send_killed_mid_stream_is_restarted_on_zfs_fuse_and_the_files_match(
        make_pool, sshd, tmp_path):
    """docs/reliability.md#r1-interrupted-full-send-resumes (Z/S, zfs-fuse: no resume tokens, so
    restart): the source's ``zfs send`` is SIGKILLed after bytes went through the rate-limited pipe
    to sshd; zbak exits 1, no partial replica is left, and the next run sends the full again: same
    GUIDs and the same file contents by SHA-256."""

    rig = FuseRig(make_pool, sshd, tmp_path, rate=300_000)
    (rig.mount / "big.bin").write_bytes(os.urandom(2_500_000))
    (rig.mount / "dir").mkdir()
    (rig.mount / "dir" / "small").write_bytes(os.urandom(10_000))
    _zfs("snapshot", f"{rig.data}@s1")
    source = _tree_hashes(rig.mount)

    proc = start_zbak("--config", str(rig.config), "replicate", text=True)
    try:
        sender = None
        deadline = time.monotonic() + 30
        while sender is None and time.monotonic() < deadline:
            # zfs-fuse's zfs rewrites its argv to "zfs send POOL/data s1"
            found = subprocess.run(["pgrep", "-f", f"^zfs send {rig.data}"],
                                   capture_output=True, text=True)
            sender = int(found.stdout.split()[0]) if found.stdout.strip() else None
            time.sleep(0.1)
        assert sender is not None, "the sender never started"
        wait_for_bytes(rig.config.parent / "state", "replicate", proc)  # mid-stream
        os.kill(sender, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitStatus.FAILED, out + err
    assert _guids(rig.replica) == {}, "no half-received snapshot"
    assert rig.last_replicate_result() == "failed"

    status, out, err = rig.replicate()
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["rows"][0]["plan"] == "full s1"
    assert _guids(rig.replica) == _guids(rig.data)
    assert rig.replica_files() == source


@pytest.mark.zfs
@pytest.mark.ssh
def test_a_target_pool_filled_up_fails_the_run_records_no_success_and_the_run_completes_once_freed(
        make_pool, sshd, tmp_path):
    """docs/reliability.md#r5-target-full-during-receive (Z, zfs-fuse): ``dd`` leaves about 1 MiB
    free in the target pool, the snapshot needs 4 MB. The receive fails with "out of space", zbak
    exits 1 naming the receiving stage, the earlier replicated snapshot and its data stay, no
    half-received snapshot appears, and the catalog records the run as failed with the cursor
    unmoved. With the filler removed, the next run completes the transfer."""
    rig = FuseRig(make_pool, sshd, tmp_path, bak_size="128M")
    (rig.mount / "a").write_bytes(os.urandom(100_000))
    _zfs("snapshot", f"{rig.data}@s1")
    status, out, err = rig.replicate()
    assert status == ExitStatus.OK, out + err
    (rig.mount / "big").write_bytes(os.urandom(4 * MiB))
    _zfs("snapshot", f"{rig.data}@s2")

    _zfs("create", "-o", "compression=off", f"{rig.bak.name}/filler")
    filler = rig.bak.mountpoint / "filler" / "dd.bin"
    dd = subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "status=none"],
                        capture_output=True, text=True, timeout=300)
    assert "No space left on device" in dd.stderr, dd.stderr
    os.truncate(filler, filler.stat().st_size - MiB)  # about 1 MiB free again
    _zfs("snapshot", f"{rig.bak.name}@sync")  # a txg sync: "available" is current now
    left = int(_zfs("get", "-Hp", "-o", "value", "available", rig.bak.name).stdout)
    assert left < 3 * MiB, left

    status, out, err = rig.replicate()
    assert status == ExitStatus.FAILED, out + err
    assert "out of space" in err and "receive" in err, err
    assert list(_guids(rig.replica)) == ["s1"], "s1 kept, nothing half-received"
    assert rig.last_replicate_result() == "failed"
    status, out, _ = rig("status", "--json")
    (target,) = json.loads(out)[0]["targets"]
    assert target["cursor"] == "s1"

    _zfs("destroy", f"{rig.bak.name}@sync")
    for _ in range(50):  # zfs-fuse: "dataset is busy" for a moment after use
        if _zfs("destroy", f"{rig.bak.name}/filler", check=False).returncode == 0:
            break
        time.sleep(0.2)
    _zfs("snapshot", f"{rig.bak.name}@sync")  # a txg sync: the freed space is usable now
    _zfs("destroy", f"{rig.bak.name}@sync")
    status, out, err = rig.replicate()
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["rows"][0]["plan"] == "incremental -I s1 -> s2"
    assert _guids(rig.replica) == _guids(rig.data)
    assert rig.replica_files() == _tree_hashes(rig.mount)


# -- Z on real OpenZFS 2.3 (the QEMU guest): tokens (1, 2, 4) and a full target pool (5) ----------


@pytest.fixture
def vm_rig(openzfs_vm, openzfs_executor, openzfs_pools, tmp_path, capsys):
    """tests/e2e/test_replicate_openzfs.py's Rig: ``vm:SRC/data`` replicated to
    ``vm:DST/replica`` by ``zbak replicate`` on this host, both pools in the guest."""
    from e2e.test_replicate_openzfs import Rig

    rig = Rig(openzfs_vm, openzfs_executor, openzfs_pools, tmp_path, capsys)
    rig.guest("zfs", "create", rig.data)
    assert rig("init", "--no-checks")[0] == ExitStatus.OK
    rig.pools = openzfs_pools
    return rig


def _guest_hashes(rig, directory: str) -> dict[str, str]:
    """``{path relative to directory: sha256}`` of every file under it, hashed in the guest."""
    text = rig.guest("find", directory, "-type", "f", "-exec", "sha256sum", "{}", "+")
    found = {}
    for line in text.splitlines():
        digest, path = line.split("  ", 1)
        found[path.removeprefix(directory + "/")] = digest
    return found


def test_interrupted_full_and_incremental_sends_resume_by_token_and_every_snapshot_has_the_same_files(
        vm_rig):
    """docs/reliability.md#r1-interrupted-full-send-resumes and
    docs/reliability.md#r2-interrupted-incremental-i-resumes (Z, OpenZFS, over OpenSSH): the guest's
    ``zfs send`` is killed mid-stream under a rate limit, once during the full and once during the
    ``-I``; each rerun resumes with ``zfs send -t`` ("resume ..." in the plan) and, at the end,
    every snapshot of the replica has the source's GUID and, file by file, its SHA-256."""
    from e2e.test_replicate_openzfs import BIG_MIB

    rig = vm_rig
    rig.write("big.bin", BIG_MIB)
    rig.write("small.bin", 0.1)
    rig.snapshot("s1")
    rig.interrupted_replicate()
    assert rig.token() not in ("", "-")
    assert rig.replicate() == "resume s1"

    rig.write("big2.bin", BIG_MIB)
    rig.snapshot("s2")
    rig.write("small.bin", 0.2)  # rewritten: s3 differs from s2 in an existing file
    rig.snapshot("s3")
    rig.interrupted_replicate()
    assert rig.token() not in ("", "-")
    assert rig.replicate() == "resume s2; incremental -I s2 -> s3"
    assert rig.token() == "-"
    assert rig.guids(rig.replica) == rig.guids(rig.data)

    rig.guest("zfs", "mount", rig.replica)
    for snap in ("s1", "s2", "s3"):
        source = _guest_hashes(rig, f"/{rig.data}/.zfs/snapshot/{snap}")
        replica = _guest_hashes(rig, f"/{rig.replica}/.zfs/snapshot/{snap}")
        assert source and replica == source, snap


def test_a_resume_token_left_by_another_filesystem_is_aborted_never_resumed(vm_rig):
    """docs/reliability.md#r4-token-for-another-operation-is-rejected (Z/E, OpenZFS): a real token
    on the target, left by an interrupted full of ``SRC/data``, and a job that now replicates
    ``SRC/other`` into the same target: zbak sees the token's ``toname`` belongs to another
    filesystem, aborts the partial receive (``zfs receive -A``) and sends ``other`` in full; no
    ``zfs send -t`` of the foreign token is run."""
    from e2e.test_replicate_openzfs import BIG_MIB

    rig = vm_rig
    rig.write("big.bin", BIG_MIB)
    rig.snapshot("s1")
    rig.interrupted_replicate()
    assert rig.token() not in ("", "-")

    other = f"{rig.pools.source}/other"
    rig.guest("zfs", "create", other)
    rig.guest("dd", "if=/dev/urandom", f"of=/{other}/f", "bs=64K", "count=2", "status=none")
    rig.guest("zfs", "snapshot", f"{other}@o1")
    rig.data = other  # the same job, pointed at another dataset, same target
    rig.write_config()
    status, out, err = rig("--debug", "replicate", "--json")
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["rows"][0]["plan"] == "abortresume; full o1", out
    assert "send -t" not in err and "zfs send -t" not in err
    assert rig.token() == "-"
    assert rig.guids(rig.replica) == rig.guids(other)


def test_a_target_pool_filled_during_receive_keeps_the_token_records_failure_and_resumes_once_freed(
        vm_rig):
    """docs/reliability.md#r5-target-full-during-receive (Z, OpenZFS): ``dd`` fills the target pool
    up to 2 MiB; the 6 MiB incremental fails with "out of space": zbak exits 1, the replica keeps
    its last snapshot and a ``receive_resume_token`` (the partial state), the catalog records the
    run as failed and the cursor unmoved. After the filler is removed the next run resumes from
    the token."""
    from e2e.test_replicate_openzfs import BIG_MIB

    rig = vm_rig
    rig.write("a.bin", 0.1)
    rig.snapshot("s1")
    assert rig.replicate() == "full s1"
    rig.write("big.bin", BIG_MIB)
    rig.snapshot("s2")

    filler = f"{rig.pools.target}/filler"
    rig.guest("zfs", "create", "-o", "compression=off", filler)
    # Freeing space on a full ZFS pool fails too (copy-on-write: truncate needs space), so
    # the filler stops 2 MiB short of the space available.
    free = int(rig.guest("zfs", "get", "-Hp", "-o", "value", "available", filler))
    rig.guest("dd", "if=/dev/zero", f"of=/{filler}/dd.bin", "bs=1M",
              f"count={free // MiB - 2}", "status=none")
    rig.guest("zpool", "sync", rig.pools.target)
    left = int(rig.guest("zfs", "get", "-Hp", "-o", "value", "available", filler))
    assert left < 4 * MiB, left

    status, out, err = rig("replicate", "--json")
    assert status == ExitStatus.FAILED, out + err
    assert "out of space" in err and "receive" in err, err
    assert list(rig.guids(rig.replica)) == ["s1"]
    assert rig.token() not in ("", "-"), "the partial receive is kept, resumable"
    status, out, _ = rig("status", "--json")
    doc = json.loads(out)[0]
    assert [r["result"] for r in doc["last_runs"] if r["action"] == "replicate"][0] == "failed"
    assert doc["targets"][0]["cursor"] == "s1"

    rig.guest("zfs", "destroy", filler)
    rig.guest("zpool", "sync", rig.pools.target)
    assert rig.replicate() == "resume s2"
    assert rig.guids(rig.replica) == rig.guids(rig.data)
    assert rig.token() == "-"
