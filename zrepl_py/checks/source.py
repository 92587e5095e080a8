"""A job's source dataset gone missing, said in the config's words
(docs/decisions.md#a-missing-source-is-named-in-the-words-of-the-config).

zfs says "cannot open 'tank': no such pool" or "dataset does not exist" about whichever
command met the gap first (a capability probe, a snapshot, a listing). Each command that
works on a job's source wraps that work in ``source_errors``: a failure zfs classifies as
"does not exist" is checked against the source, and when the source or its pool is what
is missing it becomes ``SourceMissing`` naming the dataset, the pool, the job and the file.
The check runs only after such a failure, so a run that works pays nothing for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from zrepl_py.config.jobs import JobConfig
from zrepl_py.errors import CommandFailed, DatasetNotFound, SourceMissing, ZbakError
from zrepl_py.invocation.context import Context
from zrepl_py.zfs.errors import map_error


def missing_source(ctx: Context, name: str, job: JobConfig) -> SourceMissing | None:
    """Look at the job's source: the error saying what is missing, or None when the dataset
    exists or its host cannot tell (unreachable, or a forced command refusing the probe:
    the caller keeps its own error then).

    Two reads at most on the source host: ``zfs get type DATASET``, then the pool's.
    """
    source = job.source
    pool = source.dataset.pool
    try:
        zfs = ctx.zfs(source.host)
        if zfs.exists(str(source.dataset)):
            return None
        pool_gone = not zfs.exists(pool) if pool != str(source.dataset) else True
    except ZbakError:
        return None
    where = f"source dataset {source.dataset}"
    if not source.is_local:
        where += f" on host {source.host}"
    config = f"(job {name}, file {ctx.config_path})"
    if pool_gone:
        return SourceMissing(f"{where}: pool {pool} does not exist {config}: import it"
                             f" (zpool import {pool}) or fix jobs.{name}.dataset")
    return SourceMissing(f"{where} does not exist {config}: create it or fix jobs.{name}.dataset")


@contextlib.contextmanager
def source_errors(ctx: Context, name: str, job: JobConfig) -> Iterator[None]:
    """Run the block; a zfs/zpool failure that says something does not exist is raised as
    ``SourceMissing`` (from the original) when the job's source or its pool is missing,
    else unchanged.

    Raises:
        SourceMissing: see above; whatever else the block raises passes through.
    """
    try:
        yield
    except CommandFailed as exc:
        if not isinstance(map_error(exc), DatasetNotFound):
            raise
        missing = missing_source(ctx, name, job)
        if missing is None:
            raise
        raise missing from exc
