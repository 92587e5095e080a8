"""Prune's re-check of a releasing chain (pruning/recheck.py,
docs/decisions.md#the-releasing-chain-is-rechecked-before-any-delete) on real stores: a
``file://`` directory and moto's S3 server, with a real SQLite catalog.

What each store can tell without a thaw: a STANDARD object is read back and hashed; a
GLACIER one only answers HEAD, so there the size and S3's stored SHA-256 must catch a change.
"""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest

from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import NewStream, NewVolume
from zrepl_py.objects.layout import MANIFEST
from zrepl_py.pruning.recheck import copy_problem, recheck_chain
from zrepl_py.stores.file import FileBackend
from zrepl_py.stores.s3 import S3Backend

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
PREFIX = "local/tank/data/full-1/"
VOLUMES = [b"first volume " * 1000, b"second volume " * 1000]


@pytest.fixture
def file_store(tmp_path):
    (tmp_path / "store").mkdir()
    return FileBackend("files", tmp_path / "store")


@pytest.fixture
def s3_store(s3_server, s3_bucket):
    backend = S3Backend("s3", s3_bucket, "zbak", endpoint_url=s3_server.endpoint_url,
                        region=s3_server.region)
    yield backend
    backend.close()


def archived_full(store, catalog: Catalog, storage_class: str = "STANDARD",
                  state: str = "verified"):
    """A full stream of two volumes and a manifest in ``store``, catalogued; its StreamRow."""
    volumes = []
    for index, body in enumerate(VOLUMES):
        key = f"{PREFIX}vol-{index:06d}.zst"
        put = store.put(key, [body], storage_class=storage_class)
        volumes.append(NewVolume(index, key, len(body), put.size, put.sha256))
    store.put(PREFIX + MANIFEST, [b"{}"])
    stream_id = catalog.add_stream(NewStream(
        dataset="tank/data", store=store.name, kind="full", to_guid=7, to_name="10",
        to_createtxg=100, object_prefix=PREFIX, storage_class=storage_class,
        compression="zstd", created_at=T0, state=state,
        verified_at=T0 if state == "verified" else None), volumes)
    return catalog.stream(stream_id)


def flipped(body: bytes) -> bytes:
    return body[:100] + bytes([body[100] ^ 0x20]) + body[101:]


@pytest.mark.parametrize("which", ["file", "s3"])
def test_an_intact_chain_passes_with_every_volume_re_read(which, request, catalog):
    store = request.getfixturevalue(f"{which}_store")
    full = archived_full(store, catalog)
    check = recheck_chain(store, catalog, [full])
    assert check.ok and (check.objects, check.reread) == (3, 2)
    assert check.summary() == "ok (3 objects, 2 re-read)"


def test_a_flipped_byte_in_a_file_store_is_found_by_the_re_read(file_store, catalog):
    full = archived_full(file_store, catalog)
    path = file_store.root / PREFIX / "vol-000001.zst"
    path.write_bytes(flipped(path.read_bytes()))
    check = recheck_chain(file_store, catalog, [full])
    assert check.bad_streams == [full.id]
    (mismatch,) = check.mismatches
    assert mismatch.key == f"{PREFIX}vol-000001.zst" and mismatch.problem.startswith("re-read")


def test_a_missing_volume_or_manifest_is_a_mismatch(file_store, catalog):
    full = archived_full(file_store, catalog)
    file_store.delete(f"{PREFIX}vol-000000.zst")
    file_store.delete(PREFIX + MANIFEST)
    check = recheck_chain(file_store, catalog, [full])
    assert [(m.key, m.problem) for m in check.mismatches] == [
        (f"{PREFIX}vol-000000.zst", "missing"), (PREFIX + MANIFEST, "manifest missing")]


def test_a_stream_still_uploading_has_no_manifest_yet_and_that_is_no_mismatch(file_store,
                                                                              catalog):
    full = archived_full(file_store, catalog, state="uploading")
    file_store.delete(PREFIX + MANIFEST)
    check = recheck_chain(file_store, catalog, [full])
    assert check.ok and (check.objects, check.reread) == (2, 2)


def test_a_copy_relied_on_is_sound_until_its_row_or_an_object_changes(file_store, catalog):
    """``copy_problem`` (docs/decisions.md#a-copy-relied-on-is-rechecked-at-delete-time): the
    catalog row read again, each volume HEADed with its size, the manifest present."""
    copy = archived_full(file_store, catalog, state="uploaded")
    assert copy_problem(file_store, catalog, copy) is None
    volume = file_store.root / PREFIX / "vol-000001.zst"
    volume.write_bytes(volume.read_bytes()[:-1])
    assert copy_problem(file_store, catalog, copy) == (
        f"{PREFIX}vol-000001.zst: the store has {len(VOLUMES[1]) - 1} bytes, the catalog says"
        f" {len(VOLUMES[1])}")
    file_store.put(f"{PREFIX}vol-000001.zst", [VOLUMES[1]])
    file_store.delete(PREFIX + MANIFEST)
    assert copy_problem(file_store, catalog, copy) == f"{PREFIX}{MANIFEST}: missing"
    file_store.put(PREFIX + MANIFEST, [b"{}"])
    assert copy_problem(file_store, catalog, copy) is None
    catalog.set_stream_state(copy.id, "bad", T0, reason="audit: vol-000000 unreadable")
    assert copy_problem(file_store, catalog, copy) == (
        f"stream {copy.id} is bad (audit: vol-000000 unreadable)")


@pytest.mark.s3
def test_a_glacier_object_is_never_read_but_s3s_stored_sha256_catches_a_change(
        s3_store, s3_server, s3_bucket, catalog):
    """A cold object would need a thaw to be read: the HEAD checks alone must find it."""
    full = archived_full(s3_store, catalog, "GLACIER")
    key = f"{PREFIX}vol-000000.zst"
    changed = flipped(VOLUMES[0])
    s3_server.client().put_object(Bucket=s3_bucket, Key=f"zbak/{key}", Body=changed,
                                  StorageClass="GLACIER", ChecksumAlgorithm="SHA256")
    check = recheck_chain(s3_store, catalog, [full])
    assert check.reread == 0
    (mismatch,) = check.mismatches
    assert mismatch.key == key and mismatch.problem == (
        f"the store's checksum is sha256 {hashlib.sha256(changed).hexdigest()[:16]}..., the"
        f" catalog says {hashlib.sha256(VOLUMES[0]).hexdigest()[:16]}...")


@pytest.mark.s3
def test_a_glacier_object_of_another_size_is_caught_by_head(s3_store, s3_server, s3_bucket,
                                                             catalog):
    full = archived_full(s3_store, catalog, "GLACIER")
    s3_server.client().put_object(Bucket=s3_bucket, Key=f"zbak/{PREFIX}vol-000001.zst",
                                  Body=VOLUMES[1][:-1], StorageClass="GLACIER")
    check = recheck_chain(s3_store, catalog, [full])
    assert check.reread == 0 and [m.problem for m in check.mismatches] == [
        f"the store has {len(VOLUMES[1]) - 1} bytes, the catalog says {len(VOLUMES[1])}"]
