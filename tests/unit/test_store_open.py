"""The store registry: config tables to scheme settings and backends; S3 restore headers to
thaw states (pure parts)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from zrepl_py.config.hosts import HostConfig
from zrepl_py.errors import StorePermanent
from zrepl_py.stores.base import Thaw
from zrepl_py.stores.file import FileBackend
from zrepl_py.stores.prune_credential import PruneCredentialBackend
from zrepl_py.stores.registry import SCHEMES, open_store, scheme_for_url, scheme_of
from zrepl_py.stores.s3 import DEFAULT_PART_SIZE, MAX_PARTS, S3Backend, _thaw_state
from zrepl_py.stores.scheme import StoreEnv
from zrepl_py.stores.schemes.file import FileStoreConfig
from zrepl_py.stores.schemes.s3 import S3StoreConfig, inside_s3_refusal
from zrepl_py.stores.schemes.sftp import SftpStoreConfig
from zrepl_py.stores.sftp import SftpBackend

MiB = 1 << 20


def test_a_file_url_opens_a_directory_store_on_its_absolute_path():
    store = open_store("local", FileStoreConfig(url="file:///srv/backup/zbak"))
    assert isinstance(store, FileBackend)
    assert store.root == Path("/srv/backup/zbak") and store.name == "local"


def test_an_s3_url_opens_a_bucket_store_with_the_prefix_and_the_config_settings():
    cfg = S3StoreConfig(url="s3://my-bucket/zbak/host1", region="eu-central-1",
                        endpoint="http://127.0.0.1:9", upload_concurrency=7)
    store = open_store("cold", cfg)
    try:
        assert isinstance(store, S3Backend)
        assert (store.bucket, store.prefix, store.concurrency) == ("my-bucket", "zbak/host1/", 7)
        assert store.url == "s3://my-bucket/zbak/host1/"
        assert store.part_size == DEFAULT_PART_SIZE
    finally:
        store.close()


def test_an_sftp_url_opens_a_store_on_its_host_with_the_path_and_the_upload_concurrency(
        tmp_path):
    """Nothing is contacted: the host is looked up in the config's hosts and the connection
    dialled on first use."""
    host = HostConfig(address="192.0.2.1", user="u12345")
    cfg = SftpStoreConfig(url="sftp://box/backups/zbak/", upload_concurrency=3)
    store = open_store("offsite", cfg, StoreEnv(hosts={"box": host},
                                                known_hosts=tmp_path / "known_hosts"))
    try:
        assert isinstance(store, SftpBackend)
        assert (store.root, store.concurrency, store.url) == (
            "/backups/zbak", 3, "sftp://box/backups/zbak")
        assert store._connection.known_hosts == tmp_path / "known_hosts"
        assert not store._connection.connected
    finally:
        store.close()


def test_an_sftp_store_on_a_host_the_config_does_not_define_is_a_permanent_error(tmp_path):
    with pytest.raises(StorePermanent, match="host 'box' is not defined under \\[hosts\\]"):
        open_store("offsite", SftpStoreConfig(url="sftp://box/x"),
                   StoreEnv(hosts={}, known_hosts=tmp_path / "kh"))
    with pytest.raises(StorePermanent, match="no known_hosts file"):
        open_store("offsite", SftpStoreConfig(url="sftp://box/x"),
                   StoreEnv(hosts={"box": HostConfig(address="192.0.2.1")}))


def test_an_sftp_url_naming_this_machine_says_to_use_a_file_url():
    with pytest.raises(ValueError, match="use 'file:///absolute/dir'"):
        SftpStoreConfig(url="sftp://local/srv/zbak")


def test_an_s3_url_without_a_prefix_uses_the_whole_bucket():
    store = open_store("b", S3StoreConfig(url="s3://my-bucket", region="us-east-1"))
    assert (store.bucket, store.prefix) == ("my-bucket", "")
    store.close()


def test_a_prune_profile_opens_a_store_whose_deletes_use_it():
    aws = Path(os.environ["HOME"]) / ".aws"  # HOME is the test's own (conftest)
    aws.mkdir()
    (aws / "config").write_text("[profile pruner]\nregion = us-east-1\n")
    store = open_store("b", S3StoreConfig(url="s3://my-bucket", region="us-east-1",
                                          prune_profile="pruner"))
    try:
        assert isinstance(store, PruneCredentialBackend)
        assert store.pruner.concurrency == 1 and store.writer.concurrency == 4
    finally:
        store.close()


def test_the_part_size_grows_so_a_large_volume_fits_in_s3s_10000_parts():
    store = open_store("b", S3StoreConfig(url="s3://my-bucket", region="us-east-1",
                                          volume_size=500 * 1024**3))
    assert store.part_size % MiB == 0
    assert store.part_size * MAX_PARTS >= 500 * 1024**3 > (store.part_size - MiB) * MAX_PARTS
    store.close()


def test_a_volume_larger_than_an_s3_object_may_be_is_a_permanent_error():
    with pytest.raises(StorePermanent, match="5 TiB"):
        open_store("b", S3StoreConfig(url="s3://my-bucket", volume_size=6 * 1024**4))


def test_an_unknown_aws_profile_is_a_permanent_error():
    with pytest.raises(StorePermanent):
        open_store("b", S3StoreConfig(url="s3://my-bucket", profile="no-such-profile-zbak"))


@pytest.mark.parametrize("url, scheme", [
    ("file:///srv/zbak", "file"), ("s3://my-bucket", "s3"), ("s3://my-bucket/a/b", "s3"),
    ("file://relative", None), ("s3://B_AD", None), ("s3://ab", None), ("ftp://x/y", None),
    ("s3://my-bucket/x\n", None), ("", None),
    ("sftp://box/srv/zbak", "sftp"), ("sftp://box/", "sftp"), ("sftp://box/a/b/", "sftp"),
    ("sftp://box", None), ("sftp://box/a//b", None), ("sftp://box/a/../b", None),
    ("sftp://box/./a", None), ("sftp://-box/a", None), ("sftp://local/a", None),
    ("sftp:///a", None), ("sftp://box/a\nb", None),
])
def test_a_url_belongs_to_the_scheme_that_parses_it_or_to_none(url, scheme):
    found = scheme_for_url(url)
    assert (found.name if found else None) == scheme


def test_each_scheme_declares_its_url_form_settings_and_extra_and_is_found_by_its_settings():
    assert [s.name for s in SCHEMES] == ["s3", "file", "sftp"]
    for scheme in SCHEMES:
        assert scheme.form.startswith(f"{scheme.name}://")
        assert scheme_for_url(scheme.form.replace("[/prefix]", "")) is scheme
    assert scheme_of(FileStoreConfig(url="file:///x")).extra is None
    assert scheme_of(S3StoreConfig(url="s3://abc")).extra.module == "boto3"
    assert scheme_of(SftpStoreConfig(url="sftp://box/x")).extra is None  # paramiko: always there


def test_a_settings_class_refuses_a_url_of_another_scheme():
    with pytest.raises(ValueError, match="s3://bucket"):
        S3StoreConfig(url="file:///srv/zbak")
    with pytest.raises(ValueError, match="file:///absolute/dir"):
        FileStoreConfig(url="s3://my-bucket")


@pytest.mark.parametrize("storage_class, restore, thaw, expires", [
    ("STANDARD", None, Thaw.NOT_NEEDED, None),
    ("GLACIER_IR", None, Thaw.NOT_NEEDED, None),
    ("GLACIER", None, Thaw.FROZEN, None),
    ("DEEP_ARCHIVE", 'ongoing-request="true"', Thaw.THAWING, None),
    ("GLACIER", 'ongoing-request="false", expiry-date="Fri, 21 Dec 2012 00:00:00 GMT"',
     Thaw.THAWED, dt.datetime(2012, 12, 21, tzinfo=dt.UTC)),
])
def test_the_restore_header_maps_to_a_thaw_state(storage_class, restore, thaw, expires):
    assert _thaw_state(storage_class, restore) == (thaw, expires)


def test_the_s3_wire_loggers_stay_at_warning_under_debug():
    """botocore and urllib3 log request headers (credentials) at DEBUG (boto/botocore#2626)."""
    import logging

    from zrepl_py.runtime.logsetup import setup_logging

    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    names = ["botocore", "botocore.endpoint", "botocore.parsers", "boto3", "urllib3",
             "urllib3.connectionpool", "s3transfer"]
    saved_levels = {n: logging.getLogger(n).level for n in names}
    try:
        setup_logging("DEBUG")
        assert logging.getLogger("zrepl_py.stores.s3").getEffectiveLevel() == logging.DEBUG
        for name in names:
            assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING, name
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


def test_s3_stores_copy_inside_s3_only_on_one_endpoint_region_and_profile():
    """docs/copies.md#s3-to-s3-inside-s3: a CopyObject is signed once, so the target's
    endpoint, region and profile must be the source's."""
    base = {"url": "s3://one-bucket/zbak", "endpoint": "http://127.0.0.1:9",
            "region": "eu-central-1", "profile": "backup"}
    source = S3StoreConfig(**base)
    assert inside_s3_refusal(source, S3StoreConfig(**{**base, "url": "s3://two-bucket"})) is None
    for key, other, says in (
            ("endpoint", "http://127.0.0.1:10",
             "their endpoints differ (http://127.0.0.1:9 and http://127.0.0.1:10)"),
            ("region", None, "their regions differ (eu-central-1 and the default)"),
            ("profile", "other", "their profiles differ (backup and other)")):
        assert inside_s3_refusal(source, S3StoreConfig(**{**base, key: other})) == says, key
