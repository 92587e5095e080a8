"""Shared test-bed rules: a missing real component skips locally but fails in CI."""

from __future__ import annotations

import os
import shutil
import socket
import textwrap

import pytest


def strict() -> bool:
    """True in CI (``CI=true``) or with ``ZBAK_TEST_STRICT=1``: missing components fail the run."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") or bool(
        os.environ.get("ZBAK_TEST_STRICT")
    )


def unavailable(component: str, why: str) -> None:
    """Skip the test (or fail it in strict mode) because ``component`` cannot be started."""
    message = f"{component} unavailable: {why}"
    if strict():
        pytest.fail(message + " (strict mode: CI must run every real-component test)")
    pytest.skip(message)


def need_binary(component: str, name: str) -> str:
    """Return the path of executable ``name`` or mark ``component`` unavailable."""
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.access(p, os.X_OK)), None
    )
    if not path:
        unavailable(component, f"{name} not found (run scripts/setup-host.sh)")
    return path


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def hosts_table(name: str, host, **extra: object) -> str:
    """A ``[hosts.NAME]`` TOML table for a ``HostConfig`` (from ``SshServer.host_config()``
    or ``OpenZfsGuest.host_config()``), with ``extra`` keys (ints or strings) appended."""
    lines = [
        f"[hosts.{name}]",
        f'address = "{host.address}"',
        f"port = {host.port}",
        f'user = "{host.user}"',
        f'identity_file = "{host.identity_file}"',
        f'known_hosts = "{host.known_hosts}"',
    ]
    lines += [f"{key} = {value!r}".replace("'", '"') for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def replication_config(state_dir, host: str, host_config, dataset: str, targets: list[str],
                       *, connect_timeout: int, extra: str = "", recursive: bool = False) -> str:
    """A whole config: ``state_dir``, the ``[hosts.HOST]`` table of ``host_config``, and job
    ``j`` replicating ``dataset`` (and its children with ``recursive``) to ``targets``;
    ``extra`` (dedented) is appended, so it may add keys to ``[jobs.j.replicate]`` or tables
    after it."""
    quoted = ", ".join(f'"{target}"' for target in targets)
    tree = "recursive = true\n" if recursive else ""
    return (f'state_dir = "{state_dir}"\n'
            + hosts_table(host, host_config, connect_timeout=connect_timeout)
            + f'[jobs.j]\ndataset = "{dataset}"\n{tree}[jobs.j.replicate]\n'
            + f"targets = [{quoted}]\n" + textwrap.dedent(extra))
