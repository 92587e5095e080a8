"""Run ``zbak ARGS...`` as a process with faults injected by wrapping: SIGKILL after its k-th
store or catalog step (docs/decisions.md#crash-tests-kill-at-every-step), and a store that
damages what it reads.

Usage: ``python tests/support/crash_runner.py [ZBAK ARGS...]`` with the environment (tests
build it with ``support.cli.faulty_zbak``):

``ZBAK_FAULT_KILL_AFTER=k``
    after the k-th step has completed, the process sends itself SIGKILL: no exception, no
    ``finally``, no atexit; exactly what a power cut or the OOM killer leaves behind (the
    pipeline stages die with it: ``setpriv --pdeathsig``). Unset: run to the end.
``ZBAK_FAULT_KILL_AT=TEXT``
    SIGKILL after the first step whose ``OP<TAB>KEY`` (as the steps file writes it) contains
    TEXT: a kill at one named step (``zfs.full\tPOOL/rep/data/new ->``) without counting.
``ZBAK_FAULT_STEPS_FILE=path``
    each step is appended as ``COUNT<TAB>OP<TAB>KEY`` and fsync'ed before the next action, so
    the test knows every step of a run and which one was the last.
``ZBAK_FAULT_ZFS_STEPS=1``
    the zfs commands that change state count as steps too (``ZFS_STEPS`` of the ``Zfs``
    client, on this host or over ssh, and each send/receive step of replication or a
    failback), and so do the catalog writes of runs, cursors and failovers
    (``RECORD_STEPS``): the steps of ``zbak failover`` and ``zbak failback``.

``ZBAK_FAULT_STORE={"flip_byte_at": N, "keys": "vol-000002", ...}``
    the ``FaultyBackend`` keyword arguments (JSON; ``append`` as hex) every store is opened
    with: data faults on ``get`` (truncate, flip, append, ``faulty_reads``) of the keys
    holding the ``keys`` string.
``ZBAK_FAULT_CALLS=path``
    every store call is appended as ``OP<TAB>KEY``, so the test sees what zbak read.
``ZBAK_FAULT_RUN_BEFORE={"at": TEXT, "argv": [...]}``
    before the first store call whose ``STORE<TAB>OP<TAB>KEY`` contains TEXT reaches the
    store, ``argv`` runs to its end (it must exit 0): the world changes at one named point
    inside a run, e.g. a second store emptied between a prune's plan and its deletes.

A step is a call that changes durable state: ``put`` and ``delete`` on a store (every store
is opened through ``support.backend.FaultyBackend`` around the real backend) and the catalog
writes of an archive or prune (``Catalog.add_stream``, ``set_stream_state``,
``condemn_streams``, ``delete_stream``), and with ``ZBAK_FAULT_ZFS_STEPS`` the zfs and
catalog steps above. The factory ``stores.registry.open_store`` is replaced (every store is
opened through it, by ``Context.store``), and the methods named are wrapped on their classes
(a step is counted when the call returned); the code under test is otherwise unchanged.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ``import support``

from support.backend import FaultyBackend

CATALOG_STEPS = ("add_stream", "set_stream_state", "condemn_streams", "delete_stream")
ZFS_STEPS = ("set_property", "set_property_many", "inherit_property", "snapshot",
             "snapshot_many", "destroy_snapshot", "hold", "hold_many", "release",
             "release_many", "bookmark", "destroy_bookmark", "abort_resume", "rollback",
             "create_filesystem", "destroy_filesystem", "clone", "promote", "rename", "mount",
             "unmount")
RECORD_STEPS = ("start_run", "finish_run", "set_cursor", "set_cursors", "record_failover",
                "end_failover")


class Steps:
    """Counts steps across stores and the catalog; kills the process after step ``kill_after``."""

    def __init__(self, kill_after: int | None, log_path: str | None, kill_at: str | None = None):
        self.kill_after = kill_after
        self.kill_at = kill_at
        self.count = 0
        self.log = open(log_path, "a", encoding="utf-8") if log_path else None

    def step(self, op: str, key: object) -> None:
        """Record one completed step; SIGKILL the process when it is the k-th."""
        self.count += 1
        if self.log is not None:
            self.log.write(f"{self.count}\t{op}\t{key}\n")
            self.log.flush()
            os.fsync(self.log.fileno())
        if (self.kill_after is not None and self.count >= self.kill_after) \
                or (self.kill_at is not None and self.kill_at in f"{op}\t{key}"):
            os.kill(os.getpid(), signal.SIGKILL)


def _count(cls: type, methods: tuple[str, ...], prefix: str, steps: Steps) -> None:
    """Wrap ``methods`` of ``cls`` so that each call that returns is a step."""
    for method in methods:
        real = getattr(cls, method, None)
        if real is None:
            continue

        def wrapped(self, *args, _real=real, _method=method, **kwargs):
            result = _real(self, *args, **kwargs)
            steps.step(f"{prefix}{_method}", args[0] if args else "")
            return result

        setattr(cls, method, functools.wraps(real)(wrapped))


def _count_zfs(steps: Steps) -> None:
    """``ZBAK_FAULT_ZFS_STEPS``: the zfs commands that change state, every send/receive
    step (the module global callers look up, before ``failover.failback`` imports it) and
    the run, cursor and failover rows."""
    from zrepl_py.catalog import repository
    from zrepl_py.replication import zfs_target
    from zrepl_py.zfs.client import Zfs

    _count(Zfs, ZFS_STEPS, "zfs.", steps)
    _count(repository.Catalog, RECORD_STEPS, "catalog.", steps)
    real = zfs_target.execute_step

    @functools.wraps(real)
    def execute_step(step, dataset, target_ds, *args, **kwargs):
        result = real(step, dataset, target_ds, *args, **kwargs)
        steps.step(f"zfs.{type(step).__name__.lower()}", f"{dataset} -> {target_ds}")
        return result

    zfs_target.execute_step = execute_step


def install(steps: Steps, faults: dict[str, Any] | None = None,
            calls_path: str | None = None, *, zfs_steps: bool = False,
            run_before: dict[str, Any] | None = None) -> None:
    """Route every store (with the ``FaultyBackend`` ``faults``) and the catalog writes
    (and with ``zfs_steps`` the zfs commands and run records) through ``steps``; log every
    store call to ``calls_path`` when given; run ``run_before["argv"]`` once, before the
    first store call matching ``run_before["at"]`` (module doc)."""
    from zrepl_py.catalog import repository
    from zrepl_py.stores import registry as store_registry

    original = store_registry.open_store
    calls = open(calls_path, "a", encoding="utf-8") if calls_path else None  # closed when the process dies
    pending = dict(run_before or {})

    class Logged(FaultyBackend):
        def _enter(self, op: str, key: str | None) -> None:
            if calls is not None:
                calls.write(f"{op}\t{key}\n")
                calls.flush()
            if pending and pending["at"] in f"{self.name}\t{op}\t{key}":
                subprocess.run(pending.pop("argv"), check=True)
                pending.clear()
            super()._enter(op, key)

    @functools.wraps(original)
    def open_store(*args, **kwargs):
        return Logged(original(*args, **kwargs), **(faults or {}),
                      after_call=lambda _n, op, key: steps.step(op, key))

    store_registry.open_store = open_store
    _count(repository.Catalog, CATALOG_STEPS, "catalog.", steps)
    if zfs_steps:
        _count_zfs(steps)


def main() -> int:
    """Install the step counter and run ``zbak`` with ``sys.argv[1:]``."""
    kill = os.environ.get("ZBAK_FAULT_KILL_AFTER")
    faults = json.loads(os.environ.get("ZBAK_FAULT_STORE", "{}"))
    if "append" in faults:
        faults["append"] = bytes.fromhex(faults["append"])
    install(Steps(int(kill) if kill else None, os.environ.get("ZBAK_FAULT_STEPS_FILE"),
                  os.environ.get("ZBAK_FAULT_KILL_AT")),
            faults, os.environ.get("ZBAK_FAULT_CALLS"),
            zfs_steps=os.environ.get("ZBAK_FAULT_ZFS_STEPS") == "1",
            run_before=json.loads(os.environ.get("ZBAK_FAULT_RUN_BEFORE", "null")))
    from zrepl_py.cli import main as zbak_main

    return int(zbak_main(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
