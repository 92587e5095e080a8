"""Run ``zbak ARGS...`` as a process with faults injected by wrapping: SIGKILL after its k-th
store or catalog step (docs/decisions.md#crash-tests-kill-at-every-step), and a store that
damages what it reads.

Usage: ``python tests/support/crash_runner.py [ZBAK ARGS...]`` with the environment (tests
build it with ``support.cli.faulty_zbak``):

``ZBAK_FAULT_KILL_AFTER=k``
    after the k-th step has completed, the process sends itself SIGKILL: no exception, no
    ``finally``, no atexit; exactly what a power cut or the OOM killer leaves behind (the
    pipeline stages die with it: ``setpriv --pdeathsig``). Unset: run to the end.
``ZBAK_FAULT_STEPS_FILE=path``
    each step is appended as ``COUNT<TAB>OP<TAB>KEY`` and fsync'ed before the next action, so
    the test knows every step of a run and which one was the last.

``ZBAK_FAULT_STORE={"flip_byte_at": N, "keys": "vol-000002", ...}``
    the ``FaultyBackend`` keyword arguments (JSON; ``append`` as hex) every store is opened
    with: data faults on ``get`` (truncate, flip, append, ``faulty_reads``) of the keys
    holding the ``keys`` string.
``ZBAK_FAULT_CALLS=path``
    every store call is appended as ``OP<TAB>KEY``, so the test sees what zbak read.

A step is a call that changes durable state: ``put`` and ``delete`` on a store (every store
is opened through ``support.backend.FaultyBackend`` around the real backend) and the catalog
writes of an archive or prune (``Catalog.add_stream``, ``set_stream_state``,
``condemn_streams``, ``delete_stream``). The factory ``stores.registry.open_store`` is replaced (every
store is opened through it, by ``Context.store``); the code under test is otherwise unchanged.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ``import support``

from support.backend import FaultyBackend

CATALOG_STEPS = ("add_stream", "set_stream_state", "condemn_streams", "delete_stream")


class Steps:
    """Counts steps across stores and the catalog; kills the process after step ``kill_after``."""

    def __init__(self, kill_after: int | None, log_path: str | None):
        self.kill_after = kill_after
        self.count = 0
        self.log = open(log_path, "a", encoding="utf-8") if log_path else None

    def step(self, op: str, key: object) -> None:
        """Record one completed step; SIGKILL the process when it is the k-th."""
        self.count += 1
        if self.log is not None:
            self.log.write(f"{self.count}\t{op}\t{key}\n")
            self.log.flush()
            os.fsync(self.log.fileno())
        if self.kill_after is not None and self.count >= self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)


def install(steps: Steps, faults: dict[str, Any] | None = None,
            calls_path: str | None = None) -> None:
    """Route every store (with the ``FaultyBackend`` ``faults``) and the catalog writes
    through ``steps``; log every store call to ``calls_path`` when given."""
    from zrepl_py.catalog import repository
    from zrepl_py.stores import registry as store_registry

    original = store_registry.open_store
    calls = open(calls_path, "a", encoding="utf-8") if calls_path else None  # closed when the process dies

    class Logged(FaultyBackend):
        def _enter(self, op: str, key: str | None) -> None:
            if calls is not None:
                calls.write(f"{op}\t{key}\n")
                calls.flush()
            super()._enter(op, key)

    @functools.wraps(original)
    def open_store(*args, **kwargs):
        return Logged(original(*args, **kwargs), **(faults or {}),
                      after_call=lambda _n, op, key: steps.step(op, key))

    store_registry.open_store = open_store

    for method in CATALOG_STEPS:
        real = getattr(repository.Catalog, method, None)
        if real is None:
            continue

        def wrapped(self, *args, _real=real, _method=method, **kwargs):
            result = _real(self, *args, **kwargs)
            steps.step(f"catalog.{_method}", args[0] if args else "")
            return result

        setattr(repository.Catalog, method, functools.wraps(real)(wrapped))


def main() -> int:
    """Install the step counter and run ``zbak`` with ``sys.argv[1:]``."""
    kill = os.environ.get("ZBAK_FAULT_KILL_AFTER")
    faults = json.loads(os.environ.get("ZBAK_FAULT_STORE", "{}"))
    if "append" in faults:
        faults["append"] = bytes.fromhex(faults["append"])
    install(Steps(int(kill) if kill else None, os.environ.get("ZBAK_FAULT_STEPS_FILE")),
            faults, os.environ.get("ZBAK_FAULT_CALLS"))
    from zrepl_py.cli import main as zbak_main

    return int(zbak_main(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
