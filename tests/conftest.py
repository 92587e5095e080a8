"""Test-suite wiring: real-component fixtures and an isolated environment for every test."""

from __future__ import annotations

import pytest

pytest_plugins = [
    "support.zfs",
    "support.sshd",
    "support.sftpd",
    "support.s3",
    "support.iam_s3",
    "support.postgres",
    "support.catalog",
    "support.openzfs",
    "support.distribution",
]


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """Scrub ZBAK_* and AWS_* and give each test its own HOME
    (docs/style.md#tests-isolate-the-environment)."""
    import os

    for key in list(os.environ):
        if key.startswith(("ZBAK_", "AWS_")) and key != "ZBAK_TEST_STRICT":
            monkeypatch.delenv(key, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
