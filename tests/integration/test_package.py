"""The package installs like one: ``python -m build`` makes an sdist that carries the
examples, the migrations, the Grafana dashboard and Prometheus rules, the README and the
LICENSE, and a wheel (built from that sdist)
that installs them under ``<prefix>/share``; installed into a fresh venv, zbak runs without
the optional extras and names the one a config needs.

Real pip, real venvs: the build and the install fetch setuptools and zbak's dependencies
from the package index (or pip's cache), so these tests are marked slow.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from zrepl_py import __version__

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").iterdir() if p.is_file())
MIGRATIONS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "migrations").rglob("*")
                    if p.suffix in (".py", ".mako"))
MONITORING = {"grafana/zbak.json": "monitoring/grafana/zbak.json",
              "prometheus/zbak-rules.yml": "monitoring/prometheus/zbak-rules.yml"}
"""Installed under share/zbak (the key) from the repository's file (the value)."""
INSTALL_PREFIX = "/opt/zbak"  # where README "Install" puts the venv; the unit names it


def _run(*argv: str | Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=540,
                          **kwargs)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``python -m build``: the sdist, then the wheel built from the unpacked sdist."""
    out = tmp_path_factory.mktemp("dist")
    done = _run(sys.executable, "-m", "build", "--outdir", out, ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (no extras)."""
    root = tmp_path_factory.mktemp("venv") / "v"
    assert _run(sys.executable, "-m", "venv", root).returncode == 0
    (wheel,) = dist.glob("zbak-*.whl")
    done = _run(root / "bin" / "pip", "install", "-q", "--disable-pip-version-check", wheel)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def test_the_sdist_carries_the_examples_migrations_readme_and_license(dist):
    (sdist,) = dist.glob(f"zbak-{__version__}.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = {"LICENSE", "README.md", "MANIFEST.in", "setup.cfg", "pyproject.toml",
              "zrepl_py/cli/__init__.py", *(f"examples/{e}" for e in EXAMPLES), *MIGRATIONS,
              *MONITORING.values()}
    assert wanted <= names, sorted(wanted - names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_installs_examples_migrations_and_readme_under_share(dist):
    (wheel,) = dist.glob(f"zbak-{__version__}-*.whl")
    data = f"zbak-{__version__}.data/data/"
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"zbak-{__version__}.dist-info/METADATA").decode()
    wanted = {*(f"{data}share/zbak/examples/{e}" for e in EXAMPLES),
              *(f"{data}share/zbak/{m}" for m in MIGRATIONS),
              *(f"{data}share/zbak/{m}" for m in MONITORING),
              f"{data}share/doc/zbak/README.md", f"{data}share/doc/zbak/LICENSE"}
    assert wanted <= names, sorted(wanted - names)
    assert any(n.startswith(f"zbak-{__version__}.dist-info/") and n.endswith("LICENSE")
               for n in names)
    assert "License: BSD-2-Clause" in metadata or "License-Expression: BSD-2-Clause" in metadata


def test_the_wheel_makes_boto3_psycopg_and_apprise_extras_s3_postgresql_apprise_and_all(dist):
    (wheel,) = dist.glob("zbak-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        metadata = whl.read(f"zbak-{__version__}.dist-info/METADATA").decode()
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.MULTILINE)
    extras = set(re.findall(r"^Provides-Extra: (.+)$", metadata, re.MULTILINE))
    assert {"s3", "postgresql", "apprise", "all"} <= extras
    for package, extra in (("boto3", "s3"), ("psycopg", "postgresql"), ("apprise", "apprise")):
        # The name alone: boto3-stubs (the test extra's type stubs) is another distribution.
        mine = [r for r in requires if re.match(rf"{package}(?![\w.-])", r)]
        assert mine and all("extra ==" in r for r in mine), mine
        assert {re.search(r'extra == "(\w+)"', r).group(1) for r in mine} == {extra, "all"}


def test_the_installed_files_land_under_the_venvs_share_zbak(venv):
    share = venv / "share" / "zbak"
    assert sorted(p.name for p in (share / "examples").iterdir()) == EXAMPLES
    for example in EXAMPLES:
        assert (share / "examples" / example).read_bytes() == \
            (ROOT / "examples" / example).read_bytes()
    for migration in MIGRATIONS:
        assert (share / migration).is_file(), migration
    for installed, source in MONITORING.items():
        assert (share / installed).read_bytes() == (ROOT / source).read_bytes(), installed
    assert (venv / "share" / "doc" / "zbak" / "README.md").is_file()


def test_the_systemd_units_documentation_names_files_the_install_put_there(venv):
    unit = (venv / "share" / "zbak" / "examples" / "zbak.service").read_text()
    (line,) = re.findall(r"^Documentation=(.+)$", unit, re.MULTILINE)
    files = [uri.removeprefix("file://") for uri in line.split() if uri.startswith("file://")]
    assert files, line
    for path in files:
        assert path.startswith(INSTALL_PREFIX + "/"), path
        assert (venv / path.removeprefix(INSTALL_PREFIX + "/")).is_file(), path


def test_the_installed_zbak_runs_without_extras_and_names_the_one_a_config_needs(venv, tmp_path):
    zbak = venv / "bin" / "zbak"
    assert _run(zbak, "--version").stdout.strip() == f"zbak, version {__version__}"
    probe = _run(venv / "bin" / "python", "-c", "import boto3")
    assert probe.returncode != 0, "boto3 must come only with an extra"
    probe = _run(venv / "bin" / "python", "-c", "import psycopg")
    assert probe.returncode != 0, "psycopg must come only with an extra"
    done = _run(zbak, "--config", venv / "share/zbak/examples/archive-s3-glacier.toml",
                "config", "check")
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["zbak: store cold needs boto3: pip install 'zbak[s3]'"]
    config = tmp_path / "zbak.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    config.chmod(0o600)
    done = _run(zbak, "--config", config, "init", "--no-checks", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "revision" in done.stdout  # the migrations were found under <venv>/share/zbak
