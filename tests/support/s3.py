"""moto's S3 server over real HTTP (``ThreadedMotoServer``), one per test session."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from support.common import unavailable


@dataclasses.dataclass(frozen=True)
class S3Server:
    """Where the moto server listens, and dummy credentials it accepts."""

    endpoint_url: str
    region: str = "us-east-1"
    access_key: str = "testing-access-key"
    secret_key: str = "testing-secret-key"

    def client(self):
        """A boto3 S3 client for this server."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )


@pytest.fixture(scope="session")
def s3_server():
    """Start moto's ThreadedMotoServer on 127.0.0.1 with a random port; stop it at the end."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        unavailable("s3", f"moto[server] not installed: {exc}")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(endpoint_url=f"http://{host}:{port}")
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh bucket; AWS_* env set so the standard credential chain finds the test keys."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3_server.region)
    name = f"zbak-test-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test that uses an S3 fixture with ``s3``."""
    for item in items:
        if {"s3_server", "s3_bucket"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.s3)
