"""Pause CPython's cyclic garbage collector while a catalog-sized structure is built.

Reading and checking 100,000 streams allocates a few hundred thousand tuples and small
objects, none of them in reference cycles; each allocation burst still triggers collections
that walk every live container (benchmarks/catalog.py, graph audit of 100,000 streams on
SQLite: 1.24 s with the collector running, 1.00 s with it paused in the decorated functions,
0.91 s with it off for the whole process). Reference counting still frees
everything at once; cycles made meanwhile are collected after the block.

A command's start-up is the same kind of burst: importing click, pydantic, the config schema
and SQLAlchemy makes some 100,000 classes, functions and dicts that live until exit, and the
collector walks them again at every collection while they are being made
(docs/decisions.md#commands-start-in-under-300-ms: 0.05 to 0.1 s of a 0.4 s ``zbak snapshot``).
Pausing alone only moves that work to the first collection after the pause, so ``end_startup`` also
freezes them (``gc.freeze``: moved to the permanent generation, never walked again). Only the
console entry point begins a start-up; the daemon ends its own before it schedules anything, and a
command that opens no catalog (``config check``, ``list datasets``, ``init``, ``serve``) runs to its
end with the collector off: it is short, and reference counting still frees everything but cycles.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def gc_paused(func: Callable[P, R]) -> Callable[P, R]:
    """Decorate ``func`` to run with the cyclic collector disabled (re-enabled after it,
    unless it was already off: nested calls are fine)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if not gc.isenabled():
            return func(*args, **kwargs)
        gc.disable()
        try:
            return func(*args, **kwargs)
        finally:
            gc.enable()

    return wrapper


_starting = False


def begin_startup() -> None:
    """Turn the cyclic collector off for this process's start-up (the console entry point
    calls it first), unless it is off already. ``end_startup`` turns it back on."""
    global _starting
    if gc.isenabled():
        gc.disable()
        _starting = True


def end_startup() -> None:
    """End the start-up ``begin_startup`` began (else do nothing, as on a second call):
    freeze every object made so far (the loaded modules, the config, whatever garbage the
    imports left: about 1 % of what they made) and turn the collector back on.

    Called where a command has loaded what its work needs: when the Context opens the
    catalog, and when the daemon starts.
    """
    global _starting
    if _starting:
        _starting = False
        gc.freeze()
        gc.enable()
