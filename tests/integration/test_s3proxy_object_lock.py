"""The test bed's emulation of S3 Object Lock (``support.s3proxy``, ``object_lock``): what
S3 refuses and moto 5.2.5 allows is refused through the proxy with AccessDenied (shortening
or removing a COMPLIANCE or GOVERNANCE retention, a governance bypass), what S3 allows goes
through (extending a lock, locking a version that has none). Straight to moto (the
``direct`` case) every one of those requests succeeds: that is what the proxy is for."""

from __future__ import annotations

import datetime as dt
import uuid

import botocore.exceptions
import pytest
from support.s3proxy import S3Proxy


@pytest.mark.parametrize("mode", ["COMPLIANCE", "GOVERNANCE"])
@pytest.mark.parametrize("through", ["proxy", "direct"])
def test_a_lock_can_be_extended_but_not_shortened_removed_or_bypassed(s3_server, s3_bucket,
                                                                      mode, through):
    proxy = S3Proxy(s3_server.endpoint_url, object_lock=True)
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=proxy.url if through == "proxy"
                              else s3_server.endpoint_url, region_name=s3_server.region,
                              aws_access_key_id=s3_server.access_key,
                              aws_secret_access_key=s3_server.secret_key)
        bucket = f"zbak-lock-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)

        def retain(days: float, **extra) -> bool:
            """Whether S3 took the retention (``days`` from now; 0: remove it)."""
            retention = {"Mode": mode, "RetainUntilDate": now + dt.timedelta(days=days)}
            try:
                client.put_object_retention(Bucket=bucket, Key="k", VersionId=version,
                                            Retention=retention if days else {}, **extra)
            except botocore.exceptions.ClientError as exc:
                assert exc.response["Error"]["Code"] == "AccessDenied", exc.response
                return False
            return True

        version = client.put_object(Bucket=bucket, Key="k", Body=b"x")["VersionId"]
        assert retain(2), "a version without a lock can be locked"
        assert retain(3), "a lock can be extended"
        refused = [not retain(1), not retain(0), not retain(0, BypassGovernanceRetention=True)]
        assert refused == ([True] * 3 if through == "proxy" else [False] * 3), refused
    finally:
        proxy.close()
