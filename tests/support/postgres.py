"""A throwaway PostgreSQL 15 cluster for the test session, and a fresh database per test.

Recipe from docs/testbed.md#postgresql: initdb and the server run as the ``postgres`` user (the
tests run as root, which PostgreSQL refuses), listening on 127.0.0.1 and a socket in the cluster
directory. Durability is switched off (``fsync=off``): the cluster dies with the session anyway.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support.common import free_port, unavailable

if TYPE_CHECKING:
    from sqlalchemy import Engine

PG_BIN = Path(os.environ.get("ZBAK_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
START_ATTEMPTS = 3  # free_port() can race with another process taking the port


@dataclass(frozen=True)
class PgCluster:
    """Where the test cluster listens; ``url(db)`` gives a SQLAlchemy URL for database ``db``."""

    host: str
    port: int
    user: str = "postgres"

    def url(self, database: str) -> str:
        """SQLAlchemy URL of ``database`` on this cluster (psycopg 3, trust authentication)."""
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def admin(self):
        """An autocommit psycopg connection to the ``postgres`` database, for CREATE/DROP."""
        import psycopg

        return psycopg.connect(
            host=self.host, port=self.port, user=self.user, dbname="postgres", autocommit=True
        )


def _as_postgres(argv: list[str]) -> list[str]:
    """Prefix ``argv`` with ``runuser -u postgres --`` when running as root."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``argv`` (as postgres when root) and capture its output; never raises on failure."""
    return subprocess.run(
        _as_postgres(argv), cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="session")
def pg_cluster():
    """Start a PostgreSQL 15 cluster in a temporary directory; stop and remove it at the end."""
    for tool in ("initdb", "pg_ctl"):
        if not (PG_BIN / tool).is_file():
            unavailable("postgresql", f"{PG_BIN / tool} not found (apt-get install postgresql)")
    try:
        import psycopg  # noqa: F401 - only to see that it is installed
    except ImportError as exc:
        unavailable("postgresql", f"psycopg not installed: {exc}")
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            unavailable("postgresql", "no postgres user to run the server as")
    base = Path(tempfile.mkdtemp(prefix="zbak-pg-"))
    if os.geteuid() == 0:
        os.chown(base, account.pw_uid, account.pw_gid)
    data, log = base / "data", base / "server.log"
    init = _run(
        [str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-N"], base
    )
    if init.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        unavailable("postgresql", f"initdb failed: {init.stderr.strip()}")
    pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(data)]
    started = None
    for _ in range(START_ATTEMPTS):
        port = free_port()
        options = (
            f"-p {port} -k {base} -c listen_addresses=127.0.0.1"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        start = _run([*pg_ctl, "-o", options, "-l", str(log), "-w", "-t", "60", "start"], base)
        if start.returncode == 0:
            started = port
            break
    if started is None:
        detail = log.read_text(errors="replace")[-2000:] if log.exists() else start.stderr
        shutil.rmtree(base, ignore_errors=True)
        unavailable("postgresql", f"pg_ctl start failed: {detail.strip()}")
    try:
        yield PgCluster(host="127.0.0.1", port=started)
    finally:
        _run([*pg_ctl, "-m", "immediate", "-w", "stop"], base)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_cluster):
    """A fresh empty database for this test; returns its SQLAlchemy URL; dropped afterwards."""
    name = f"zbak_test_{uuid.uuid4().hex[:12]}"
    with pg_cluster.admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_cluster.url(name)
    with pg_cluster.admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def catalog_url(request, tmp_path):
    """A catalog URL on each backend: a SQLite file under ``tmp_path``, then a PostgreSQL db."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'catalog.db'}"
    return request.getfixturevalue("pg_url")


@contextlib.contextmanager
def migrated_engine(url: str) -> Iterator[Engine]:
    """An engine on catalog ``url`` migrated to head (``db.make_engine`` + ``db.upgrade``),
    disposed at the end of the block."""
    from zrepl_py.catalog import db

    engine = db.make_engine(url)
    try:
        db.upgrade(engine)
        yield engine
    finally:
        engine.dispose()
