"""S3 server-side encryption (``[stores.NAME] encryption``) reaches S3: every object zbak
writes, in one PutObject or a multipart upload, reads back from moto's server with the
encryption the config asked for; a key that cannot apply is refused naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.cli import initialised, prop, zfs

from zrepl_py.config.loading import parse_config
from zrepl_py.errors import ConfigError, ExitStatus
from zrepl_py.stores.registry import open_store

MiB = 1 << 20
KEY_ID = "arn:aws:kms:us-east-1:123456789012:key/0b5d3e00-zbak-test"


def _store(s3_server, bucket: str, encryption: dict | None):
    table = {"url": f"s3://{bucket}/sse", "endpoint": s3_server.endpoint_url,
             "region": s3_server.region}
    if encryption is not None:
        table["encryption"] = encryption
    config = parse_config({"stores": {"cold": table}}, "zbak.toml")
    return open_store("cold", config.stores["cold"])


def _encryption(s3_server, bucket: str, key: str) -> dict:
    head = s3_server.client().head_object(Bucket=bucket, Key=f"sse/{key}")
    return {k: head[k] for k in ("ServerSideEncryption", "SSEKMSKeyId") if k in head}


@pytest.mark.parametrize(("encryption", "expected"), [
    ({"sse": "aws:kms", "kms_key_id": KEY_ID},
     {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": KEY_ID}),
    ({"sse": "AES256"}, {"ServerSideEncryption": "AES256"}),
], ids=["sse-kms", "sse-s3"])
def test_objects_put_whole_or_in_parts_read_back_with_the_configured_encryption(
        s3_server, s3_bucket, encryption, expected):
    store = _store(s3_server, s3_bucket, encryption)
    try:
        store.put("small", [b"manifest"])
        # Two parts and more of the default 8 MiB: a multipart upload.
        store.put("large", [bytes(MiB)] * 17)
    finally:
        store.close()
    assert _encryption(s3_server, s3_bucket, "small") == expected
    assert _encryption(s3_server, s3_bucket, "large") == expected


def test_a_store_without_encryption_asks_for_none(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket, None)
    try:
        store.put("plain", [b"x"])
    finally:
        store.close()
    assert _encryption(s3_server, s3_bucket, "plain") == {}


def test_a_kms_key_without_sse_kms_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as caught:
        parse_config({"stores": {"cold": {"url": "s3://bucket/p", "encryption": {
            "sse": "AES256", "kms_key_id": KEY_ID}}}}, "zbak.toml")
    assert "stores.cold.encryption" in str(caught.value)
    assert "kms_key_id needs sse" in str(caught.value)


def test_an_archive_to_an_sse_kms_store_writes_every_object_with_that_key(
        s3_server, s3_bucket, zpool, tmp_path, capsys):
    """As the admin runs it: ``zbak archive`` of a dataset into a store with SSE-KMS; every
    volume, manifest and catalog export it wrote reads back encrypted with the key."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    (Path(prop(data, "mountpoint")) / "f").write_bytes(os.urandom(3 * MiB))
    zfs("snapshot", f"{data}@1")
    run = initialised(tmp_path, f"""
        [stores.cold]
        url = "s3://{s3_bucket}/sse"
        endpoint = "{s3_server.endpoint_url}"
        region = "{s3_server.region}"
        encryption = {{ sse = "aws:kms", kms_key_id = "{KEY_ID}" }}
        [jobs.data]
        dataset = "{data}"
        [jobs.data.archive]
        store = "cold"
    """, capsys)
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    client = s3_server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert any(k.endswith(".zst") for k in keys) and any("_zbak/catalog/" in k for k in keys)
    for key in keys:
        head = client.head_object(Bucket=s3_bucket, Key=key)
        assert (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")) == (
            "aws:kms", KEY_ID), key
