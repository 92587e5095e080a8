"""docs/reliability.md#r42-least-privilege-s3-credentials: least-privilege S3 credentials, enforced
by a real IAM policy check (moto's, ``support.iam_s3``;
docs/testbed.md#s3-on-moto-with-iam-enforced).

* ``writer`` may put, get, list and abort uploads, but not ``s3:DeleteObject``;
* ``pruner`` may only delete (and list).

zbak gets them as two profiles of the shared credentials file (``[stores.NAME] profile`` and
``prune_profile``), the standard AWS chain.
"""

from __future__ import annotations

import datetime as dt
import os
import textwrap
from pathlib import Path

import pytest
from support.cli import Zbak, zfs
from support.iam_s3 import write_profiles

from zrepl_py.catalog.db import make_engine
from zrepl_py.catalog.repository import Catalog
from zrepl_py.config.loading import load_config, parse_config
from zrepl_py.errors import ConfigError, ExitStatus, StorePermanent
from zrepl_py.stores.prune_credential import PruneCredentialBackend
from zrepl_py.stores.registry import open_store
from zrepl_py.stores.schemes.s3 import S3StoreConfig

pytestmark = [pytest.mark.s3]

WRITER = ["s3:PutObject", "s3:GetObject", "s3:ListBucket", "s3:AbortMultipartUpload",
          "s3:ListMultipartUploadParts", "s3:RestoreObject"]
PRUNER = ["s3:DeleteObject", "s3:ListBucket"]


class IamS3:
    """A bucket on the IAM-enforcing moto server, and profiles ``writer`` and ``pruner``
    allowed ``WRITER`` and ``PRUNER`` on it, in the test's HOME."""

    def __init__(self, server):
        self.server = server
        self.url = server.url
        self.bucket = server.bucket(object_lock=False)
        self.keys = {name: server.user(name, {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": actions, "Resource": [
                f"arn:aws:s3:::{self.bucket}", f"arn:aws:s3:::{self.bucket}/*"]}]})
            for name, actions in (("writer", WRITER), ("pruner", PRUNER))}
        write_profiles(Path(os.environ["HOME"]), self.keys)

    def keys_in_bucket(self) -> set[str]:
        listing = self.server.s3(self.keys["writer"]).list_objects_v2(Bucket=self.bucket)
        return {o["Key"] for o in listing.get("Contents", [])}


@pytest.fixture
def iam_s3(iam_s3_server):
    return IamS3(iam_s3_server)


def store(server: IamS3, **extra) -> S3StoreConfig:
    return S3StoreConfig(url=f"s3://{server.bucket}/zbak", endpoint=server.url,
                         region="us-east-1", profile="writer", **extra)


def test_the_writer_credential_cannot_delete_and_the_refusal_is_raised_not_swallowed(iam_s3):
    """docs/reliability.md#r42-least-privilege-s3-credentials (C): with the writer profile alone,
    ``put`` works and ``delete`` raises StorePermanent (AccessDenied) with the object still there;
    the prune profile cannot write."""
    backend = open_store("cold", store(iam_s3))
    try:
        backend.put("a/obj", [b"x" * 1000])
        with pytest.raises(StorePermanent, match="(?i)denied"):
            backend.delete("a/obj")
    finally:
        backend.close()
    assert iam_s3.keys_in_bucket() == {"zbak/a/obj"}
    pruner = open_store("cold", store(iam_s3).model_copy(update={"profile": "pruner"}))
    try:
        with pytest.raises(StorePermanent, match="(?i)denied"):
            pruner.put("a/other", [b"y"])
    finally:
        pruner.close()


def test_with_a_prune_profile_deletes_use_it_and_everything_else_the_writer(iam_s3):
    """docs/reliability.md#r42-least-privilege-s3-credentials (C): ``prune_profile`` gives a backend
    whose delete succeeds through the pruner credential while put/get/stat/list keep using the
    writer's."""
    backend = open_store("cold", store(iam_s3, prune_profile="pruner"))
    try:
        assert isinstance(backend, PruneCredentialBackend)
        backend.put("a/obj", [b"x" * 1000])
        assert b"".join(backend.get("a/obj")) == b"x" * 1000
        assert [o.key for o in backend.list("a/")] == ["a/obj"]
        backend.delete("a/obj")
    finally:
        backend.close()
    assert iam_s3.keys_in_bucket() == set()


def test_prune_profile_is_refused_for_a_file_store_naming_the_key():
    """docs/reliability.md#r42-least-privilege-s3-credentials (U): the key only makes sense for
    S3 and is refused elsewhere, at its own key path."""
    with pytest.raises(ConfigError) as info:
        parse_config({"stores": {"local": {"url": "file:///srv/zbak", "prune_profile": "p"}}},
                     "zbak.toml")
    assert info.value.problems == [("stores.local.prune_profile",
                                    "prune_profile applies to s3:// stores only")]


@pytest.mark.zfs
def test_zbak_archives_with_the_writer_and_prunes_chains_only_with_the_prune_profile(
        iam_s3, zpool, tmp_path, capsys):
    """docs/reliability.md#r42-least-privilege-s3-credentials (E): ``zbak archive`` writes two
    chains with the write-only writer credential (its one delete, of the finished upload's
    ``progress.json``, goes through ``prune_profile``); ``zbak prune`` without a prune credential
    fails with exit 1 naming the refused delete and leaves the old chain's objects in place; with
    ``prune_profile`` the rerun deletes them."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(zfs("get", "-Hp", "-o", "value", "mountpoint", data).strip())

    def config(path: Path, prune: str) -> Path:
        path.write_text(textwrap.dedent(f"""
            state_dir = "{tmp_path / 'state'}"
            [stores.cold]
            url = "s3://{iam_s3.bucket}/zbak"
            endpoint = "{iam_s3.url}"
            region = "us-east-1"
            profile = "writer"
            volume_size = "256KiB"
            {prune}
            [jobs.data]
            dataset = "{data}"
            [jobs.data.snapshot]
            retention = {{ keep_last = 1 }}
            [jobs.data.archive]
            store = "cold"
            keep_chains = 1
        """))
        return path

    writer_only = Zbak(config(tmp_path / "writer.toml", ""), capsys)
    both = Zbak(config(tmp_path / "both.toml", 'prune_profile = "pruner"'), capsys)
    assert both("init", "--no-checks")[0] == ExitStatus.OK
    for n, extra in ((1, ()), (2, ("--full",))):
        (mount / f"f{n}").write_bytes(os.urandom(300_000))
        zfs("snapshot", f"{data}@zbak_2026010{n}T000000Z")
        status, out, err = both("archive", *extra)
        assert status == ExitStatus.OK, out + err
    catalog = Catalog(make_engine(load_config(tmp_path / "writer.toml").catalog_url))
    streams = catalog.streams(dataset=data)
    (newer,) = [s for s in streams if s.to_name == "zbak_20260102T000000Z"]
    (older,) = [s for s in streams if s.to_name == "zbak_20260101T000000Z"]
    catalog.set_stream_state(newer.id, "verified", dt.datetime.now(dt.UTC))
    old_keys = {k for k in iam_s3.keys_in_bucket() if k.startswith("zbak/" + older.object_prefix)}
    assert old_keys

    status, out, err = writer_only("prune", "data")
    assert status == ExitStatus.FAILED, out + err
    assert "denied" in (out + err).lower()
    assert old_keys <= iam_s3.keys_in_bucket()

    status, out, err = both("prune", "data")
    assert status == ExitStatus.OK, out + err
    assert not old_keys & iam_s3.keys_in_bucket()
    assert [s.to_name for s in catalog.streams(dataset=data)] == ["zbak_20260102T000000Z"]
