"""``zbak init`` checks: every source dataset, target host and store answers.

Each check yields one ``Check`` row; a failing check never stops the others, so one run of
``zbak init`` lists every problem at once. A target is checked for the method the job will
really use: ZFS targets by probing the pool; directory targets, and ZFS targets on a host
without zfs that method ``auto`` replicates with rsync (``rsync_target.no_zfs_fallback``),
by running ``rsync --version`` there (no ``zpool get`` on an rsync host). Each store
probes itself (``Backend.probe``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from zrepl_py.checks.source import missing_source, source_errors
from zrepl_py.config.hosts import Endpoint
from zrepl_py.config.jobs import JobConfig, no_zfs_fallback
from zrepl_py.errors import CommandFailed, ExitStatus, ZbakError
from zrepl_py.invocation.context import Context
from zrepl_py.proc.executor import COMMAND_NOT_FOUND
from zrepl_py.zfs.capabilities import Capabilities
from zrepl_py.zfs.client import Zfs

if TYPE_CHECKING:
    from zrepl_py.stores.settings import StoreConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Check:
    """One preflight result: what was checked, whether it passed, and the detail.
    ``status`` is the exit status a failed check asks of ``zbak init``: ``USAGE`` (2) when
    the config must change (a lock store whose bucket cannot lock objects), else ``FAILED``."""

    subject: str
    ok: bool
    detail: str
    status: ExitStatus = ExitStatus.FAILED


def _capabilities_text(caps: Capabilities) -> str:
    flags = [f.name for f in dataclasses.fields(caps) if getattr(caps, f.name) is True]
    version = f"pool v{caps.pool_version}, " if caps.pool_version else ""
    return version + ("features: " + ", ".join(flags) if flags else "no optional features")


def _check_target(ctx: Context, job: JobConfig, target: Endpoint) -> str:
    """Check one replication target by the method the job will use; return a detail line.

    Raises:
        ZbakError: the target cannot be used (unreachable, no pool, no rsync, ...).
    """
    note = ""
    if target.dataset is not None:
        try:
            zfs = ctx.zfs(target.host, target.dataset.pool)
        except CommandFailed as exc:
            directory = no_zfs_fallback(job, target, exc)
            if directory is None:
                raise
            note = f"; no zfs there: method auto copies with rsync into {directory.directory}"
        else:
            return _capabilities_text(zfs.capabilities)
    try:
        done = ctx.executors().get(target.host).run(["rsync", "--version"])
    except CommandFailed as exc:
        if exc.returncode != COMMAND_NOT_FOUND:
            raise
        raise ZbakError(f"no rsync on {target.host}, which this target needs: install rsync "
                        "there") from exc
    return done.text.splitlines()[0] + note


SourceCheck = Callable[[Context, str, JobConfig, Zfs], "Check | None"]
"""A further check of a job whose source answered: ``(ctx, job name, job, its Zfs client)
-> Check`` (None: nothing to say about that job); it may raise ZbakError (then a failed
row names the error)."""


def run_checks(ctx: Context, *, source_checks: Sequence[SourceCheck] = ()) -> Iterator[Check]:
    """Check every job source, replication target host and store of the config.

    ``source_checks`` run for each job whose source exists, right after its row: ``zbak
    init`` passes ``snapshots.inventory.selection_check`` (what a ``[select]`` job selects),
    which lives above this package."""
    for name, job in ctx.config.jobs.items():
        source = job.source
        assert source.dataset is not None  # parse_endpoint(allow_directory=False)
        subject = f"job {name}: source {source}"
        try:
            with source_errors(ctx, name, job):
                zfs = ctx.zfs(source.host, source.dataset.pool)
                found = zfs.exists(str(source.dataset))
            missing = None if found else missing_source(ctx, name, job)
            if missing is not None:
                yield Check(subject, False, str(missing))
            else:
                yield Check(subject, True, _capabilities_text(zfs.capabilities))
                for source_check in source_checks:
                    row = source_check(ctx, name, job, zfs)
                    if row is not None:
                        yield row
        except ZbakError as exc:
            yield Check(subject, False, str(exc))
        for target in job.replicate.endpoints() if job.replicate else []:
            subject = f"job {name}: target {target}"
            try:
                yield Check(subject, True, _check_target(ctx, job, target))
            except ZbakError as exc:
                yield Check(subject, False, str(exc))
    for name, settings in ctx.config.stores.items():
        try:  # the store probes itself (Backend.probe): ExtraMissing, StoreError
            yield Check(f"store {name}", True, ctx.store(name).probe())
        except ZbakError as exc:
            yield Check(f"store {name}", False, str(exc), exc.exit_status)
        if settings.age is not None:
            yield _sealing_check(name, settings)


def _sealing_check(name: str, settings: StoreConfig) -> Check:
    """A sealed store's recipients and identity file (``stores.sealing.describe_sealing``):
    unusable ones fail with exit 2; an identity matching no recipient passes with a warning
    (a restore host may keep a key of an older chain)."""
    # here, not above: `zbak snapshot` imports this module (``Check``), and the codec chain
    # would load zstandard into every snapshot run
    from zrepl_py.stores.sealing import describe_sealing

    subject = f"store {name}: sealing"
    try:
        detail, matched = describe_sealing(name, settings)
    except ZbakError as exc:
        return Check(subject, False, str(exc), exc.exit_status)
    if not matched:
        log.warning("store %s: %s", name, detail)
    return Check(subject, True, detail)
