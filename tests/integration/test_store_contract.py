"""One contract suite for every object store (docs/style.md#habits-worth-copying, item 6;
restic's backend test suite).

``TestStoreContract`` holds the behaviour the ``Backend`` docstrings promise and runs it on
every scheme the store registry lists (``stores.registry.SCHEMES``), each on its test bed
(``CONTRACT_BEDS``): ``file`` on a temporary directory, ``s3`` against moto's S3 server over
real HTTP, ``sftp`` against the real sshd with an SFTP-only chrooted user. A registered scheme
without a test bed fails the suite. Backend-specific guarantees (temporary files, multipart
uploads, storage classes, resumed GETs, memory bound) follow in ``TestFileStore`` and
``TestS3Store``; the ``sftp://`` store's in ``tests/integration/test_sftp_store.py``.
``TestSealedStoreContract`` runs the promises about an object's bytes again with age on
(``[stores.NAME.age]``, a volume through the sealed codec chain), on ``file`` and ``s3``, with
what only a sealed store promises.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import blake3
import pyrage
import pytest

from zrepl_py.errors import (
    IdentityNeeded,
    IdentityRefused,
    NeedsThaw,
    ObjectNotFound,
    StorePermanent,
    StoreTransient,
    StreamCorrupt,
)
from zrepl_py.proc.sshconn import SshConnection
from zrepl_py.stores import s3 as s3_module
from zrepl_py.stores.base import PutResult, Thaw
from zrepl_py.stores.file import FileBackend
from zrepl_py.stores.registry import SCHEMES
from zrepl_py.stores.retry import RetryPolicy
from zrepl_py.stores.s3 import S3Backend
from zrepl_py.stores.sftp import SftpBackend
from zrepl_py.streams import age
from zrepl_py.streams.codec import Codec, Sealing
from zrepl_py.streams.frames import Digest

MiB = 1 << 20
PART = 5 * MiB  # S3's (and moto's) smallest part
FAST = RetryPolicy(attempts=3, initial_wait=0.01, max_wait=0.02)
REPO = Path(__file__).resolve().parents[2]


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def chunked(data: bytes, step: int = MiB + 7):
    """A generator of odd-sized chunks: the store never learns the total length up front."""
    for start in range(0, len(data), step):
        yield data[start:start + step]


def failing_after(data: bytes, exc: BaseException):
    yield from chunked(data)
    raise exc


def read_all(store, key: str, chunk_size: int = 1 << 20) -> bytes:
    return b"".join(store.get(key, chunk_size=chunk_size))


@pytest.fixture
def file_store(tmp_path):
    """The ``file`` test bed: a store on an empty temporary directory."""
    root = tmp_path / "store"
    root.mkdir()
    return FileBackend("files", root)


@pytest.fixture
def s3_store(s3_server, s3_bucket):
    """The ``s3`` test bed: a store under a prefix of a fresh bucket of moto's server, with
    S3's smallest part size (so a few MiB make a multipart upload) and quick retries."""
    backend = S3Backend("bucket", s3_bucket, "some/prefix", endpoint_url=s3_server.endpoint_url,
                        region=s3_server.region, part_size=PART, concurrency=2, retry=FAST)
    yield backend
    backend.close()


@pytest.fixture
def sftp_store(sftpd, sftp_dir, tmp_path):
    """The ``sftp`` test bed: a store in a fresh directory of the SFTP-only, chrooted user of
    the session's sshd (``support.sftpd``: ``internal-sftp``, no shell), with S3's smallest
    part size (so a few MiB are written in several parts, two at a time) and quick retries."""
    connection = SshConnection("box", sftpd.host_config(), known_hosts_default=tmp_path / "kh")
    backend = SftpBackend("box", connection, sftp_dir, part_size=PART, concurrency=2,
                          retry=FAST)
    yield backend
    backend.close()


CONTRACT_BEDS = {
    "file": ("file_store", ()),
    "s3": ("s3_store", (pytest.mark.s3,)),
    "sftp": ("sftp_store", (pytest.mark.ssh,)),
}
"""Each registered scheme's test bed: the fixture that gives a fresh, empty store of it, and
the marks of the real components it needs. A new scheme adds its own line here."""


def test_every_registered_scheme_has_a_contract_test_bed():
    """A scheme cannot escape the contract suite: the registry's schemes are the beds'."""
    assert [s.name for s in SCHEMES if s.name not in CONTRACT_BEDS] == []


def _beds() -> list:
    return [pytest.param(s.name, marks=CONTRACT_BEDS.get(s.name, ("", ()))[1], id=s.name)
            for s in SCHEMES]


class TestStoreContract:
    """What every backend guarantees, run on each registered scheme's test bed."""

    @pytest.fixture(params=_beds())
    def store(self, request):
        fixture, _marks = CONTRACT_BEDS[request.param]  # KeyError: a scheme without a bed
        return request.getfixturevalue(fixture)

    def test_probe_of_a_usable_store_says_what_it_found_and_changes_no_object(self, store):
        """``zbak init`` asks each store to probe itself (``Backend.probe``)."""
        store.put("k", [b"x"])
        assert store.probe().strip()
        assert [(i.key, read_all(store, i.key)) for i in store.list()] == [("k", b"x")]

    @pytest.mark.parametrize("size", [0, 1000, PART, 2 * PART + 123],
                             ids=["empty", "small", "exactly-one-part", "multi-part"])
    def test_put_then_get_returns_the_bytes_and_put_reports_their_size_and_sha256(
            self, store, size):
        """docs/reliability.md#r18-zero-length-object."""
        data = payload(size, seed=size)
        result = store.put("streams/obj", chunked(data))
        assert result.size == size
        assert result.sha256 == hashlib.sha256(data).hexdigest()
        assert read_all(store, "streams/obj") == data
        assert store.stat("streams/obj").size == size

    def test_an_object_rewritten_with_other_bytes_of_the_same_size_shows_another_etag(
            self, store):
        """docs/decisions.md#audit-trusts-a-manifest-whose-listing-has-not-changed: the audit trusts
        a manifest whose listing identity (size and etag) is the one it read before, so a rewrite
        with other bytes, even of the same size and within the same second, must change the etag, in
        ``list`` and ``stat`` alike; an untouched object keeps its etag."""
        store.put("a/m", [b"same bytes"])
        store.put("a/other", [b"x"])
        first = {info.key: info for info in store.list("a/")}
        assert first["a/m"].etag and first["a/m"].identity == f"10:{first['a/m'].etag}"
        assert store.stat("a/m").etag == first["a/m"].etag
        store.put("a/m", [b"SAME BYTES"])
        again = {info.key: info for info in store.list("a/")}
        assert again["a/m"].etag != first["a/m"].etag
        assert store.stat("a/m").etag == again["a/m"].etag
        assert again["a/other"].etag == first["a/other"].etag

    def test_get_yields_chunks_no_larger_than_asked(self, store):
        store.put("k", [payload(300_000)])
        sizes = [len(c) for c in store.get("k", chunk_size=64 * 1024)]
        assert sum(sizes) == 300_000 and max(sizes) <= 64 * 1024

    def test_put_replaces_an_existing_object(self, store):
        store.put("k", [b"old"])
        store.put("k", [b"new", b" bytes"])
        assert read_all(store, "k") == b"new bytes"

    def test_a_source_failing_midway_keeps_the_earlier_object_and_raises_its_own_error(self, store):
        """docs/reliability.md#r13-incomplete-upload."""
        store.put("k", [b"old object"])
        with pytest.raises(RuntimeError, match="source broke"):
            store.put("k", failing_after(payload(2 * PART + 1), RuntimeError("source broke")))
        assert read_all(store, "k") == b"old object"

    def test_a_source_failing_midway_leaves_no_object_where_there_was_none(self, store):
        """docs/reliability.md#r13-incomplete-upload."""
        with pytest.raises(RuntimeError):
            store.put("fresh", failing_after(payload(PART + 10), RuntimeError("source broke")))
        with pytest.raises(ObjectNotFound):
            store.stat("fresh")
        assert [i.key for i in store.list()] == []

    def test_get_stat_and_thaw_of_a_missing_key_raise_object_not_found(self, store):
        with pytest.raises(ObjectNotFound) as caught:
            store.get("missing/key")
        assert caught.value.key == "missing/key" and caught.value.store == store.name
        with pytest.raises(ObjectNotFound):
            store.stat("missing/key")
        with pytest.raises(ObjectNotFound):
            store.request_thaw("missing/key", days=1, tier="Bulk")

    def test_delete_removes_the_object_and_deleting_a_missing_key_is_not_an_error(self, store):
        store.put("a/b", [b"x"])
        store.delete("a/b")
        with pytest.raises(ObjectNotFound):
            store.stat("a/b")
        store.delete("a/b")
        store.delete("never/existed")

    def test_list_yields_the_objects_under_a_prefix_in_key_order(self, store):
        for key in ["b/2", "a/10", "a/1", "a.b", "a/0/x", "c"]:
            store.put(key, [key.encode()])
        assert [i.key for i in store.list()] == ["a.b", "a/0/x", "a/1", "a/10", "b/2", "c"]
        assert [i.key for i in store.list("a/")] == ["a/0/x", "a/1", "a/10"]
        assert [i.key for i in store.list("a/1")] == ["a/1", "a/10"]
        assert [i.key for i in store.list("a")] == ["a.b", "a/0/x", "a/1", "a/10"]
        assert list(store.list("zzz/")) == []
        info = next(iter(store.list("c")))
        assert info.size == 1 and info.thaw is Thaw.NOT_NEEDED and info.readable

    def test_sizes_are_the_listed_objects_sizes_for_every_prefix(self, store):
        """``sizes`` (prune's and restore's damage checks) sees exactly what ``list`` does:
        the same keys for each prefix, with their stored bytes."""
        for key in ["b/2", "a/10", "a/1", "a.b", "a/0/x", "c"]:
            store.put(key, [key.encode() * 3])
        for prefix in ("", "a/", "a/1", "a", "zzz/"):
            assert store.sizes(prefix) == {i.key: i.size for i in store.list(prefix)}
        assert store.sizes("a/1") == {"a/1": 9, "a/10": 12}
        with pytest.raises(StorePermanent, match="invalid"):
            store.sizes("/abs")

    def test_list_outside_leaves_out_the_objects_under_the_skipped_directories_only(self, store):
        for key in ["h/t/1/v", "h/t/a/1/v", "h/t/a/b/1/v", "h/t/a b/1/v", "h/t/ab/v", "h/t/x",
                    "h/u/v"]:
            store.put(key, [key.encode()])
        assert [i.key for i in store.list_outside("h/t/", {"h/t/a/"})] == [
            "h/t/1/v", "h/t/a b/1/v", "h/t/ab/v", "h/t/x"]
        assert [i.key for i in store.list_outside("h/t/a/", {"h/t/a/b/"})] == ["h/t/a/1/v"]
        assert [i.key for i in store.list_outside("h/t/", set())] == [
            i.key for i in store.list("h/t/")]
        assert list(store.list_outside("h/t/a/", {"h/t/"})) == []

    def test_stat_reports_size_class_and_an_aware_utc_time(self, store):
        store.put("k", [b"12345"])
        info = store.stat("k")
        assert (info.key, info.size, info.storage_class) == ("k", 5, "STANDARD")
        assert info.modified.utcoffset().total_seconds() == 0
        assert info.thaw is Thaw.NOT_NEEDED and info.thaw_expires is None

    def test_stat_sha256_is_none_or_the_sha256_of_the_stored_bytes(self, store):
        """docs/decisions.md#the-releasing-chain-is-rechecked-before-any-delete: prune's re-check
        compares a stored checksum with the catalog's, so a checksum a store reports must be of the
        bytes, never of anything else."""
        data = payload(1000, seed=3)
        store.put("k", [data])
        assert store.stat("k").sha256 in (None, hashlib.sha256(data).hexdigest())

    def test_a_standard_object_needs_no_thaw(self, store):
        store.put("k", [b"x"])
        assert store.request_thaw("k", days=1, tier="Bulk") is Thaw.NOT_NEEDED

    @pytest.mark.parametrize(
        "key", ["", "/abs", "a/../b", "..", "a//b", "a/", "./a", "a\x00b", "a\nb"])
    def test_invalid_keys_are_rejected_as_permanent_errors(self, store, key):
        with pytest.raises(StorePermanent, match="invalid object key"):
            store.put(key, [b"x"])
        for call in (store.get, store.stat, store.delete):
            with pytest.raises(StorePermanent, match="invalid object key"):
                call(key)

    def test_abort_stale_uploads_never_touches_stored_objects_and_refuses_a_negative_age(
            self, store):
        """docs/reliability.md#r15-multipart-edge-cases (both stores): with nothing unfinished there
        is nothing to remove, whatever the age, and every object stays readable."""
        for key in ("a", "d/b", "d/e/c"):
            store.put(key, [key.encode()])
        assert store.abort_stale_uploads(0) == []
        assert [(i.key, read_all(store, i.key)) for i in store.list()] == [
            ("a", b"a"), ("d/b", b"d/b"), ("d/e/c", b"d/e/c")]
        with pytest.raises(StorePermanent, match="older_than"):
            store.abort_stale_uploads(-1)


SEALED_BEDS = ("file", "s3")
"""The schemes the contract is also run on sealed (``[stores.NAME.age]``): the codec is the
same whatever the store, so the directory and the bucket stand for the rest."""


@pytest.fixture(scope="module")
def age_keys() -> tuple[pyrage.x25519.Identity, pyrage.x25519.Identity]:
    """The store's identity, and another one (of no recipient of the store)."""
    return pyrage.x25519.Identity.generate(), pyrage.x25519.Identity.generate()


def sealed_codec(recipient: pyrage.x25519.Identity, *opening: pyrage.x25519.Identity) -> Codec:
    """The codec of a store sealed to ``recipient``'s public key, as ``stores.sealing``
    makes it: without ``opening`` identities, the archiving host's (it encrypts only)."""
    public = str(recipient.to_public())
    return Codec(sealing=Sealing((public,), tuple(age.recipients([public], "test")),
                                 opening, store="cold"))


def sealed_put(store, codec: Codec, key: str, chunks) -> tuple[PutResult, Digest]:
    """``Backend.put`` of a volume's raw ``chunks`` through ``codec``, as archive stores a
    volume (``archive/volumes.py``)."""
    digest = Digest()
    return store.put(key, codec.encode(chunks, digest)), digest


def opened(store, codec: Codec, key: str) -> bytes:
    """A volume's raw bytes read back through ``codec``, as restore reads them."""
    return b"".join(codec.decode(store.get(key), f"{store.name}:{key}"))


def age_threads() -> set[threading.Thread]:
    """The live helper threads of ``streams.age``."""
    return {t for t in threading.enumerate() if t.name.startswith("zbak-age")}


class TestSealedStoreContract:
    """The contract's promises about an object's bytes with age on (a volume put through
    the sealed codec chain and read back through it, ``streams/codec.py``), on ``file://``
    and S3, and what only a sealed store promises (docs/sealed.md). Listing, stat, delete,
    thaw and keys never see the codec: the contract above covers them on every scheme."""

    @pytest.fixture(params=[pytest.param(name, marks=CONTRACT_BEDS[name][1], id=f"{name}+age")
                            for name in SEALED_BEDS])
    def store(self, request):
        return request.getfixturevalue(CONTRACT_BEDS[request.param][0])

    @pytest.fixture
    def keys(self, age_keys):
        """(the archiving host's codec, a restoring host's codec, a wrong identity's)."""
        mine, other = age_keys
        return (sealed_codec(mine), sealed_codec(mine, mine), sealed_codec(mine, other))

    @pytest.mark.parametrize("size", [0, 1000, PART, 2 * PART + 123],
                             ids=["empty", "small", "exactly-one-part", "multi-part"])
    def test_put_then_get_returns_the_bytes_and_put_reports_the_stored_size_and_sha256(
            self, store, keys, size):
        """What the catalog records of a sealed volume (docs/design.md#codec-chain): the
        size and SHA-256 of the stored (encrypted) bytes, as the store reports them, and the
        raw ones from the codec; the restoring host reads the raw bytes back."""
        writing, reading, _ = keys
        data = payload(size, seed=size)
        result, digest = sealed_put(store, writing, "streams/vol", chunked(data))
        stored = read_all(store, "streams/vol")
        assert stored.startswith(age.MAGIC)
        assert (result.size, result.sha256) == (len(stored), hashlib.sha256(stored).hexdigest())
        assert (digest.stored_bytes, digest.sha256) == (result.size, result.sha256)
        assert store.stat("streams/vol").size == result.size
        assert (digest.raw_bytes, digest.raw_hash) == (size, blake3.blake3(data).hexdigest())
        assert opened(store, reading, "streams/vol") == data

    def test_the_store_holds_no_plaintext_and_no_hash_of_it(self, store, keys):
        """docs/sealed.md#what-a-reader-of-the-store-learns-without-an-identity: neither a
        piece of the raw bytes (random bytes, which zstd stores verbatim) nor their SHA-256
        (hex or binary) is in the stored object or its metadata."""
        writing, _, _ = keys
        data = payload(PART + 1000, seed=7)
        result, digest = sealed_put(store, writing, "streams/vol", chunked(data))
        stored = read_all(store, "streams/vol")
        raw_hash = hashlib.sha256(data)
        for secret in (data[4096:4160], data[-64:], raw_hash.digest(),
                       raw_hash.hexdigest().encode()):
            assert secret not in stored
        assert raw_hash.hexdigest() not in {result.sha256, store.stat("streams/vol").sha256}

    def test_a_source_failing_midway_keeps_the_earlier_object_and_raises_its_own_error(
            self, store, keys):
        """docs/reliability.md#r13-incomplete-upload, with the source read by age's helper
        thread: the source's own exception reaches the caller (not pyrage's text of it), and
        the store keeps what it had (nothing where it had nothing, no upload left open)."""
        writing, reading, _ = keys
        sealed_put(store, writing, "k", [b"old object"])
        for key in ("k", "fresh"):
            with pytest.raises(RuntimeError, match="^source broke$"):
                sealed_put(store, writing, key,
                           failing_after(payload(2 * PART + 1), RuntimeError("source broke")))
        assert opened(store, reading, "k") == b"old object"
        assert [i.key for i in store.list()] == ["k"]
        assert store.unfinished_uploads() == []

    def test_a_reader_that_stops_midway_leaves_no_helper_thread(self, store, keys):
        """A restore stops reading a volume midway when ``zfs receive`` fails: closing the
        decoding generator stops and joins age's helper thread, which would otherwise wait
        on its full queue for ever, holding the store's GET open."""
        writing, reading, _ = keys
        sealed_put(store, writing, "streams/vol", chunked(payload(8 * MiB, seed=3)))
        before = age_threads()
        pieces = reading.decode(store.get("streams/vol"), "cold:streams/vol")
        assert next(pieces)
        assert len(age_threads() - before) == 1
        pieces.close()
        assert age_threads() - before == set()

    def test_a_wrong_or_missing_identity_fails_at_the_header_with_one_line(self, store, keys):
        """docs/sealed.md#what-needs-an-identity: an identity the volume was not encrypted to
        fails before any raw byte comes out, with one line naming the volume; none at all
        fails before the store is read."""
        writing, _, wrong = keys
        sealed_put(store, writing, "streams/vol", chunked(payload(PART, seed=1)))
        pieces = []
        with pytest.raises(IdentityRefused) as refused:
            pieces.extend(wrong.decode(store.get("streams/vol"), f"{store.name}:streams/vol"))
        assert pieces == []
        message = str(refused.value)
        assert "\n" not in message and message.startswith(f"{store.name}:streams/vol: the age"
                                                          " header opens with none of the"
                                                          " identities given")
        with pytest.raises(IdentityNeeded) as needed:
            writing.decode(iter(()), "cold:streams/vol")
        assert "\n" not in str(needed.value)
        assert str(needed.value).startswith("store cold is sealed (age): reading its volumes"
                                            " needs an identity: pass --identity FILE")

    def test_a_changed_stored_byte_fails_the_read_as_a_damaged_volume(self, store, keys):
        """age authenticates every 64 KiB payload chunk: a byte flipped near the end of the
        stored object (written back whole, as an intruder with write access would) fails the
        read with ``StreamCorrupt`` naming the age file, not as a wrong identity
        (docs/decisions.md#sealed-volumes-are-age-files)."""
        writing, reading, _ = keys
        sealed_put(store, writing, "streams/vol", chunked(payload(3 * MiB, seed=2)))
        stored = bytearray(read_all(store, "streams/vol"))
        stored[-100] ^= 0x01
        store.put("streams/vol", [bytes(stored)])
        with pytest.raises(StreamCorrupt, match=f"^{store.name}:streams/vol: the age file"):
            opened(store, reading, "streams/vol")


class TestFileStore:
    @pytest.fixture
    def store(self, file_store):
        return file_store

    def test_temporary_files_are_hidden_from_list_and_removed_after_a_failed_put(self, store):
        (store.root / "d").mkdir()
        (store.root / "d" / ".x.partial-abc123").write_bytes(b"left by a crash")
        with pytest.raises(RuntimeError):
            store.put("d/y", failing_after(payload(100), RuntimeError("boom")))
        assert sorted(os.listdir(store.root / "d")) == [".x.partial-abc123"]
        assert list(store.list()) == [] and store.sizes() == {}

    def test_abort_stale_uploads_removes_only_temporary_files_older_than_the_age(self, store):
        """docs/reliability.md#r15-multipart-edge-cases (file): a crashed put's temporary file older
        than the age is removed and reported under the key it was for; a younger one (a put that may
        still run) and the objects stay."""
        store.put("d/obj", [b"kept"])
        old = store.root / "d" / ".obj.partial-old12345"
        young = store.root / ".top.partial-new12345"
        for path in (old, young):
            path.write_bytes(b"half a volume")
        two_days_ago = time.time() - 2 * 86400
        os.utime(old, (two_days_ago, two_days_ago))
        assert store.abort_stale_uploads(86400) == ["d/obj (temporary file .obj.partial-old12345)"]
        assert not old.exists() and young.exists()
        assert read_all(store, "d/obj") == b"kept"
        assert store.abort_stale_uploads(86400) == []
        assert store.abort_stale_uploads(0) == ["top (temporary file .top.partial-new12345)"]
        assert sorted(p.name for p in store.root.rglob("*") if p.is_file()) == ["obj"]

    def test_a_put_removes_what_an_interrupted_put_of_the_same_key_left_and_nothing_else(
            self, store):
        """A put killed mid-write leaves its temporary file; the next put of the same key
        removes it once its object is written. A temporary file of another key, and one
        of the same key written after this put began (a put running in another process),
        stay (docs/decisions.md#leftover-uploads-of-interrupted-archives)."""
        store.put("d/obj", [b"first"])
        folder = store.root / "d"
        a_minute_ago, in_a_minute = time.time() - 60, time.time() + 60
        for name, when in ((".obj.partial-killed12", a_minute_ago),
                           (".obj.partial-running1", in_a_minute),
                           (".other.partial-killed12", a_minute_ago)):
            (folder / name).write_bytes(b"half a volume")
            os.utime(folder / name, (when, when))
        store.put("d/obj", [b"second"])
        assert sorted(os.listdir(folder)) == [".obj.partial-running1",
                                              ".other.partial-killed12", "obj"]
        assert read_all(store, "d/obj") == b"second"

    def test_unfinished_uploads_name_each_temporary_file_with_its_key_size_and_mtime(
            self, store):
        store.put("d/e/kept", [b"object"])
        (store.root / "d" / ".vol.partial-abc12345").write_bytes(b"x" * 1234)
        (store.root / "d" / "e" / ".vol.partial-def12345").write_bytes(b"y" * 10)
        (store.root / ".top.partial-ghi12345").write_bytes(b"z")
        when = time.time() - 3600
        os.utime(store.root / "d" / ".vol.partial-abc12345", (when, when))
        found = store.unfinished_uploads("d/")
        assert [(u.key, u.ident, u.what, u.size) for u in found] == [
            ("d/e/vol", ".vol.partial-def12345", "temporary file .vol.partial-def12345", 10),
            ("d/vol", ".vol.partial-abc12345", "temporary file .vol.partial-abc12345", 1234)]
        assert abs(found[1].since.timestamp() - when) < 1
        assert [u.key for u in store.unfinished_uploads()] == ["d/e/vol", "d/vol", "top"]
        assert store.unfinished_uploads("d/e/v") == [found[0]]
        assert store.abort_upload(found[1]) and not store.abort_upload(found[1])
        assert [u.key for u in store.unfinished_uploads()] == ["d/e/vol", "top"]
        with pytest.raises(StorePermanent, match="not a temporary file"):
            store.abort_upload(found[0]._replace(ident="kept"))
        assert read_all(store, "d/e/kept") == b"object"

    def test_a_key_shaped_like_a_temporary_file_is_rejected(self, store):
        with pytest.raises(StorePermanent):
            store.put("d/.x.partial-abc123", [b"x"])

    def test_objects_are_files_under_the_root_and_local_path_names_them(self, store):
        store.put("a/b/c", [b"data"])
        assert store.local_path("a/b/c") == store.root / "a/b/c"
        assert (store.root / "a/b/c").read_bytes() == b"data"

    def test_the_storage_class_asked_for_is_accepted_and_stored_as_standard(self, store):
        assert store.put("k", [b"x"], storage_class="DEEP_ARCHIVE").storage_class == "STANDARD"
        assert store.stat("k").storage_class == "STANDARD"
        assert read_all(store, "k") == b"x"

    def test_a_missing_root_is_a_permanent_error_and_is_not_created(self, tmp_path):
        store = FileBackend("files", tmp_path / "unmounted")
        with pytest.raises(StorePermanent, match="does not exist"):
            store.put("k", [b"x"])
        assert not (tmp_path / "unmounted").exists()

    def test_probe_creates_a_missing_root_and_its_parents_private(self, tmp_path):
        """``zbak init`` sets the store up: the one call that creates the root."""
        store = FileBackend("files", tmp_path / "new" / "store")
        assert store.probe() == f"directory {tmp_path / 'new' / 'store'} writable"
        for path in (tmp_path / "new", tmp_path / "new" / "store"):
            assert path.stat().st_mode & 0o777 == 0o700

    def test_probe_refuses_a_root_shared_with_other_users_and_leaves_its_mode(self, tmp_path):
        root = tmp_path / "shared"
        root.mkdir(mode=0o777)
        root.chmod(0o777)
        with pytest.raises(StorePermanent, match="store files: .*shared"):
            FileBackend("files", root).probe()
        assert root.stat().st_mode & 0o777 == 0o777

    def test_probe_names_a_root_it_cannot_create(self, tmp_path):
        (tmp_path / "file").write_bytes(b"")  # a file where a parent directory should be
        with pytest.raises(StorePermanent, match="cannot create directory"):
            FileBackend("files", tmp_path / "file" / "store").probe()

    def test_a_key_clashing_with_a_directory_is_a_permanent_error_not_a_missing_object(self, store):
        store.put("a/b", [b"x"])
        with pytest.raises(StorePermanent):
            store.put("a", [b"y"])
        with pytest.raises(ObjectNotFound):
            store.stat("a")

    def test_a_large_object_written_and_hashed_in_helper_threads_round_trips(self, store):
        """``put`` writes and hashes in two helper threads and starts the disk writes
        every ``WRITEBACK_STEP`` bytes; the object and its SHA-256 are those of the chunks,
        in order, however they are cut."""
        data = payload(40 * MiB + 5, seed=3)
        result = store.put("big", chunked(data, 3 * MiB + 1))
        assert (result.size, result.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert (store.root / "big").read_bytes() == data

    def test_a_write_failing_in_the_writer_thread_leaves_the_old_object_and_no_temporary_file(
            self, store):
        """A real write error (the file-size limit, EFBIG, raised in ``put``'s writer
        thread) is the store's permanent error naming the key; the temporary file is
        removed and the object written before is untouched."""
        import resource
        import signal

        store.put("k", [b"old"])
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (20 * MiB, limit[1]))
        try:
            with pytest.raises(StorePermanent, match="'k'") as failed:
                store.put("k", chunked(payload(40 * MiB)))
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, limit)
            signal.signal(signal.SIGXFSZ, handler)
        assert failed.value.key == "k"
        assert read_all(store, "k") == b"old"
        assert sorted(p.name for p in store.root.iterdir()) == ["k"]

    def test_a_full_disk_is_reported_as_a_permanent_error_naming_the_store(self, store):
        # ENOSPC cannot be provoked without mounting a tiny filesystem; the mapping is pure.
        import errno

        err = store._os_error(OSError(errno.ENOSPC, "No space left on device"), "k", "writing")
        assert isinstance(err, StorePermanent) and "no space left" in str(err)
        assert err.store == "files" and err.key == "k"


class CuttingProxy:
    """A TCP proxy in front of moto that, once armed, forwards ``budget`` more response bytes
    and then cuts that connection: a connection lost in the middle of a GET body."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.budget: int | None = None
        self.cuts = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, response: bool) -> None:
        try:
            while data := src.recv(65536):
                cut = False
                if response:
                    with self.lock:
                        if self.budget is not None:
                            if len(data) >= self.budget:
                                data, cut = data[:self.budget], True
                                self.budget, self.cuts = None, self.cuts + 1
                            else:
                                self.budget -= len(data)
                dst.sendall(data)
                if cut:
                    break
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.server.close()


class TestS3Store:
    @pytest.fixture
    def store(self, s3_store):
        return s3_store

    def test_objects_live_under_the_store_prefix_and_others_are_not_listed(self, store, s3_server):
        raw = s3_server.client()
        raw.put_object(Bucket=store.bucket, Key="elsewhere/x", Body=b"not ours")
        raw.put_object(Bucket=store.bucket, Key="some/prefix/dir/", Body=b"")  # console marker
        store.put("k", [b"ours"])
        assert raw.get_object(Bucket=store.bucket, Key="some/prefix/k")["Body"].read() == b"ours"
        assert [i.key for i in store.list()] == ["k"]

    def test_list_outside_requests_no_key_of_a_skipped_directory(self, store, monkeypatch):
        """An audit's last listing of a job's tree outside its datasets' directories
        (docs/decisions.md#catalog-commands-stay-fast-at-100000-streams): one request for the level holding them, one for the run of keys after them,
        however many objects the datasets hold."""
        datasets = {f"r/d{i}/" for i in range(30)}
        for key in [*(d + f"{n:020d}-full/vol" for d in datasets for n in range(3)), "r/junk",
                    "r/zz/0-full/vol", "r/zz/0-full/manifest.json"]:
            store.put(key, [b"x"])
        requests = []
        op = store._op  # counted in-process (docs/reliability.md#in-process-hooks-kept)
        monkeypatch.setattr(store, "_op", lambda name, *a, **k: requests.append(
            (name, k.get("Delimiter"), k.get("StartAfter"))) or op(name, *a, **k))
        assert [i.key for i in store.list_outside("r/", datasets)] == [
            "r/junk", "r/zz/0-full/manifest.json", "r/zz/0-full/vol"]
        assert [name for name, *_ in requests] == ["list_objects_v2"] * 2
        assert requests[0][1] == "/" and requests[1][2].startswith("some/prefix/r/d9/")
        del requests[:]
        assert [i.key for i in store.list_outside("r/", datasets - {"r/d5/"})] == [
            f"r/d5/{n:020d}-full/vol" for n in range(3)] + ["r/junk", "r/zz/0-full/manifest.json",
                                                           "r/zz/0-full/vol"]
        assert len(requests) == 3

    def test_stat_reports_s3s_stored_sha256_of_a_one_request_object_only(self, store, s3_server):
        """docs/decisions.md#the-releasing-chain-is-rechecked-before-any-delete: HeadObject with
        ChecksumMode gives the whole object's SHA-256 for a PutObject; a multipart object's checksum
        is composite (of the parts): None."""
        small, big = payload(1000, seed=4), payload(2 * PART + 1, seed=5)
        store.put("small", [small])
        store.put("big", chunked(big))
        assert store.stat("small").sha256 == hashlib.sha256(small).hexdigest()
        assert store.stat("big").sha256 is None
        s3_server.client().put_object(Bucket=store.bucket, Key="some/prefix/plain", Body=b"x")
        assert store.stat("plain").sha256 in (None, hashlib.sha256(b"x").hexdigest())

    def test_a_failed_multipart_put_leaves_no_upload_open(self, store, s3_server):
        """docs/reliability.md#r13-incomplete-upload."""
        with pytest.raises(RuntimeError):
            store.put("k", failing_after(payload(3 * PART), RuntimeError("source broke")))
        with pytest.raises(KeyboardInterrupt):
            store.put("k", failing_after(payload(2 * PART), KeyboardInterrupt()))
        uploads = s3_server.client().list_multipart_uploads(Bucket=store.bucket)
        assert uploads.get("Uploads", []) == []

    def test_abort_stale_uploads_aborts_open_multipart_uploads_under_the_prefix_only(
            self, store, s3_server):
        """docs/reliability.md#r15-multipart-edge-cases (S3): an upload left open (as by a process
        killed mid-put) is aborted; uploads outside the store's prefix stay, and stored objects are
        untouched. moto 5.2.5 reports every upload as initiated on 2010-11-10, so the age filter (a
        younger upload is kept) is tested with botocore's Stubber in
        tests/reliability/test_cases_01_18.py."""
        raw = s3_server.client()
        store.put("kept", [b"object"])
        ours = raw.create_multipart_upload(Bucket=store.bucket, Key="some/prefix/streams/v")
        raw.upload_part(Bucket=store.bucket, Key="some/prefix/streams/v", PartNumber=1,
                        UploadId=ours["UploadId"], Body=b"part one")
        theirs = raw.create_multipart_upload(Bucket=store.bucket, Key="elsewhere/v")

        def open_uploads() -> set[str]:
            return {u["UploadId"] for u in
                    raw.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])}

        assert open_uploads() == {ours["UploadId"], theirs["UploadId"]}
        assert store.abort_stale_uploads(86400) == [
            f"streams/v (multipart upload {ours['UploadId']})"]
        assert open_uploads() == {theirs["UploadId"]}
        assert read_all(store, "kept") == b"object"
        assert store.abort_stale_uploads(0) == []

    def test_unfinished_uploads_name_each_open_upload_with_its_key_and_parts_bytes(
            self, store, s3_server):
        raw = s3_server.client()
        opened = {}
        for key, parts in (("streams/a/v", [b"x" * 1000, b"y" * 24]), ("streams/b/v", []),
                           ("other/v", [b"z"])):
            upload = raw.create_multipart_upload(Bucket=store.bucket, Key=f"some/prefix/{key}")
            opened[key] = upload["UploadId"]
            for number, body in enumerate(parts, 1):
                raw.upload_part(Bucket=store.bucket, Key=f"some/prefix/{key}",
                                PartNumber=number, UploadId=upload["UploadId"], Body=body)
        found = store.unfinished_uploads("streams/")
        assert [(u.key, u.ident, u.what, u.size) for u in found] == [
            ("streams/a/v", opened["streams/a/v"], f"multipart upload {opened['streams/a/v']}",
             1024),
            ("streams/b/v", opened["streams/b/v"], f"multipart upload {opened['streams/b/v']}",
             0)]
        assert all(u.since.tzinfo is not None for u in found)
        assert [u.size for u in store.unfinished_uploads("streams/", sizes=False)] == [None, None]
        assert store.abort_upload(found[0]) and not store.abort_upload(found[0])
        assert [u.key for u in store.unfinished_uploads()] == ["other/v", "streams/b/v"]

    def test_more_parts_than_s3_allows_is_refused_before_the_limit_and_the_upload_aborted(
            self, store, s3_server, monkeypatch):
        monkeypatch.setattr(s3_module, "MAX_PARTS", 2)  # 10,000 at test size: see
        # docs/reliability.md#in-process-hooks-kept
        with pytest.raises(StorePermanent, match="more than 2 parts"):
            store.put("k", chunked(payload(2 * PART + 1)))
        uploads = s3_server.client().list_multipart_uploads(Bucket=store.bucket)
        assert uploads.get("Uploads", []) == []
        with pytest.raises(ObjectNotFound):
            store.stat("k")

    @pytest.mark.parametrize("storage_class", ["GLACIER", "DEEP_ARCHIVE"])
    def test_a_cold_object_needs_a_thaw_before_it_can_be_read(self, store, storage_class):
        """docs/reliability.md#r17-glacier."""
        data = payload(2 * PART + 5)
        result = store.put("cold", chunked(data), storage_class=storage_class)
        assert result.storage_class == storage_class
        info = store.stat("cold")
        assert (info.storage_class, info.thaw, info.readable) == (storage_class, Thaw.FROZEN, False)
        assert next(iter(store.list())).thaw is Thaw.FROZEN
        with pytest.raises(NeedsThaw):
            store.get("cold")
        assert store.request_thaw("cold", days=2, tier="Bulk") in (Thaw.THAWING, Thaw.THAWED)
        assert store.request_thaw("cold", days=2, tier="Bulk") in (Thaw.THAWING, Thaw.THAWED)
        info = store.stat("cold")
        assert info.thaw in (Thaw.THAWING, Thaw.THAWED)
        if info.thaw is Thaw.THAWED:  # moto restores at once
            assert info.thaw_expires is not None
            assert info.thaw_expires.utcoffset().total_seconds() == 0
            assert read_all(store, "cold") == data

    def test_an_infrequent_access_object_is_read_directly(self, store):
        store.put("ia", [b"warm enough"], storage_class="STANDARD_IA")
        info = store.stat("ia")
        assert (info.storage_class, info.thaw) == ("STANDARD_IA", Thaw.NOT_NEEDED)
        assert store.request_thaw("ia", days=1, tier="Bulk") is Thaw.NOT_NEEDED
        assert read_all(store, "ia") == b"warm enough"

    def test_an_unknown_storage_class_is_a_permanent_error(self, store):
        with pytest.raises(StorePermanent, match="storage class"):
            store.put("k", [b"x"], storage_class="FROZEN_SOLID")

    def test_a_missing_bucket_is_a_permanent_error(self, s3_server, s3_bucket):
        store = S3Backend("nobucket", "no-such-bucket-zbak", "",
                          endpoint_url=s3_server.endpoint_url, region=s3_server.region,
                          retry=FAST)
        with pytest.raises(StorePermanent, match="does not exist"):
            store.put("k", [b"x"])
        with pytest.raises(StorePermanent, match="does not exist"):
            list(store.list())
        with pytest.raises(StorePermanent, match="bucket 'no-such-bucket-zbak' does not exist"):
            store.probe()

    def test_probe_is_refused_for_a_credential_the_endpoint_does_not_know(
            self, store, monkeypatch):
        """moto's server checks no signature, so this runs against an S3Backend whose
        client signs with nothing: botocore refuses to send the request (no credentials)."""
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name)
        bare = S3Backend("bare", store.bucket, "", endpoint_url=store._client.meta.endpoint_url,
                         region="us-east-1", profile=None, retry=FAST)
        try:
            with pytest.raises(StorePermanent, match="credentials"):
                bare.probe()
        finally:
            bare.close()

    def test_an_unreachable_endpoint_is_a_transient_error_after_the_retries(self, s3_bucket):
        """docs/reliability.md#r16-retry-policy."""
        with socket.create_server(("127.0.0.1", 0)) as probe:
            port = probe.getsockname()[1]  # closed again when the block ends: nobody listens
        store = S3Backend("down", s3_bucket, "", endpoint_url=f"http://127.0.0.1:{port}",
                          region="us-east-1", retry=FAST)
        with pytest.raises(StoreTransient, match="gave up after 3 attempts"):
            store.stat("k")
        with pytest.raises(StoreTransient, match="head_bucket"):
            store.probe()
        with pytest.raises(StoreTransient):
            store.put("k", [b"x"])

    def test_a_connection_lost_mid_get_is_resumed_from_the_last_byte_yielded(
            self, store, s3_server):
        data = payload(2 * MiB + 3)
        store.put("k", [data])
        host, port = s3_server.endpoint_url.removeprefix("http://").split(":")
        proxy = CuttingProxy((host, int(port)))
        via_proxy = S3Backend("proxied", store.bucket, "some/prefix",
                              endpoint_url=f"http://127.0.0.1:{proxy.port}",
                              region=s3_server.region, retry=FAST)
        try:
            proxy.budget = 300 * 1024
            chunks = list(via_proxy.get("k", chunk_size=64 * 1024))
        finally:
            via_proxy.close()
            proxy.close()
        assert proxy.cuts == 1
        assert b"".join(chunks) == data

    def test_a_large_put_keeps_memory_bounded_by_part_size_times_concurrency(
            self, s3_server, s3_bucket):
        # In a child process: moto runs in this one and keeps the uploaded bytes in memory.
        script = f"""
import json, sys, tracemalloc
from zrepl_py.stores.s3 import S3Backend
store = S3Backend("mem", {s3_bucket!r}, "", endpoint_url={s3_server.endpoint_url!r},
                  region="us-east-1", part_size={PART}, concurrency=2)
store.put("warm-up", [b"x"])
block = bytes(range(256)) * 4096
def source():
    for _ in range(160):
        yield block
tracemalloc.start()
result = store.put("big", source())
print(json.dumps({{"peak": tracemalloc.get_traced_memory()[1], "size": result.size}}))
store.delete("big")
"""
        out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                             text=True, timeout=300, check=True).stdout
        measured = json.loads(out)
        assert measured["size"] == 160 * MiB
        # Bound: part_size * (concurrency + 1) = 15 MiB, plus client overhead.
        assert measured["peak"] < 40 * MiB, measured
