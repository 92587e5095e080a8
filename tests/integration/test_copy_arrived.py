"""What a resumed ``zbak copy`` trusts of a volume already in the target
(``copying.stream.arrived``; docs/decisions.md#a-copy-checks-each-volume-on-arrival-and-resumes-by-checking-what-arrived),
against moto's S3 server: the SHA-256 S3 keeps for an object put whole, the bytes read back for a
multipart one, and nothing for a multipart object in a cold class, which cannot be read back."""

from __future__ import annotations

import hashlib
import os

import pytest

from zrepl_py.catalog.rows import VolumeRow
from zrepl_py.copying.stream import arrived
from zrepl_py.stores.retry import RetryPolicy
from zrepl_py.stores.s3 import S3Backend

MiB = 1024 * 1024


@pytest.fixture
def store(s3_server, s3_bucket):
    """A store with S3's smallest part size: 6 MiB go up as a multipart upload."""
    backend = S3Backend("b", s3_bucket, "zbak", endpoint_url=s3_server.endpoint_url,
                        region=s3_server.region, part_size=5 * MiB, concurrency=2,
                        retry=RetryPolicy(attempts=2, initial_wait=0.01, max_wait=0.02))
    yield backend
    backend.close()


def row(key: str, data: bytes) -> VolumeRow:
    return VolumeRow(1, 1, 0, key, len(data), len(data), hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("size", [MiB, 6 * MiB], ids=["one PutObject", "multipart"])
def test_a_volume_is_kept_only_with_the_catalogs_size_and_sha256(store, size):
    data = os.urandom(size)
    assert not arrived(store, row("v", data))  # not there
    store.put("v", [data])
    assert arrived(store, row("v", data))
    other = data[:-1] + bytes([data[-1] ^ 1])
    assert not arrived(store, row("v", other))  # the same size, other bytes
    assert not arrived(store, row("v", data + b"x"))


def test_a_multipart_volume_in_a_cold_class_is_put_again_not_read(store):
    data = os.urandom(6 * MiB)
    store.put("v", [data], storage_class="DEEP_ARCHIVE")
    assert store.stat("v").sha256 is None and not store.stat("v").readable
    assert not arrived(store, row("v", data))  # no NeedsThaw raised


def test_copy_within_copies_up_to_the_single_copy_limit_and_leaves_larger_objects_alone(
        store, s3_server, s3_bucket, monkeypatch):
    """``S3Backend.copy_within`` against moto: up to CopyObject's limit (5 GiB, lowered here
    to 1 MiB) the object is copied and S3's full-object SHA-256 returned; beyond it nothing is
    asked of S3 and None says the caller must stream it (docs/copies.md#s3-to-s3-inside-s3)."""
    monkeypatch.setattr("zrepl_py.stores.s3.MAX_COPY_SIZE", MiB)
    target = S3Backend("c", s3_bucket, "copy", endpoint_url=s3_server.endpoint_url,
                       region=s3_server.region)
    try:
        small, large = os.urandom(MiB), os.urandom(MiB + 1)
        store.put("small", [small])
        store.put("large", [large])
        copied = target.copy_within(store, "small")
        assert copied is not None
        assert (copied.size, copied.sha256) == (MiB, hashlib.sha256(small).hexdigest())
        assert target.copy_within(store, "large") is None
        assert [o.key for o in target.list()] == ["small"]
    finally:
        target.close()
