"""moto's S3 server enforcing IAM, opt-in: the ``iam_s3_server`` fixture
(docs/testbed.md#s3-on-moto-with-iam-enforced).

moto authorises every request against the caller's IAM policies once
``INITIAL_NO_AUTH_ACTION_COUNT`` requests have passed (moto ``core/authorization.py``). The
count is a setting of the whole process, so this server runs in a process of its own and the
session's shared server (``support.s3``) never enforces anything. At start, with nothing
enforced yet, the fixture creates an ``admin`` user allowed everything, then switches
enforcement on for every later request (``POST /moto-api/reset-auth`` with ``0``); a test
creates its buckets and users as ``admin``, which moto checks like any other caller.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from support.common import unavailable

_SERVE = """\
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""
"""The server process: prints its port once it listens, stops when its stdin closes (so a
test session that dies takes it along)."""

ALLOW_ALL = {"Version": "2012-10-17",
             "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


@dataclasses.dataclass(frozen=True)
class Keys:
    """An IAM user's access key."""

    user: str
    access_key: str
    secret_key: str


class IamS3Server:
    """A moto server in its own process that checks every request against IAM.

    Args:
        log: where the server's stderr goes.

    Raises:
        RuntimeError: the server did not start (its log says why).
    """

    region = "us-east-1"

    def __init__(self, log: Path):
        self._log = log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log)
        assert self.proc.stdout is not None
        port = self.proc.stdout.readline().strip()  # the server listens once it is printed
        if not port.isdigit():
            self.stop()
            raise RuntimeError(f"moto did not start: {log.read_text()[-2000:]}")
        self.url = f"http://127.0.0.1:{int(port)}"
        self.admin = self._user(
            self._client("iam", Keys("setup", "setup", "setup")), "admin", ALLOW_ALL)
        request = urllib.request.Request(self.url + "/moto-api/reset-auth", data=b"0",
                                         method="POST", headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=30).close()  # from now on, every request

    def _client(self, service: str, keys: Keys) -> Any:
        import boto3

        return boto3.client(service, endpoint_url=self.url, region_name=self.region,
                            aws_access_key_id=keys.access_key,
                            aws_secret_access_key=keys.secret_key)

    @staticmethod
    def _user(iam: Any, name: str, policy: Mapping[str, Any]) -> Keys:
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="zbak", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return Keys(name, key["AccessKeyId"], key["SecretAccessKey"])

    def s3(self, keys: Keys | None = None) -> Any:
        """A boto3 S3 client with ``keys`` (default: ``admin``'s)."""
        return self._client("s3", keys or self.admin)

    def user(self, name: str, policy: Mapping[str, Any]) -> Keys:
        """A new IAM user ``name-<random>`` whose one inline policy is ``policy`` (an IAM
        policy document), and its access key."""
        return self._user(self._client("iam", self.admin), f"{name}-{uuid.uuid4().hex[:8]}",
                          policy)

    def bucket(self, *, object_lock: bool) -> str:
        """A new bucket made by ``admin``; with ``object_lock``, created with Object Lock
        (which turns versioning on)."""
        name = f"zbak-iam-{uuid.uuid4().hex[:12]}"
        extra = {"ObjectLockEnabledForBucket": True} if object_lock else {}
        self.s3().create_bucket(Bucket=name, **extra)
        return name

    def stop(self) -> None:
        """Stop the server and wait for it."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def write_profiles(home: Path, profiles: Mapping[str, Keys]) -> None:
    """Write ``home/.aws/credentials`` with one profile per entry of ``profiles`` (the
    standard AWS chain, where ``[stores.NAME] profile`` and ``prune_profile`` look)."""
    aws = home / ".aws"
    aws.mkdir(mode=0o700, exist_ok=True)
    (aws / "credentials").write_text("".join(
        f"[{name}]\naws_access_key_id = {keys.access_key}\n"
        f"aws_secret_access_key = {keys.secret_key}\n" for name, keys in profiles.items()))


@pytest.fixture(scope="session")
def iam_s3_server(tmp_path_factory):
    """One IAM-enforcing moto server for the session, started by the first test asking."""
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        unavailable("s3", f"moto[server] not installed: {exc}")
    server = IamS3Server(tmp_path_factory.mktemp("iam-s3") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test that uses the IAM-enforcing server with ``s3``."""
    for item in items:
        if "iam_s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)
