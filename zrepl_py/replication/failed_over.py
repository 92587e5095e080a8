"""Replication's side of a failover: a target dataset carrying the ``zbak:failover`` mark
(``values.failover``) is the live copy, never received into or rolled back
(docs/decisions.md#failed-over-is-recorded-on-the-replica).

``replication.zfs_target`` reads the marks of the whole target tree (``failed_over``, one
listing) before any receive, and reads the one dataset's again right before a rollback
(``refuse_failed_over``), whatever the run's listing or the catalog said.
"""

from __future__ import annotations

from zrepl_py.errors import FailedOver, InvalidName
from zrepl_py.values.failover import FAILOVER_PROPERTY, FailoverMark
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName


def failed_over(zfs: Zfs, root: DatasetName, *, recursive: bool) -> dict[str, str]:
    """The datasets at (and with ``recursive`` below) ``root`` that carry a failover mark,
    with its value: one ``zfs get -H [-r] -s local -o name,value zbak:failover ROOT``
    (snapshots inherit the property, so ``-s local`` leaves them out).

    Raises:
        DatasetNotFound: ``root`` does not exist.
        ZfsError: the listing failed.
    """
    return zfs.set_here(root, FAILOVER_PROPERTY, recursive=recursive)


def failed_over_error(target: str, marks: dict[str, str]) -> FailedOver:
    """The ``FailedOver`` replication raises for ``marks`` (from ``failed_over``), naming
    the first dataset, when and by which job it was failed over, and what to do."""
    dataset, value = sorted(marks.items())[0]
    try:
        mark = FailoverMark.parse(value)
        when = (f"failed over by job {mark.job} at {mark.at:%Y-%m-%d %H:%M:%SZ}"
                f"{' (planned)' if mark.planned else ''}")
        job = mark.job
    except InvalidName:
        when, job = f"marked {FAILOVER_PROPERTY}={value!r}", "JOB"
    more = f" and {len(marks) - 1} more dataset(s)" if len(marks) > 1 else ""
    return FailedOver(
        f"{target}: {dataset}{more} {when}: it is the live copy now, so zbak does not "
        f"receive into it or roll it back. When the source is back: zbak failback {job}",
        marks)


def refuse_failed_over(zfs: Zfs, dataset: DatasetName) -> None:
    """Raise ``FailedOver`` when ``dataset`` carries a failover mark now (one ``zfs get``):
    asked right before a rollback, whatever an earlier listing said.

    Raises:
        FailedOver: it does.
        ZfsError: the property cannot be read.
    """
    # An inherited value counts too: an ancestor was failed over (a crash between two
    # datasets' marks leaves a child without its own).
    value = zfs.get_properties(dataset, [FAILOVER_PROPERTY]).get(FAILOVER_PROPERTY, "-")
    if value not in ("-", ""):
        raise failed_over_error(f"{zfs.host}:{dataset}", {str(dataset): value})
