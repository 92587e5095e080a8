"""THE intruder test (docs/security.md#recovery-after-an-intrusion): root on the master, with
its config, its catalog and every key it holds, cannot destroy the backups of a master whose
store has Object Lock and whose backup host serves with a floor.

The master pushes two snapshots to a backup host through the real sshd forced command
(``zbak serve``) and archives them (a full and an incremental) to an S3 store on moto. moto
lacks some of S3's Object Lock rules (it lets COMPLIANCE and GOVERNANCE retention be shortened
or removed), so the store is reached through ``support.s3proxy`` with ``object_lock``, which
emulates S3 there (refusing those with AccessDenied, as S3 does); moto itself refuses to delete
a locked version. The intruder, with the master's keys (writer and pruner: the test bed's one
S3 key, which may do everything), tries to shorten and to remove each lock, deletes every
object version, overwrites every key, hides every key behind a delete marker, forges a newer
chain, rewrites the master's catalog, and asks ``zbak serve`` to release and destroy every
replica snapshot. Then, on a clean host with a fresh state directory and read-only
credentials (the proxy refusing every write): ``zbak catalog rebuild --not-after`` lists every
one of the intruder's versions and markers as untrusted and rebuilds the real chain; ``zbak
audit`` names every tampered key, the catalog export's generation keys included; each snapshot the store held restores with its guid and
files; the replica keeps every snapshot (all are within the floor).

With the protections off (the same bucket, the store without ``object_lock``, serve without a
floor), the same attack succeeds: no version the master wrote is left, the clean host has
nothing to rebuild from (``--not-after`` refuses: every object is newer), and the replica is
empty. So the test can fail.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import botocore.exceptions
import pytest
from support.cli import prop, restored_content, snapshots, tree_digest, zfs
from support.intrusion import clean_host, forge_newer_chain, server_cutoff, store_table
from support.s3proxy import S3Proxy
from support.served import Backup

from zrepl_py.errors import ExitStatus

pytestmark = [pytest.mark.zfs, pytest.mark.ssh]

FLOOR = "--allow-destroy-own --keep-newer-than 7d --keep-last 2"
NO_FLOOR = "--allow-destroy-own"


def _denied(call, **kwargs) -> bool:
    """Whether S3 (moto, or the proxy emulating S3) refused ``call(**kwargs)``."""
    try:
        call(**kwargs)
    except botocore.exceptions.ClientError as exc:
        assert exc.response["Error"]["Code"] == "AccessDenied", exc.response
        return True
    return False


@pytest.mark.parametrize("protected", [True, False], ids=["protected", "unprotected"])
def test_an_intruder_with_the_masters_keys_destroys_no_backup(
        make_pool, sshd_factory, tmp_path, s3_server, s3_bucket, protected):
    bucket = f"zbak-lock-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    lock_rules = S3Proxy(s3_server.endpoint_url, object_lock=True)
    read_only = S3Proxy(s3_server.endpoint_url, read_only=True)
    try:
        _attack_and_recover(make_pool, sshd_factory, tmp_path, s3_server, bucket, lock_rules,
                            read_only, protected)
    finally:
        lock_rules.close()
        read_only.close()


def _attack_and_recover(make_pool, sshd_factory, tmp: Path, s3_server, bucket: str,
                        lock_rules: S3Proxy, read_only: S3Proxy, protected: bool) -> None:
    store = store_table(bucket, lock_rules.url, s3_server.region, locked=protected)
    backup = Backup(make_pool, sshd_factory, tmp, FLOOR if protected else NO_FLOOR,
                    replicate_extra='[jobs.j.archive]\nstore = "cold"\n' + store)
    first, second = backup.replicate(2)  # writes f1, snapshots, writes f2, snapshots
    tree = tree_digest(backup.src.mountpoint / "data")
    trees = {first: {k: v for k, v in tree.items() if k != "f2"}, second: tree}
    done = backup.zbak("archive")
    assert done.returncode == 0, done.stdout + done.stderr
    real = snapshots(backup.replica)
    assert real == list(trees)
    zfs("hold", "keep", f"{backup.replica}@{real[0]}")  # the backup host's admin pins one

    # the intruder, as root on the master, with its keys (through the proxy emulating S3)
    client = s3_server.client()  # the test's own view of moto, never through a proxy
    intruder = _client(s3_server, lock_rules.url)
    listing = intruder.list_object_versions(Bucket=bucket, Prefix="zbak/")
    written = listing["Versions"]
    keys = sorted({v["Key"].removeprefix("zbak/") for v in written})
    manifests = [k for k in keys if k.endswith("/manifest.json")]
    assert len(manifests) == 2 and any(k.startswith("_zbak/catalog/") for k in keys)
    at = server_cutoff(client, bucket)
    forged = forge_newer_chain(intruder, bucket, "zbak", manifests[0])
    refused = []
    for v in written:
        version = {"Bucket": bucket, "Key": v["Key"], "VersionId": v["VersionId"]}
        if intruder.head_object(**version).get("ObjectLockMode"):
            for retention in ({"Mode": "COMPLIANCE", "RetainUntilDate": at}, {}):
                refused.append(_denied(intruder.put_object_retention, Retention=retention,
                                       **version))
            refused.append(_denied(intruder.put_object_retention, Retention={},
                                   BypassGovernanceRetention=True, **version))
        refused.append(_denied(intruder.delete_object, **version))
    for key in keys:
        size = max(v["Size"] for v in written if v["Key"] == f"zbak/{key}")
        intruder.put_object(Bucket=bucket, Key=f"zbak/{key}", Body=os.urandom(size))
        intruder.delete_object(Bucket=bucket, Key=f"zbak/{key}")  # a delete marker
    (tmp / "state" / "catalog.sqlite").write_bytes(os.urandom(4096))
    asked = ([f"zfs release keep {backup.replica}@{real[0]}"]
             + [f"zfs destroy {backup.replica}@{s}" for s in reversed(real)])
    served = [backup.intruder(request).returncode for request in asked]

    if not protected:  # the attack succeeds: nothing the master wrote is left anywhere
        assert not any(refused) and served == [0] * len(asked)
        left = client.list_object_versions(Bucket=bucket, Prefix="zbak/").get("Versions", [])
        assert not [v for v in left if v["LastModified"] <= at], left
        assert snapshots(backup.replica) == []
        run = clean_host(tmp / "clean", store_table(bucket, read_only.url, s3_server.region,
                                                    locked=False), "j", backup.data)
        status, out, err = run("catalog", "rebuild", "cold", "--not-after", at.isoformat())
        assert status == ExitStatus.USAGE and "written after" in err, out + err
        return

    assert all(refused) and len(refused) == 4 * len(written), refused
    assert served == [126] * len(asked)
    assert snapshots(backup.replica) == real, "the floor kept every replica snapshot"

    run = clean_host(tmp / "clean", store_table(bucket, read_only.url, s3_server.region),
                     "j", backup.data)
    status, out, err = run("catalog", "rebuild", "cold", "--not-after", at.isoformat(),
                           "--json")
    assert status == ExitStatus.OK, out + err
    doc = json.loads(out)
    assert len(doc["added"]) == 2 and doc["skipped"] == [], doc
    untrusted = sorted((u["key"], u["kind"]) for u in doc["untrusted"])
    assert untrusted == sorted([(k, "version") for k in keys + forged]
                               + [(k, "delete marker") for k in keys]), untrusted

    status, out, err = run("audit", "--json")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    findings = json.loads(out)["findings"]

    def named(what: str) -> set[str]:
        return {f["key"] for f in findings if what in f["problem"]}

    streams = {k for k in keys if not k.startswith("_zbak/")}
    assert streams <= named("tampering: "), findings
    exports = set(keys) - streams  # each export generation is written once, so audited too
    assert exports and exports <= named("tampering: catalog export "), findings
    assert streams <= named("the catalog does not know"), "each overwrite: an unknown version"
    assert forged[0].rsplit("/", 1)[0] + "/" in named("has a manifest but is not in the catalog")
    assert json.loads(out)["jobs"][0]["bad"] == []

    for n, (name, tree) in enumerate(trees.items()):
        into = f"{backup.src.name}/back{n}"
        status, out, err = run("restore", backup.data, "--to", f"@{name}", "--into", into,
                               "--from", "cold", "--yes")
        assert status == ExitStatus.OK, out + err
        assert prop(f"{into}@{name}", "guid") == prop(f"{backup.data}@{name}", "guid")
        assert restored_content(into) == tree
    assert read_only.refused == [], "the clean host wrote nothing to the store"


def _client(s3_server, endpoint: str):
    """A boto3 S3 client with the master's keys, through ``endpoint``."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name=s3_server.region,
                        aws_access_key_id=s3_server.access_key,
                        aws_secret_access_key=s3_server.secret_key)
