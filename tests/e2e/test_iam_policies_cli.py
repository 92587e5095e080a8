"""The writer's and the pruner's IAM policies of docs/security.md, read from its JSON blocks and
enforced by moto's IAM check (``support.iam_s3``,
docs/testbed.md#s3-on-moto-with-iam-enforced), with a real ``zbak`` process per command.

What moto 5.2.5 enforces here: the action it names for each request against the policies'
Allow and Deny statements and their resources, an explicit Deny winning. What it does not, so
nothing here claims it (the first two measured by
``test_what_moto_enforces_of_the_documented_policies``, the rest read in moto's
``s3/responses.py``, ``ACTION_MAP``):

* conditions on S3 requests (the writer's cap ``s3:object-lock-remaining-retention-days``);
* ``s3:PutObjectRetention``: moto checks PutObjectRetention as ``s3:PutObject``;
* GetObjectRetention and HeadObject (with a version too) are checked as ``s3:GetObject``,
  GetObjectLockConfiguration as ``s3:ListBucket``, CopyObject as ``s3:PutObject`` on the
  target only;
* HeadBucket: moto checks ``s3:HeadBucket``, an action AWS does not have (AWS checks
  ``s3:ListBucket``, which the writer has); the tests add that one statement to the writer's
  policy, named ``MotoNamesHeadBucket`` (without it ``zbak init`` is refused).

What it enforces, so the tests show it: a delete by version id is checked as
``s3:DeleteObjectVersion`` (the writer's Deny refuses it, the pruner's Allow lets it through),
a plain delete as ``s3:DeleteObject``, a version listing as ``s3:ListBucketVersions``, a read
of a version as ``s3:GetObjectVersion``, every write as ``s3:PutObject``: the writer's policy
allows each call ``zbak`` makes but the deletes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest
from support.catalog import recorded_versions, set_recorded_locks
from support.cli import Zbak, prop, zfs
from support.iam_s3 import IamS3Server, write_profiles

from zrepl_py.errors import ExitStatus

SECURITY = Path(__file__).resolve().parents[2] / "docs" / "security.md"
DOCUMENTED_BUCKET = "arn:aws:s3:::backups-locked"
PERIOD = dt.timedelta(days=3)


def documented_policy(sid: str, bucket: str) -> dict[str, Any]:
    """The IAM policy of docs/security.md (a ```json block) whose statements' Sids all start
    with ``sid``, for ``bucket`` instead of the documented one."""
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", SECURITY.read_text(), re.S)]
    (policy,) = [b for b in blocks if all(s["Sid"].startswith(sid) for s in b["Statement"])]
    return json.loads(json.dumps(policy).replace(DOCUMENTED_BUCKET, f"arn:aws:s3:::{bucket}"))


def writer_policy(bucket: str) -> dict[str, Any]:
    """The documented writer's policy, plus ``s3:HeadBucket``, moto's name for what AWS
    checks as ``s3:ListBucket`` (see the module docstring)."""
    policy = documented_policy("ZbakWriter", bucket)
    policy["Statement"].append({"Sid": "MotoNamesHeadBucket", "Effect": "Allow",
                                "Action": "s3:HeadBucket", "Resource": f"arn:aws:s3:::{bucket}"})
    return policy


def _refused(call, **params) -> str:
    """The error code of a boto3 call that must fail."""
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        call(**params)
    return str(refused.value.response["Error"]["Code"])


def test_what_moto_enforces_of_the_documented_policies(iam_s3_server):
    """The boundaries the module docstring states, measured: the writer's key is refused a
    delete by version id and a plain delete of an unlocked version, which the pruner's key
    then deletes; the pruner's key is refused a put. The writer may lock a version for 400
    days, and so may a user allowed only ``s3:PutObject`` under the writer's 31-day condition:
    moto checks PutObjectRetention as PutObject and ignores the condition."""
    server = iam_s3_server
    bucket = server.bucket(object_lock=True)
    writer = server.s3(server.user("writer", writer_policy(bucket)))
    pruner = server.s3(server.user("pruner", documented_policy("ZbakPruner", bucket)))
    capped = server.s3(server.user("capped", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{bucket}/*",
         "Condition": {"NumericLessThanEquals": {
             "s3:object-lock-remaining-retention-days": "31"}}}]}))
    version = writer.put_object(Bucket=bucket, Key="k", Body=b"x")["VersionId"]  # no lock
    assert _refused(writer.delete_object, Bucket=bucket, Key="k",
                    VersionId=version) == "AccessDenied"
    assert _refused(writer.delete_object, Bucket=bucket, Key="k") == "AccessDenied"
    assert _refused(pruner.put_object, Bucket=bucket, Key="p", Body=b"y") == "AccessDenied"
    pruner.delete_object(Bucket=bucket, Key="k", VersionId=version)
    assert server.s3().list_object_versions(Bucket=bucket).get("Versions", []) == []

    years = (dt.datetime.now(dt.UTC) + dt.timedelta(days=400)).replace(microsecond=0)
    for who in (writer, capped):
        version = who.put_object(Bucket=bucket, Key="junk", Body=b"z")["VersionId"]
        who.put_object_retention(Bucket=bucket, Key="junk", VersionId=version, Retention={
            "Mode": "GOVERNANCE", "RetainUntilDate": years})
        head = server.s3().head_object(Bucket=bucket, Key="junk", VersionId=version)
        assert head["ObjectLockRetainUntilDate"] == years


def test_the_documented_writer_archives_audits_and_copies_and_only_the_pruner_deletes(
        zpool, tmp_path, iam_s3_server):
    """A lock store (compliance, 3 days) reached with the documented writer's key as the
    default AWS profile: ``zbak init`` checks the bucket's lock, ``zbak archive`` writes two
    chains, ``zbak audit --deep`` reads every version back, and with each lock set back to 1
    day left ``zbak audit`` extends those of the newer chain (which retention wants) to now +
    3 days. Retention
    releases the older chain; with its locks lapsed, the writer's key is refused deleting its
    versions, and ``zbak prune`` without ``prune_profile`` fails with one line, exit 1, every
    version still there; with ``prune_profile`` naming the documented pruner, ``zbak prune``
    deletes them all by version id and leaves the newer chain's. Then ``zbak copy`` (inside
    S3) copies the newer chain to a second lock store with the writer's key, and locks what
    it wrote."""
    server = iam_s3_server
    bucket = server.bucket(object_lock=True)
    writer = server.user("writer", writer_policy(bucket))
    pruner = server.user("pruner", documented_policy("ZbakPruner", bucket))
    write_profiles(Path(os.environ["HOME"]), {"default": writer, "pruner": pruner})
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(prop(data, "mountpoint"))
    only_writer = Zbak(_config(tmp_path, "writer.toml", server, bucket, data, ""))
    run = Zbak(_config(tmp_path, "pruner.toml", server, bucket, data, 'prune_profile = "pruner"'))
    status, out, err = run("init")
    assert status == ExitStatus.OK, out + err
    assert "versioned, Object Lock on (COMPLIANCE for 3d)" in out, out
    for n, args in ((1, ()), (2, ("--full",))):
        (mount / f"f{n}").write_bytes(os.urandom(256 << 10))
        zfs("snapshot", f"{data}@{n}")
        status, out, err = run("archive", *args)
        assert status == ExitStatus.OK, out + err
    status, out, err = run("audit", "--deep")  # reads every volume by its version
    assert status == ExitStatus.OK, out + err

    catalog = tmp_path / "state" / "catalog.sqlite"
    recorded = recorded_versions(catalog)
    assert len(recorded) == 6 and all(version for _, version in recorded), recorded
    old = recorded[0][0].removesuffix("manifest.json")  # the first chain's stream
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(microsecond=0)
    _set_locks(server, bucket, recorded, soon)
    set_recorded_locks(catalog, soon)
    before = dt.datetime.now(dt.UTC)
    status, out, err = run("audit")  # the rolling lock, with the writer's key
    assert status == ExitStatus.OK, out + err
    wanted = [(key, version) for key, version in recorded if not key.startswith(old)]
    assert len(wanted) == 3, recorded
    for key, version in wanted:
        assert _lock(server, bucket, key, version) >= before + PERIOD, key

    old_versions = _versions(server, bucket, old)
    assert len(old_versions) == 3, old_versions  # manifest, its copy, one volume
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).replace(microsecond=0)
    _set_locks(server, bucket, [(k, v) for k, v in recorded if k.startswith(old)], past)
    set_recorded_locks(catalog, past, under=old)
    intruder = server.s3(writer)
    for key, version in old_versions:
        assert _refused(intruder.delete_object, Bucket=bucket, Key=f"zbak/{key}",
                        VersionId=version) == "AccessDenied", key

    status, out, err = only_writer("prune")
    assert status == ExitStatus.FAILED, out + err
    (line,) = [line for line in err.splitlines() if line.startswith("zbak: ")]  # the logs aside
    assert "manifest.json.copy): access denied [delete_object: AccessDenied" in line, err
    assert "s3:DeleteObjectVersion, in the credential of [stores.cold] prune_profile" in line
    assert "Traceback" not in out + err
    assert _versions(server, bucket, old) == old_versions
    newer = _versions(server, bucket, "")
    status, out, err = run("prune")
    assert status == ExitStatus.OK, out + err
    assert _versions(server, bucket, old) == set()
    assert _versions(server, bucket, "") == newer - old_versions

    status, out, err = run("copy", "data", "--to", "second")
    assert status == ExitStatus.OK, out + err
    copied = [v for v in server.s3().list_object_versions(
        Bucket=bucket, Prefix="copy/")["Versions"] if not v["Key"].startswith("copy/_zbak/")]
    assert len(copied) == 3, copied  # the newer chain: manifest, its copy, one volume
    for v in copied:
        head = server.s3().head_object(Bucket=bucket, Key=v["Key"], VersionId=v["VersionId"])
        assert head["ObjectLockMode"] == "COMPLIANCE", v["Key"]


def _config(tmp: Path, name: str, server: IamS3Server, bucket: str, data: str,
            prune: str) -> Path:
    """Stores ``cold`` and ``second`` (prefixes ``zbak`` and ``copy`` of ``bucket``, locked
    3 days, the default AWS profile; ``prune``: more of ``cold``) and job ``data`` archiving
    to ``cold``, keeping one chain."""
    store = f"""endpoint = "{server.url}"
        region = "{server.region}"
        object_lock = {{ mode = "compliance", period = "3d" }}"""
    path = tmp / name
    path.write_text(textwrap.dedent(f"""\
        state_dir = "{tmp / 'state'}"
        [stores.cold]
        url = "s3://{bucket}/zbak"
        {store}
        {prune}
        [stores.second]
        url = "s3://{bucket}/copy"
        {store}
        [jobs.data]
        dataset = "{data}"
        [jobs.data.archive]
        store = "cold"
        keep_chains = 1
    """))
    return path


def _set_locks(server: IamS3Server, bucket: str, versions: list[tuple[str, str]],
               until: dt.datetime) -> None:
    """Move the lock of each ``(key, version id)`` of store ``cold`` to ``until``, as
    ``admin`` (moto lets a COMPLIANCE lock be shortened; S3 would not)."""
    for key, version in versions:
        server.s3().put_object_retention(Bucket=bucket, Key=f"zbak/{key}", VersionId=version,
                                         Retention={"Mode": "COMPLIANCE",
                                                    "RetainUntilDate": until})


def _lock(server: IamS3Server, bucket: str, key: str, version: str) -> dt.datetime:
    head = server.s3().head_object(Bucket=bucket, Key=f"zbak/{key}", VersionId=version)
    return head["ObjectLockRetainUntilDate"]


def _versions(server: IamS3Server, bucket: str, prefix: str) -> set[tuple[str, str]]:
    """``(key, version id)`` of every version and delete marker of store ``cold`` under
    ``prefix``, the catalog export's aside."""
    page = server.s3().list_object_versions(Bucket=bucket, Prefix=f"zbak/{prefix}")
    return {(v["Key"].removeprefix("zbak/"), v["VersionId"])
            for v in page.get("Versions", []) + page.get("DeleteMarkers", [])
            if not v["Key"].startswith("zbak/_zbak/")}
