"""What one zbak invocation works with: config, clock, catalog, host executors, ZFS clients,
stores.

Everything that talks to the outside is opened lazily, once, and closed by ``Context.close``, so
a command that only reads the catalog never dials a host or a store. The modules behind them are imported
lazily too (SQLAlchemy and Alembic for the catalog, paramiko for remote hosts): every command
imports this module, and ``zbak replicate`` should not pay for what it does not use.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from zrepl_py.clock import Clock, MonotonicClock, SystemClock
from zrepl_py.config.hosts import LOCAL_HOST
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.schema import Config
from zrepl_py.errors import UsageError
from zrepl_py.runtime.gcpause import end_startup
from zrepl_py.runtime.prefetch import Prefetch, Task

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from sqlalchemy.engine import Engine

    from zrepl_py.catalog.fleetlock import FleetLocks
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.invocation.hosts import ExecutorPool
    from zrepl_py.locking import Lease, LockRecord
    from zrepl_py.stores.base import Backend
    from zrepl_py.streams.codec import Codec
    from zrepl_py.zfs.capabilities import Capabilities
    from zrepl_py.zfs.client import Zfs

T = TypeVar("T")


@dataclasses.dataclass
class Context:
    """One invocation's world. Use as a context manager so connections are closed.

    Attributes:
        config: the validated config.
        config_path: the file it came from (for messages).
        clock: source of "now" (UTC); tests inject a FixedClock.
        identity: the ``--identity FILE`` given to a command that decrypts a sealed store's
            volumes (restore, ``audit --deep``), else None: ``reading_codecs`` falls back to
            the store's ``[stores.NAME.age] identity_file``.
    """

    config: Config
    config_path: Path
    clock: Clock = dataclasses.field(default_factory=lambda: MonotonicClock(SystemClock()))
    identity: Path | None = None
    _executors: ExecutorPool | None = None
    _engine: Engine | None = None
    _catalog: Catalog | None = None
    _capabilities: dict[tuple[str, str], Capabilities] = dataclasses.field(default_factory=dict)
    _capability_locks: dict[tuple[str, str], threading.Lock] = dataclasses.field(
        default_factory=dict)
    _prefetch: Prefetch | None = None
    _stores: dict[str, Backend] = dataclasses.field(default_factory=dict)
    _codecs: dict[tuple[str, Path | None], Callable[[str], Codec]] = dataclasses.field(
        default_factory=dict)
    _fleet: FleetLocks | None | Literal[False] = False  # False: not looked at yet

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the prefetch; close the stores, SSH connections and the catalog engine."""
        if self._prefetch is not None:
            self._prefetch.close()
            self._prefetch = None
        stores, self._stores = list(self._stores.values()), {}
        for backend in stores:
            backend.close()
        if self._executors is not None:
            self._executors.close()
            self._executors = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = self._catalog = None
        if self._fleet is not None and self._fleet is not False:
            self._fleet.close()
        self._fleet = False

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
            from zrepl_py.catalog.db import make_engine, require_current
            from zrepl_py.catalog.repository import Catalog

            self._engine = make_engine(self.config.catalog_url)
            require_current(self._engine)
            self._catalog = Catalog(self._engine)
            # a wall clock set back since the last run
            # (docs/reliability.md#r32-clock-goes-backwards)
            if isinstance(self.clock, MonotonicClock):
                self.clock.raise_floor(self._catalog.newest_run_time())
            end_startup()  # SQLAlchemy is the last big import a command makes (gcpause)
        return self._catalog

    def fleet_locks(self) -> FleetLocks | None:
        """The locks other hosts sharing the catalog see (``catalog.fleetlock``): where the
        catalog is PostgreSQL; None for SQLite, one host's."""
        if self._fleet is False:
            from sqlalchemy import make_url

            from zrepl_py.catalog.fleetlock import FleetLocks

            shared = make_url(self.config.catalog_url).get_backend_name() == "postgresql"
            self._fleet = FleetLocks(self.config.catalog_url) if shared else None
        return self._fleet

    def lock(self, key: str, action: str) -> AbstractContextManager[Lease]:
        """``locking.dataset_lock`` of ``key`` for ``action`` in the state directory, and in
        the catalog where other hosts share it (exit 3 when either is held).

        Raises:
            Locked: another run holds it, on this host or another sharing the catalog.
            LockBroken: the lock was taken over or lost while the block ran.
        """
        from zrepl_py.locking import dataset_lock

        return dataset_lock(self.state_dir, key, action, shared=self.fleet_locks())

    def lock_holder(self, key: str) -> LockRecord | None:
        """Who holds ``key``'s lock now, on this host or another (``locking.holder``)."""
        from zrepl_py.locking import holder

        return holder(self.state_dir, key, shared=self.fleet_locks())

    def executors(self) -> ExecutorPool:
        """The pool of per-host executors (local and SSH), opened on first use."""
        if self._executors is None:
            from zrepl_py.invocation.hosts import ExecutorPool

            self._executors = ExecutorPool(self.config)
        return self._executors

    def zfs(self, host: str, pool: str | None = None) -> Zfs:
        """A ZFS client for ``host``; with ``pool``, its capabilities are known.

        Capabilities come from ``<state_dir>/capabilities`` when a cached answer still fits
        the host (one ``zpool get all`` to check, ``zfs/capability_cache.py``), else from a
        fresh ``detect``; within one Context they are looked up once per (host, pool).

        Raises:
            HostUnreachable, HostKeyMismatch: when the host cannot be reached safely.
            CommandFailed: the host has no zfs/zpool (exit 127), or a probe failed.
        """
        from zrepl_py.zfs.client import Zfs

        executor = self.executors().get(host)
        cfg = self.config.hosts.get(host)
        zfs_cmd, zpool_cmd = (cfg.zfs, cfg.zpool) if cfg else ("zfs", "zpool")
        caps = None
        if pool is not None:
            key = (host, pool)
            # One lookup per (host, pool) even when a prefetch thread asks at the same time;
            # setdefault is atomic under the GIL.
            with self._capability_locks.setdefault(key, threading.Lock()):
                if key not in self._capabilities:
                    from zrepl_py.zfs.capability_cache import cached_capabilities

                    self._capabilities[key] = cached_capabilities(
                        executor, pool, cache_dir=self.state_dir / "capabilities",
                        now=self.clock.now(), zfs=zfs_cmd, zpool=zpool_cmd,
                    )  # fmt: skip
                caps = self._capabilities[key]
        return Zfs(executor, zfs=zfs_cmd, zpool=zpool_cmd, capabilities=caps)

    def store(self, name: str) -> Backend:
        """The backend of ``[stores.NAME]``, opened on first use and kept until ``close``
        (``stores.registry.open_store``: its S3 calls retry by ``stores.retry``'s one policy;
        an ``sftp://`` store gets the config's hosts and ``<state_dir>/known_hosts``, and keeps
        one SSH connection of its own). Nothing is contacted here.

        Raises:
            UsageError: ``name`` is not under ``[stores]`` in the config.
            ExtraMissing: the store's pip extra is not installed.
            StorePermanent: the store's URL or settings cannot be used.
        """
        if name not in self._stores:
            cfg = self.config.stores.get(name)
            if cfg is None:
                known = ", ".join(self.config.stores) or "none"
                raise UsageError(f"store {name!r} is not under [stores] in {self.config_path}"
                                 f" (stores: {known})")
            from zrepl_py.stores.registry import open_store  # boto3 only when a store is used
            from zrepl_py.stores.scheme import StoreEnv

            env = StoreEnv(hosts=self.config.hosts, known_hosts=self.state_dir / "known_hosts")
            self._stores[name] = open_store(name, cfg, env)
        return self._stores[name]

    def reading_codecs(self, name: str) -> Callable[[str], Codec]:
        """The codecs that decode store ``name``'s volumes, by chain name
        (``stores.sealing.reading_codecs``, with this invocation's ``identity``); a store
        the config no longer names is read with the ``--identity`` given only. One function
        per store and identity, so the identity file is read once per invocation (a restore
        opens it before it asks to go on, and again to receive)."""
        from zrepl_py.stores.sealing import reading_codecs

        key = (name, self.identity)
        if key not in self._codecs:
            self._codecs[key] = reading_codecs(name, self.config.stores.get(name), self.identity)
        return self._codecs[key]

    def start_prefetch(self, tasks: Sequence[Task]) -> None:
        """Start running ``tasks`` in the background (``zrepl_py.runtime.prefetch``), replacing any
        earlier prefetch of this Context (its unstarted tasks are dropped)."""
        if self._prefetch is not None:
            self._prefetch.close()
        self.executors()  # created here, so the two threads share one pool
        self._prefetch = Prefetch(tasks)

    def prefetched(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The prefetched result for ``key``, else ``compute()`` (``Prefetch.take``)."""
        if self._prefetch is None:
            return compute()
        return self._prefetch.take(key, compute)

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
