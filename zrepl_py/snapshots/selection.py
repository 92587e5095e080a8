"""Which datasets of a job's tree the job works on: the selection (PURE).

Every command that walks a job's source tree (``zbak snapshot``, ``replicate``, ``archive``,
``prune``, ``audit``, ``status``, ``list datasets``) goes through ``select_datasets`` via
``snapshots.inventory``, so they all see the same datasets. The rules, in order, for each
listed filesystem or volume (the job's ``dataset`` is the root):

1. **A replica is never a source.** A dataset below the root that is a ZFS replica target
   of any job on the same host (``config.schema.replica_datasets``), or below one, is left
   out: whatever is received there belongs to that job's source. The root itself is the
   admin's explicit choice (a cascade replicating a replica onwards names it).
2. **Excludes** (``exclude``): the named children and everything below them.
3. **The property** (``[jobs.NAME.select]``, zfs-autobackup's model): the dataset's value of
   the user property, set on it or inherited (zfsprops(7)), must equal the job's ``value``.
   Any other value leaves it out, ``false`` by convention; a child may set the value again
   below a ``false`` parent. A value whose source is ``received`` (``zfs receive`` of a
   stream with properties), or inherited from a dataset where it was received, marks a
   replica: left out unless ``exclude_received = false`` (zfs-autobackup
   ``--exclude-received``). A value set locally on a replica is the admin's choice and counts.

Without ``select`` and outside rules 1 and 2, every dataset of the tree is selected (a
non-recursive job's tree is its root alone).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import cast

from zrepl_py.config.jobs import JobConfig, SelectConfig
from zrepl_py.zfs.model import PropertyValue
from zrepl_py.zfs.names import DatasetName

RECEIVED = "received"


@dataclasses.dataclass(frozen=True)
class Selection:
    """The outcome: datasets selected (tree order, parents first) and those left out with
    the reason, one line each (``zbak list datasets`` shows both)."""

    selected: tuple[DatasetName, ...]
    skipped: tuple[tuple[DatasetName, str], ...] = ()

    @property
    def left_out(self) -> tuple[str, ...]:
        """The names of the datasets left out."""
        return tuple(str(name) for name, _ in self.skipped)

    def reason(self, dataset: DatasetName | str) -> str | None:
        """Why ``dataset`` was left out, None when it was selected or never listed."""
        return next((why for name, why in self.skipped if name == dataset), None)


def is_excluded(dataset: DatasetName, root: DatasetName, exclude: Sequence[str]) -> bool:
    """True when ``dataset`` or one of its ancestors below ``root`` (a job's dataset) is in
    ``exclude`` (the job's ``exclude``: entries relative to ``root``, ``scratch`` or
    ``vm/tmp``, or absolute, ``tank/data/scratch``). ``root`` itself is never excluded.
    """
    if dataset == root:
        return False
    relative = dataset.relative_to(root)
    for entry in exclude:
        rel = DatasetName(entry).relative_to(root) if entry.startswith(f"{root}/") else entry
        if relative == rel or relative.startswith(rel + "/"):
            return True
    return False


def covers(job: JobConfig, left_out: Collection[str] = ()) -> Callable[[str], bool]:
    """Whether ``job`` covers a dataset (by name): its dataset, and with ``recursive`` its
    descendants that are neither excluded nor in ``left_out`` (``Selection.left_out`` of
    this run's listing; a dataset no longer listed, destroyed, still counts). Each name is
    judged once and remembered: commands over 100,000 streams ask once per stream
    (docs/decisions.md#catalog-commands-stay-fast-at-100000-streams)."""
    root = job.source.dataset
    skipped = frozenset(left_out)
    answers: dict[str, bool] = {}

    def covered(dataset: str) -> bool:
        found = answers.get(dataset)
        if found is None:
            found = answers[dataset] = dataset not in skipped and (dataset == root or (
                job.recursive and dataset.startswith(f"{root}/")
                and not is_excluded(DatasetName(dataset), root, job.exclude)))
        return found

    return covered


def _at_or_below(dataset: str, top: str) -> bool:
    return dataset == top or dataset.startswith(top + "/")


def replica_of(dataset: DatasetName, root: DatasetName,
               replicas: Mapping[DatasetName, str]) -> str | None:
    """Which replica target ``dataset`` is (or lies below), as ``replicas`` names it
    (``"job J -> TARGET"``); None for the root and for datasets outside every target."""
    if dataset == root:
        return None
    return next((who for top, who in sorted(replicas.items())
                 if _at_or_below(dataset, top) and not _at_or_below(root, top)), None)


def effective_source(value: PropertyValue, values: Mapping[DatasetName, PropertyValue],
                     setpoints: Mapping[str, str]) -> str:
    """The source of ``value`` where it is set: ``local``/``received``/... as listed, or for
    ``inherited from X`` the source of X (from ``values``, else ``setpoints``: the sources
    of ancestors above the listed tree); ``-`` when X's source is unknown."""
    origin = value.inherited_from
    if origin is None:
        return value.source
    found = values.get(cast(DatasetName, origin))  # a str finds the DatasetName (a str) key
    if found is not None and found.inherited_from is None:
        return found.source
    return setpoints.get(origin, "-")


def select_datasets(
    datasets: Sequence[DatasetName],
    root: DatasetName,
    *,
    exclude: Sequence[str] = (),
    select: SelectConfig | None = None,
    values: Mapping[DatasetName, PropertyValue] | None = None,
    setpoints: Mapping[str, str] | None = None,
    replicas: Mapping[DatasetName, str] | None = None,
) -> Selection:
    """Apply the rules of the module doc to a listed tree.

    Args:
        datasets: the tree's filesystems and volumes, root first (``Tree.datasets`` order).
        root: the job's dataset.
        exclude: the job's ``exclude`` entries.
        select: the job's ``[select]``; None selects by name alone.
        values: with ``select``, each dataset's value of ``select.property`` with its source
            (``Zfs.dataset_properties``); a dataset missing here counts as "not set".
        setpoints: sources (``local``/``received``) of datasets above ``root`` that a listed
            value is inherited from (``inherited from X`` names where it is set).
        replicas: ``config.schema.replica_datasets`` of the source host.

    Returns:
        the Selection.
    """
    values = values or {}
    chosen: list[DatasetName] = []
    skipped: list[tuple[DatasetName, str]] = []
    for dataset in datasets:
        why = _why_not(dataset, root, exclude, select, values, setpoints or {}, replicas or {})
        if why is None:
            chosen.append(dataset)
        else:
            skipped.append((dataset, why))
    return Selection(tuple(chosen), tuple(skipped))


def _why_not(dataset: DatasetName, root: DatasetName, exclude: Sequence[str],
             select: SelectConfig | None, values: Mapping[DatasetName, PropertyValue],
             setpoints: Mapping[str, str], replicas: Mapping[DatasetName, str]) -> str | None:
    replica = replica_of(dataset, root, replicas)
    if replica is not None:
        return f"a replica: target of {replica}"
    if is_excluded(dataset, root, exclude):
        return "in exclude"
    if select is None:
        return None
    value = values.get(dataset)
    if value is None or value.value == "-":
        return f"{select.property} is not set"
    if value.value != select.value:
        where = f" (inherited from {value.inherited_from})" if value.inherited_from else ""
        return f"{select.property}={value.value}{where}"
    source = effective_source(value, values, setpoints)
    if source == RECEIVED and select.exclude_received:
        where = f" from {value.inherited_from}" if value.inherited_from else ""
        return (f"a replica: {select.property} was received{where} (exclude_received)")
    return None
