"""How many CPUs this process may run on: what sizes zbak's worker threads and pipelines."""

from __future__ import annotations

import os


def usable_cpus() -> int | None:
    """CPUs this process may run on: its affinity mask (``sched_getaffinity(2)``, as ``zstd
    -T0`` and ``nproc`` count), else the machine's count; None when neither is known."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()
