"""Plan ``zbak restore DATASET --to @SNAP --path PATH... --into-dir DIR`` (PURE).

The source is chosen as for a whole dataset (``restore.plan.choose_source``: the snapshot on
the dataset's own host, then a ZFS replica, then an archive chain; ``--from`` forces one),
and the files are read where the snapshot is (docs/design.md#restoring-files):

- local or replica: from that host's snapshot (``files.access``): nothing is received;
- archive: the chain is first received into ``[restore] scratch`` as
  ``SCRATCH/zbak-files-<hex>`` (``files.scratch``) by the dataset restore's own engine
  (``restore.plan.plan_into``, ``restore.execute``: thaw, verification before receive,
  continuation of an interrupted receive), and the files are read from its snapshot on this
  machine; the plan says which streams are received and thawed first. A scratch dataset
  that holds the snapshot already (a run killed after the receive) is read as it is; one
  left by an interrupted restore of another chain is destroyed first (``discard``).
"""

from __future__ import annotations

import dataclasses
import hashlib

from zrepl_py.catalog.rows import LOCAL_HOST
from zrepl_py.errors import RestoreError
from zrepl_py.restore.facts import IntoFacts, RestoreFacts
from zrepl_py.restore.plan import RestorePlan, SourceChoice, plan_into
from zrepl_py.zfs.names import DatasetName, SnapshotName

SCRATCH_PREFIX = "zbak-files-"
"""Name prefix of the datasets a file restore receives into, directly below the scratch."""


def scratch_child(scratch: DatasetName, host: str, dataset: str, guid: int) -> DatasetName:
    """``SCRATCH/zbak-files-<12 hex>``: one name per snapshot of a dataset, so a rerun of
    an interrupted restore finds what it received (the hex: SHA-256 of ``HOST:DATASET@GUID``)."""
    digest = hashlib.sha256(f"{host}:{dataset}@{guid}".encode()).hexdigest()[:12]
    return scratch.child(f"{SCRATCH_PREFIX}{digest}")


@dataclasses.dataclass(frozen=True)
class FilePlan:
    """What ``zbak restore --path`` will do.

    Attributes:
        host / dataset: the dataset whose files are restored (as catalogued).
        choice: the source chosen and why (``restore.plan.SourceChoice``).
        paths: the requested paths (``files.paths.covering``).
        into_dir: the directory written into.
        overwrite: existing files are replaced.
        read_host / read_snapshot: where the files are read (for the archive: the scratch
            dataset's snapshot on this machine).
        receive: for the archive, the restore into the scratch dataset; None when it holds
            the snapshot already, or for local and replica sources.
        discard: for the archive, the scratch dataset exists from another interrupted
            restore and is destroyed before the receive.
    """

    host: str
    dataset: str
    choice: SourceChoice
    paths: tuple[str, ...]
    into_dir: str
    overwrite: bool
    read_host: str
    read_snapshot: SnapshotName
    receive: RestorePlan | None = None
    discard: bool = False

    @property
    def scratch(self) -> DatasetName | None:
        """The scratch dataset used, for the archive; else None."""
        return self.read_snapshot.dataset if self.choice.chosen.source == "archive" else None


def plan_files(facts: RestoreFacts, choice: SourceChoice, paths: tuple[str, ...],
               into_dir: str, *, overwrite: bool, forced: bool) -> FilePlan:
    """Plan reading ``paths`` of ``choice.target`` into ``into_dir``; for the archive,
    ``facts.into`` is the scratch dataset (``scratch_child``) and ``forced`` says the source
    was named with ``--from``.

    Raises:
        RestoreError: the archive is chosen and ``facts.into`` cannot hold the chain (its
            parent, the scratch, is missing).
    """
    chosen, target, into = choice.chosen, choice.target, facts.into

    def plan(host: str, snapshot: SnapshotName, receive: RestorePlan | None = None,
             discard: bool = False) -> FilePlan:
        return FilePlan(facts.host, facts.dataset, choice, paths, into_dir, overwrite, host,
                        snapshot, receive, discard)

    if chosen.source != "archive":
        assert chosen.host is not None and chosen.dataset is not None
        return plan(chosen.host,
                    SnapshotName.of(DatasetName(chosen.dataset), chosen.snapshots[-1].name))
    child = DatasetName(into.dataset)
    held = next((s for s in into.snapshots if s.guid == target.guid), None)
    if into.exists and held is not None:
        return plan(LOCAL_HOST, SnapshotName.of(child, held.name))
    discard = False
    try:
        receive = plan_into(facts, choice, forced=forced)
    except RestoreError:
        if not into.exists:
            raise
        # What an interrupted restore of another chain (or before its mark) left: zbak's
        # own scratch, destroyed and received again from the start.
        discard = True
        receive = plan_into(dataclasses.replace(facts, into=IntoFacts(into.host, into.dataset)),
                            choice, forced=forced)
    return plan(LOCAL_HOST, SnapshotName.of(child, target.name), receive, discard)
