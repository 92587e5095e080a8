"""The Docker image builds and runs zbak: ``scripts/container-check.sh`` builds
docker/Dockerfile with rootful podman (installed by scripts/setup-host.sh; with no registry
reachable it bootstraps the Debian base from the archive) and runs ``zbak --version`` and
``zbak config check`` in the image.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from support.common import need_binary

from zrepl_py import __version__

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_image_builds_and_runs_zbak_version_and_config_check():
    podman = need_binary("podman (container builder)", "podman")
    image = f"localhost/zbak:test-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "ZBAK_IMAGE": image, "ZBAK_BUILDER": "podman"}
    try:
        done = subprocess.run([str(ROOT / "scripts" / "container-check.sh")], env=env,
                              capture_output=True, text=True, timeout=1700)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        assert f"\nzbak, version {__version__}\n" in done.stdout
        assert "/etc/zbak/zbak.toml: valid (1 job(s), 2 host(s), 1 store(s)" in done.stdout
    finally:
        subprocess.run([podman, "rmi", "-f", image], capture_output=True, timeout=300)
