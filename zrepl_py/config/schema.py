"""The config schema: the whole file as one frozen pydantic model, validated once at load
(docs/configuration.md; the sections as built: docs/design.md#config-toml).

Each section's tables live in a module of their own (``hosts``, ``catalog``, ``jobs`` with
``retention``, ``replicate`` and ``archive``, ``restore``, ``alerts``, ``daemon``; a store's
keys are its scheme's, ``zrepl_py.stores.registry``); this module holds the top-level
``Config`` and the checks that look across sections. Unknown keys are errors
(``extra="forbid"``) so a typo never silently disables a safety setting. Cross-references (a
job naming a host or store that is not defined) are checked by ``Config.reference_problems``
so the loader can name the exact key path.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Literal

from pydantic import field_validator

from zrepl_py.config.alerts import AlertsConfig, MetricsConfig
from zrepl_py.config.catalog import CatalogConfig
from zrepl_py.config.daemon import DaemonConfig
from zrepl_py.config.hosts import LOCAL_HOST, Endpoint, HostConfig
from zrepl_py.config.jobs import JobConfig
from zrepl_py.config.restore import RestoreConfig
from zrepl_py.stores.registry import AnyStoreConfig
from zrepl_py.values.fields import Table
from zrepl_py.values.names import is_config_name
from zrepl_py.zfs.names import DatasetName

DEFAULT_STATE_DIR = Path("/var/lib/zbak")


class Config(Table):
    """The whole config file."""

    state_dir: Path = DEFAULT_STATE_DIR
    """Catalog (SQLite default), locks and known_hosts live here (mode 0700)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    catalog: CatalogConfig = CatalogConfig()
    hosts: dict[str, HostConfig] = {}
    stores: dict[str, AnyStoreConfig] = {}
    jobs: dict[str, JobConfig] = {}
    restore: RestoreConfig = RestoreConfig()
    alerts: AlertsConfig = AlertsConfig()
    metrics: MetricsConfig = MetricsConfig()
    daemon: DaemonConfig = DaemonConfig()

    @field_validator("state_dir")
    @classmethod
    def _absolute_state_dir(cls, value: Path) -> Path:
        # Relative, it would follow the working directory: cron, systemd and a shell would
        # each find another catalog, locks and known_hosts.
        if not value.is_absolute():
            raise ValueError(f"{str(value)!r} is relative: give an absolute path"
                             f" (default {DEFAULT_STATE_DIR})")
        return value

    @field_validator("hosts", "stores", "jobs")
    @classmethod
    def _names(cls, value: dict[str, object]) -> dict[str, object]:
        for name in value:
            if not is_config_name(name):
                raise ValueError(f"name {name!r}: use letters, digits, '_', '.', '-' (max 64)")
        return value

    @field_validator("hosts")
    @classmethod
    def _no_local_host(cls, value: dict[str, HostConfig]) -> dict[str, HostConfig]:
        if LOCAL_HOST in value:
            raise ValueError(f"host name {LOCAL_HOST!r} is reserved for this machine")
        return value

    @property
    def catalog_url(self) -> str:
        """The SQLAlchemy URL of the catalog, with the SQLite default filled in."""
        return self.catalog.url or f"sqlite:///{self.state_dir / 'catalog.sqlite'}"

    def reference_problems(self) -> list[tuple[str, str]]:
        """Return ``(key_path, message)`` for every host or store a job or store names but
        nobody defines."""
        problems: list[tuple[str, str]] = []

        def need_host(host: str, key: str) -> None:
            if host != LOCAL_HOST and host not in self.hosts:
                problems.append((key, f"host {host!r} is not defined under [hosts]"))

        for name, job in self.jobs.items():
            need_host(job.source.host, f"jobs.{name}.dataset")
            if job.replicate:
                for i, target in enumerate(job.replicate.endpoints()):
                    need_host(target.host, f"jobs.{name}.replicate.targets[{i}]")
                    key = f"jobs.{name}.replicate.targets[{i}]"
                    if target.directory is not None and job.replicate.method == "zfs":
                        problems.append((key, "a directory target needs method 'rsync' or 'auto'"))
                    if target.directory is None and job.replicate.method == "rsync":
                        problems.append((key, "method 'rsync' needs a directory target (HOST:/dir)"))
                    if target.directory is not None and job.recursive:
                        problems.append((key, "an rsync directory target copies one dataset: "
                                              "use a ZFS target or one job per dataset"))
                    inside = _inside_source(job, target)
                    if inside is not None:
                        problems.append((key, inside))
            if job.drill is not None and job.archive is not None and self.restore.scratch is None:
                problems.append((f"jobs.{name}.drill",
                                 "drilling the archive store needs [restore] scratch ="
                                 " \"POOL/PATH\" (where drills restore)"))
            if job.archive and job.archive.store not in self.stores:
                problems.append(
                    (f"jobs.{name}.archive.store",
                     f"store {job.archive.store!r} is not defined under [stores]")
                )
            problems += _copy_problems(name, job, self.stores)
        for name, store in self.stores.items():
            for host in store.host_names():
                need_host(host, f"stores.{name}.url")
        return problems


def _copy_problems(name: str, job: JobConfig, stores: Collection[str]) -> list[tuple[str, str]]:
    """What is wrong with the job's ``[jobs.NAME.copy.STORE]`` tables: a store not under
    ``[stores]``, no store to copy from, or a copy from the store itself."""
    problems = []
    for store, copy in job.copies.items():
        key = f"jobs.{name}.copy.{store}"
        source = copy.source or (job.archive.store if job.archive else None)
        if store not in stores:
            problems.append((key, f"store {store!r} is not defined under [stores]"))
        if source is None:
            problems.append((key, "the job has no [archive] store: name the store to copy"
                                  " from with from = \"STORE\""))
        elif source == store:
            problems.append((f"{key}.from" if copy.source else key,
                             f"a copy of store {store} into itself: from names another store"))
        elif copy.source is not None and copy.source not in stores:
            problems.append((f"{key}.from", f"store {copy.source!r} is not defined under"
                                            " [stores]"))
    return problems


def replica_datasets(config: Config, host: str) -> dict[DatasetName, str]:
    """ZFS replica targets of every job on ``host`` (a config host name, ``local`` for this
    machine): ``{target dataset: "job J -> TARGET"}`` (pure). Whatever is received there is
    a replica, never a source a recursive walk may select (``snapshots.selection``)."""
    found: dict[DatasetName, str] = {}
    for name, job in config.jobs.items():
        for target in job.replicate.endpoints() if job.replicate else []:
            if target.dataset is not None and target.host == host:
                found.setdefault(target.dataset, f"job {name} -> {target}")
    return found


def _inside_source(job: JobConfig, target: Endpoint) -> str | None:
    """Why ``target`` replicates ``job`` into itself, or None (pure).

    A target in the source's own tree on the same host: the first run
    receives into the tree, the next ``zfs snapshot -r`` snapshots the replica too, and
    every later run finds the replica diverged. Hosts compare by their config name
    (``local`` whether written or not); the same dataset name on another host is fine.
    """
    source = job.source
    if target.dataset is None or target.host != source.host:
        return None
    where = "on this machine" if source.is_local else f"on host {source.host}"
    if target.dataset == source.dataset:
        return (f"the target is the source dataset {source.dataset} itself {where}: "
                "replicate to another dataset or host")
    if job.recursive and target.dataset.startswith(f"{source.dataset}/"):
        return (f"the target {target.dataset} is inside the recursive source "
                f"{source.dataset} {where}: each snapshot would include the replica and "
                "every later run would stop as diverged; replicate outside the source tree "
                "(e.g. another pool) or to another host")
    return None
