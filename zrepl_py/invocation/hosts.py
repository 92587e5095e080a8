"""Pick the Executor for a config host name, and keep one SSH connection per host."""

from __future__ import annotations

import threading

from zrepl_py.config.hosts import LOCAL_HOST
from zrepl_py.config.schema import Config
from zrepl_py.errors import UsageError
from zrepl_py.proc.executor import Executor
from zrepl_py.proc.local import LocalExecutor


def executor_for(config: Config, host: str) -> Executor:
    """Return a new Executor for ``host``: LocalExecutor for ``"local"``, else an SSHExecutor.

    Local commands run as the zbak user itself (no ``sudo``); a remote host's known_hosts
    defaults to ``<config.state_dir>/known_hosts``. The SSHExecutor connects lazily; the
    caller closes it (or uses ``ExecutorPool``).

    Args:
        config: the loaded config.
        host: ``"local"`` or a key of ``config.hosts``.

    Raises:
        UsageError: ``host`` is not defined under ``[hosts]``.
    """
    if host == LOCAL_HOST:
        return LocalExecutor()
    try:
        host_config = config.hosts[host]
    except KeyError:
        raise UsageError(f"host {host!r} is not defined under [hosts]") from None
    from zrepl_py.proc.ssh import SSHExecutor  # paramiko: only when a remote host is used

    return SSHExecutor(host, host_config, known_hosts_default=config.state_dir / "known_hosts")


class ExecutorPool:
    """One Executor per host name, created on first use; closes them all on exit.

    Thread-safe. Usage::

        with ExecutorPool(config) as pool:
            pool.get("backup1").run(["zfs", "list", "-H"])

    Args:
        config: the loaded config.
    """

    def __init__(self, config: Config):
        self.config = config
        self._executors: dict[str, Executor] = {}
        self._lock = threading.Lock()

    def get(self, host: str) -> Executor:
        """Return the cached Executor for ``host`` (see ``executor_for``; raises UsageError)."""
        with self._lock:
            if host not in self._executors:
                self._executors[host] = executor_for(self.config, host)
            return self._executors[host]

    def close(self) -> None:
        """Close every SSH connection opened through this pool; the pool can be reused."""
        with self._lock:
            executors, self._executors = list(self._executors.values()), {}
        for executor in executors:
            close = getattr(executor, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> ExecutorPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
