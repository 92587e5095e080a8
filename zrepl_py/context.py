"""What one zbak invocation works with: config, clock, catalog, host executors, ZFS clients.

Everything that talks to the outside is opened lazily and closed by ``Context.close``, so a
command that only reads the catalog never dials a host.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from sqlalchemy.engine import Engine

from zrepl_py.catalog.db import make_engine, require_current
from zrepl_py.catalog.repository import Catalog
from zrepl_py.clock import Clock, SystemClock
from zrepl_py.config.schema import LOCAL_HOST, Config, JobConfig
from zrepl_py.errors import UsageError
from zrepl_py.proc.hosts import ExecutorPool
from zrepl_py.zfs.capabilities import Capabilities, detect
from zrepl_py.zfs.client import Zfs


@dataclasses.dataclass
class Context:
    """One invocation's world. Use as a context manager so connections are closed.

    Attributes:
        config: the validated config.
        config_path: the file it came from (for messages).
        clock: source of "now" (UTC); tests inject a FixedClock.
    """

    config: Config
    config_path: Path
    clock: Clock = dataclasses.field(default_factory=SystemClock)
    _executors: ExecutorPool | None = None
    _engine: Engine | None = None
    _catalog: Catalog | None = None
    _capabilities: dict[tuple[str, str], Capabilities] = dataclasses.field(default_factory=dict)

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close SSH connections and the catalog engine."""
        if self._executors is not None:
            self._executors.close()
            self._executors = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = self._catalog = None

    @property
    def state_dir(self) -> Path:
        """The state directory from the config."""
        return self.config.state_dir

    def catalog(self) -> Catalog:
        """The catalog, checked to be at the current schema revision.

        Raises:
            CatalogError: when the database is unreachable or not migrated (`zbak init`).
        """
        if self._catalog is None:
            self._engine = make_engine(self.config.catalog_url)
            require_current(self._engine)
            self._catalog = Catalog(self._engine)
        return self._catalog

    def executors(self) -> ExecutorPool:
        """The pool of per-host executors (local and SSH), opened on first use."""
        if self._executors is None:
            self._executors = ExecutorPool(self.config)
        return self._executors

    def zfs(self, host: str, pool: str | None = None) -> Zfs:
        """A ZFS client for ``host``; with ``pool``, its capabilities are probed once and cached.

        Raises:
            HostUnreachable, HostKeyMismatch: when the host cannot be reached safely.
        """
        executor = self.executors().get(host)
        cfg = self.config.hosts.get(host)
        zfs_cmd, zpool_cmd = (cfg.zfs, cfg.zpool) if cfg else ("zfs", "zpool")
        caps = None
        if pool is not None:
            key = (host, pool)
            if key not in self._capabilities:
                self._capabilities[key] = detect(executor, pool, zfs=zfs_cmd, zpool=zpool_cmd)
            caps = self._capabilities[key]
        return Zfs(executor, zfs=zfs_cmd, zpool=zpool_cmd, capabilities=caps)

    def select_jobs(self, names: Sequence[str]) -> list[tuple[str, JobConfig]]:
        """Return the named jobs (all jobs when ``names`` is empty), in config order.

        Raises:
            UsageError: a name that is not a job in the config.
        """
        unknown = [n for n in names if n not in self.config.jobs]
        if unknown:
            known = ", ".join(self.config.jobs) or "none"
            raise UsageError(
                f"unknown job(s) {', '.join(unknown)} in {self.config_path} (jobs: {known})"
            )
        wanted = set(names)
        return [(n, j) for n, j in self.config.jobs.items() if not wanted or n in wanted]


def lock_key(job: JobConfig) -> str:
    """The lock key of a job's source tree: ``HOST:DATASET``."""
    source = job.source
    return f"{source.host or LOCAL_HOST}:{source.dataset}"
