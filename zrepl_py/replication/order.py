"""How many datasets of a tree replicate at once, and which must wait for which (PURE).

A ``zfs receive`` of a new dataset needs its parent on the target (zfs-receive(8): "the
parent of the destination must exist"), so a dataset whose target does not exist yet waits
until the nearest dataset above it that the job covers has finished (its full stream has
created the parent); every other dataset (its target exists, or the dataset above it that
the job covers does) starts as soon as a transfer slot is free. Parents the job does not
cover (an excluded child's children) are created empty by the driver (``zfs create -p``).
zrepl's driver orders initial replications the same way. Nothing else orders datasets: two
different datasets never share a ``zfs receive``, a hold or a cursor, and one dataset's
steps run in order in one worker.
"""

from __future__ import annotations

from typing import Collection, Sequence

from zrepl_py.zfs.names import DatasetName

MOST_OVER_SSH = 8
"""The default never passes this: every transfer to a host is a session of one shared ssh
connection, and sshd allows 10 sessions per connection (sshd_config(5) ``MaxSessions``)."""
PER_CPU = 2
"""Default transfers per CPU: a small dataset's pipeline mostly waits (on zfs, on ssh), so
two per CPU keep the CPUs busy; 20 tiny datasets over ssh took 0.49 s one at a time, 0.39 s
four at once and 0.50 s eight at once on 2 CPUs (zfs-fuse, sshd on 127.0.0.1)."""


def default_concurrency(cpus: int | None) -> int:
    """Transfers at once when ``[replicate] concurrency`` is not set: ``PER_CPU`` per CPU
    (``cpus`` None: 1 CPU), at least 2, at most ``MOST_OVER_SSH``."""
    return max(2, min(MOST_OVER_SSH, PER_CPU * (cpus or 1)))


def prerequisites(datasets: Sequence[DatasetName], present: Collection[DatasetName]
                  ) -> dict[DatasetName, DatasetName | None]:
    """Which dataset each must wait for (see the module doc).

    Args:
        datasets: the source datasets the job covers.
        present: those of them whose target dataset exists now.

    Returns:
        ``{dataset: the covered dataset it waits for, or None}``.
    """
    covered = set(datasets)
    waits: dict[DatasetName, DatasetName | None] = {}
    for dataset in datasets:
        above = _nearest_covered_ancestor(dataset, covered)
        waits[dataset] = (above if above is not None and dataset not in present
                          and above not in present else None)
    return waits


def _nearest_covered_ancestor(dataset: DatasetName, covered: set[DatasetName]
                              ) -> DatasetName | None:
    name = str(dataset)
    while "/" in name:
        name = name.rsplit("/", 1)[0]
        if DatasetName(name) in covered:
            return DatasetName(name)
    return None
