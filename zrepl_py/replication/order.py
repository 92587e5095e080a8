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

from collections.abc import Collection, Sequence

from zrepl_py.zfs.names import DatasetName

MOST_OVER_SSH = 8
"""The default never passes this: every transfer to a host is a session of one shared ssh
connection, and sshd allows 10 sessions per connection (sshd_config(5) ``MaxSessions``)."""
PER_CPU = 4
"""Default transfers per CPU: a small dataset's pipeline mostly waits (on zfs, on ssh), so
several per CPU keep the CPUs busy. On 2 CPUs (zfs-fuse, sshd on 127.0.0.1, medians of 5-6
interleaved runs; benchmarks/replication.py's test bed), since small datasets go without the
receive buffer (``zfs_target.SMALL_DATASET``): a tree of 101 datasets of 4 KiB took 2.49 s
three at once, 2.37 s four, 2.24 s six and 2.23 s eight; its nightly cycle (16 KiB new in
each) 3.66 s four at once and 3.30 s eight; 8 datasets of 32 MiB 1.50 s four at once and
1.37 s eight. (With a receive buffer in every pipeline, 20 tiny datasets had taken 0.39 s
four at once and 0.50 s eight.)"""


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
