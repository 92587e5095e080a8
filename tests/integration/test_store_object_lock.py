"""S3 Object Lock (``[stores.NAME.object_lock]``) on moto's server: every version the store
writes, in one PutObject or a multipart upload, is locked until now + period with the mode
the config names, and the master's own keys cannot delete it; without the lock they can.
Config mistakes are refused naming the key (docs/design.md#object-lock)."""

from __future__ import annotations

import datetime as dt
import uuid

import botocore.exceptions
import pytest

from zrepl_py.config.loading import parse_config
from zrepl_py.errors import ConfigError, ObjectNotFound, StoreNotLockable, StorePermanent
from zrepl_py.stores.registry import open_store

MiB = 1 << 20


@pytest.fixture
def lock_bucket(s3_server, s3_bucket):
    """A bucket created with Object Lock (so versioned); the AWS_* env of ``s3_bucket``."""
    name = f"zbak-lock-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
    return name


def _store(s3_server, bucket: str, lock: dict | None):
    table: dict = {"url": f"s3://{bucket}/z", "endpoint": s3_server.endpoint_url,
                   "region": s3_server.region}
    if lock is not None:
        table["object_lock"] = lock
    return open_store("cold", parse_config({"stores": {"cold": table}}, "zbak.toml")
                      .stores["cold"])


def _put_both(store) -> dict:
    """One PutObject and one multipart upload (17 MiB: three parts of 8 MiB); their results."""
    try:
        return {"small": store.put("small", [b"manifest"]),
                "large": store.put("large", [bytes(MiB)] * 17)}
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["compliance", "governance"])
def test_every_version_put_whole_or_in_parts_is_locked_for_the_period(
        s3_server, lock_bucket, mode):
    before = dt.datetime.now(dt.UTC)
    results = _put_both(_store(s3_server, lock_bucket, {"mode": mode, "period": "2d"}))
    after = dt.datetime.now(dt.UTC)
    client = s3_server.client()
    assert "-" in client.head_object(Bucket=lock_bucket, Key="z/large")["ETag"]  # multipart
    for key, result in results.items():
        assert result.version_id, key
        # HeadObject of the version: moto 5.2.5's GetObjectRetention answers HTTP 500.
        head = client.head_object(Bucket=lock_bucket, Key=f"z/{key}",
                                  VersionId=result.version_id)
        assert head["ObjectLockMode"] == mode.upper(), key
        until = head["ObjectLockRetainUntilDate"]
        assert until == result.retain_until, key
        assert before + dt.timedelta(days=2) <= until <= after + dt.timedelta(days=2, seconds=1)


@pytest.mark.parametrize("lock", [{"mode": "compliance", "period": "1d"}, None],
                         ids=["locked", "unlocked"])
def test_the_masters_keys_cannot_delete_a_locked_version_and_can_an_unlocked_one(
        s3_server, lock_bucket, lock):
    """The intruder holds the keys the master holds (moto's test keys) and deletes each
    version by id: moto enforces the lock against that. Without ``object_lock`` on the
    same bucket (no default retention) the deletes succeed: the attack the lock stops."""
    results = _put_both(_store(s3_server, lock_bucket, lock))
    client = s3_server.client()
    for key, result in results.items():
        delete = {"Bucket": lock_bucket, "Key": f"z/{key}", "VersionId": result.version_id}
        if lock is None:
            client.delete_object(**delete)
            continue
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            client.delete_object(**delete)
        assert refused.value.response["Error"]["Code"] == "AccessDenied", key
    versions = client.list_object_versions(Bucket=lock_bucket).get("Versions", [])
    assert len(versions) == (0 if lock is None else 2)


def test_a_put_to_an_unversioned_bucket_is_refused_as_not_lockable(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket, {"mode": "compliance", "period": "1d"})
    try:
        with pytest.raises(StoreNotLockable, match="no version id"):
            store.put("small", [b"manifest"])
    finally:
        store.close()


@pytest.mark.parametrize(("lock", "says"), [
    ({"mode": "strict", "period": "1d"}, "stores.cold.object_lock.mode"),
    ({"mode": "compliance", "period": "0s"}, "stores.cold.object_lock.period"),
    ({"mode": "compliance"}, "stores.cold.object_lock.period"),
    ({"mode": "compliance", "period": "1d", "days": 3}, "stores.cold.object_lock.days"),
])
def test_a_wrong_lock_setting_is_refused_naming_the_key_and_the_file(lock, says):
    with pytest.raises(ConfigError) as caught:
        parse_config({"stores": {"cold": {"url": "s3://bucket/p", "object_lock": lock}}},
                     "zbak.toml")
    assert says in str(caught.value) and "zbak.toml" in str(caught.value)


def test_a_lock_on_a_directory_store_is_refused_as_an_s3_key():
    with pytest.raises(ConfigError, match="object_lock applies to s3:// stores only"):
        parse_config({"stores": {"cold": {"url": "file:///srv/cold", "object_lock": {
            "mode": "compliance", "period": "1d"}}}}, "zbak.toml")


def test_a_version_reads_back_the_bytes_zbak_wrote_after_an_overwrite_and_a_delete_marker(
        s3_server, lock_bucket, tmp_path):
    store = _store(s3_server, lock_bucket, {"mode": "governance", "period": "1d"})
    try:
        first = store.put("vol", [b"zbak's bytes"])
        client = s3_server.client()
        client.put_object(Bucket=lock_bucket, Key="z/vol", Body=b"an intruder's")
        client.delete_object(Bucket=lock_bucket, Key="z/vol")  # a delete marker on top
        assert b"".join(store.get_version("vol", first.version_id)) == b"zbak's bytes"
        assert store.stat_version("vol", first.version_id).size == len(b"zbak's bytes")
        with pytest.raises(ObjectNotFound):
            store.stat_version("vol", "no-such-version")
        with pytest.raises(ObjectNotFound):
            store.get_version("vol", "no-such-version")
    finally:
        store.close()
    directory = open_store("dir", parse_config(
        {"stores": {"dir": {"url": f"file://{tmp_path}"}}}, "zbak.toml").stores["dir"])
    with pytest.raises(StorePermanent, match="keeps no object versions"):
        directory.get_version("vol", first.version_id)
