"""``zbak restore DATASET --to @SNAP --path PATH... --into-dir DIR``: the driver.

``plan_file_restore`` reads the facts (``restore.gather``: nothing changes) and plans
(``files.plan``); ``restore_files`` carries the plan out:

1. DIR is created when missing, and a requested path already in it stops everything unless
   ``--overwrite``, before anything is read or received;
2. archive only: under the scratch dataset's lock, the leftovers of killed file restores are
   removed (``files.scratch``), then the chain is received into the scratch dataset by the
   dataset restore's engine (``restore.execute``: thaw first, every volume verified before
   ``zfs receive``), unless it holds the snapshot already;
3. the files are read where the snapshot is (``files.access.open_tar``) and written into
   DIR (``files.extract``); the stream is read to its end, so a ``tar`` that failed is seen;
4. archive only: the scratch dataset is destroyed, on success and on failure; a restore
   waiting for a thaw (exit 75) keeps what it received for the rerun.

Members refused on the way (``files.extract``) are listed and make the run fail (exit 1)
after everything else was restored.
"""

from __future__ import annotations

import dataclasses
import logging

from zrepl_py.catalog.rows import LOCAL_HOST
from zrepl_py.errors import RestoreError, ThawPending, ZbakError
from zrepl_py.files.access import open_tar
from zrepl_py.files.extract import Extracted, drain, extract, prepare_directory
from zrepl_py.files.plan import FilePlan, plan_files, scratch_child
from zrepl_py.files.scratch import destroy_scratch, lock_key, remove_leftovers
from zrepl_py.invocation.context import Context
from zrepl_py.restore.execute import RestoreOutcome, execute_restore
from zrepl_py.restore.gather import destination_facts, gather_restore
from zrepl_py.restore.plan import choose_source
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.names import DatasetName

log = logging.getLogger(__name__)


class FilesRefused(RestoreError):
    """Some members of the snapshot's stream were not restored (``files.extract``): the
    rest was; each refused one is a line of the message."""

    def __init__(self, extracted: Extracted, into: str):
        self.extracted = extracted
        super().__init__(f"{len(extracted.refused)} member(s) not restored into {into}"
                         f" ({extracted.members} restored)")

    def lines(self) -> list[str]:
        """The summary, then one line per refused member."""
        return [str(self), *(f"not restored: {line}" for line in self.extracted.refused)]


@dataclasses.dataclass(frozen=True)
class FileOutcome:
    """What ``restore_files`` did.

    Attributes:
        extracted: what was written into DIR.
        received: for the archive, what was received into the scratch dataset (None when
            nothing was, or for local and replica sources).
        into_dir: DIR's real path.
    """

    extracted: Extracted
    received: RestoreOutcome | None
    into_dir: str


def plan_file_restore(ctx: Context, dataset: str | None, to: str, from_: str | None,
                      paths: tuple[str, ...], into_dir: str, *, overwrite: bool) -> FilePlan:
    """Gather and plan (the module doc); nothing changes.

    Raises:
        UsageError: see ``restore.gather.resolve_dataset``; ``--from`` names no source.
        RestoreError: no source has the snapshot; the archive is the only source and
            ``[restore] scratch`` is not set, or its dataset is missing.
        CatalogError: the catalog cannot be read.
    """
    facts = gather_restore(ctx, dataset, None, destination=False)
    choice = choose_source(facts, to, from_)
    if choice.chosen.source == "archive":
        scratch = ctx.config.restore.scratch
        if scratch is None:
            raise RestoreError(
                f"@{choice.target.name} of {facts.dataset} is only in the archive"
                f" ({choice.reason}): reading its files receives the chain into a scratch"
                f" dataset first; set [restore] scratch = \"POOL/PATH\" in {ctx.config_path}"
                " (a dataset on this machine), or restore the whole dataset with --into")
        child = scratch_child(DatasetName(scratch), facts.host, facts.dataset,
                              choice.target.guid)
        facts = dataclasses.replace(facts, into=destination_facts(ctx, LOCAL_HOST, child))
    return plan_files(facts, choice, paths, into_dir, overwrite=overwrite,
                      forced=from_ is not None)


def restore_files(ctx: Context, plan: FilePlan) -> FileOutcome:
    """Carry out ``plan`` (the module doc).

    Raises:
        FilesRefused: members were refused (everything else restored).
        PathUnreadable: a requested path is not in the snapshot (nothing written).
        RestoreError, ExtractError: DIR cannot be used, writing failed.
        ThawPending: cold volumes are thawing (exit 75); run again later.
        Everything ``restore.execute.execute_restore`` and ``files.access.open_tar`` raise.
    """
    root = prepare_directory(plan.into_dir, plan.paths, overwrite=plan.overwrite)
    with ctx.lock(f"{LOCAL_HOST}:{root}", "restore"):
        scratch = plan.scratch
        if scratch is None:
            return FileOutcome(_read(ctx, plan, root), None, root)
        with ctx.lock(lock_key(scratch), "restore"):
            return _from_archive(ctx, plan, root, scratch)


def _from_archive(ctx: Context, plan: FilePlan, root: str, child: DatasetName) -> FileOutcome:
    zfs = ctx.zfs(LOCAL_HOST, child.pool)
    parent = DatasetName(child.rpartition("/")[0])
    remove_leftovers(ctx, parent, child)
    try:
        received = None
        if plan.discard:
            log.warning("destroying %s, what an interrupted restore of another chain left,"
                        " before receiving", child)
            destroy_scratch(zfs, child)
        if plan.receive is not None:
            received = execute_restore(ctx, plan.receive)
            if received.locked:
                raise RestoreError(
                    f"{plan.dataset} is encrypted and its raw stream arrives without its key:"
                    f" its files cannot be read from {child}; restore the dataset with"
                    " --into, load its key and copy the files from it")
        extracted = _read(ctx, plan, root)
    except ThawPending:
        raise  # nothing was received this run; what earlier runs received stays for the next
    except BaseException:
        _destroy_after_failure(zfs, child)
        raise
    destroy_scratch(zfs, child)
    return FileOutcome(extracted, received, root)


def _destroy_after_failure(zfs: Zfs, child: DatasetName) -> None:
    """Destroy the scratch dataset after a failure; a failure to do so is logged (the next
    file restore removes it) and never hides the first error."""
    try:
        destroy_scratch(zfs, child)
    except ZbakError as exc:
        log.error("could not destroy the scratch dataset %s (%s): the next file restore"
                  " from the archive removes it", child, exc)


def _read(ctx: Context, plan: FilePlan, root: str) -> Extracted:
    """Stream the paths from where the snapshot is into ``root``; check the stream's end."""
    with open_tar(ctx, plan.read_host, plan.read_snapshot, plan.paths) as stream:
        extracted = extract(stream, root, plan.paths, overwrite=plan.overwrite)
        drain(stream)
    for line in extracted.warnings:
        log.warning("%s", line)
    if extracted.refused:
        raise FilesRefused(extracted, root)
    return extracted

