"""``zbak init`` checks: every source dataset, target host and store answers.

Each check yields one ``Check`` row; a failing check never stops the others, so one run of
``zbak init`` lists every problem at once. A target is checked for the method the job will
really use: ZFS targets by probing the pool; directory targets, and ZFS targets on a host
without zfs that method ``auto`` replicates with rsync (``rsync_target.no_zfs_fallback``),
by running ``rsync --version`` there (issue 18 item 8: no ``zpool get`` on an rsync host).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import urlparse

from zrepl_py.checks.source import missing_source, source_errors
from zrepl_py.config.hosts import Endpoint
from zrepl_py.config.jobs import JobConfig, no_zfs_fallback
from zrepl_py.config.stores import StoreConfig
from zrepl_py.errors import CommandFailed, ZbakError
from zrepl_py.invocation.context import Context
from zrepl_py.proc.executor import COMMAND_NOT_FOUND
from zrepl_py.runtime.statedir import ensure_private_dir
from zrepl_py.zfs.client import Zfs


@dataclasses.dataclass(frozen=True)
class Check:
    """One preflight result: what was checked, whether it passed, and the detail."""

    subject: str
    ok: bool
    detail: str


def _capabilities_text(caps) -> str:
    flags = [f.name for f in dataclasses.fields(caps) if getattr(caps, f.name) is True]
    version = f"pool v{caps.pool_version}, " if caps.pool_version else ""
    return version + ("features: " + ", ".join(flags) if flags else "no optional features")


def check_store(store: StoreConfig) -> str:
    """Check one store answers; return a detail line.

    ``file://`` stores are created (mode 0700) if missing and must be writable; ``s3://``
    stores must answer HEAD on the bucket with the standard AWS credential chain.

    Raises:
        ZbakError: the store cannot be used.
    """
    url = urlparse(store.url)
    if url.scheme == "file":
        path = ensure_private_dir(Path(url.path))
        if not os.access(path, os.W_OK):
            raise ZbakError(f"store directory {path} is not writable")
        return f"directory {path} writable"
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    session = boto3.session.Session(profile_name=store.profile, region_name=store.region)
    client = session.client("s3", endpoint_url=store.endpoint)
    try:
        client.head_bucket(Bucket=url.netloc)
    except (ClientError, BotoCoreError) as exc:
        raise ZbakError(f"bucket {url.netloc!r} does not answer: {exc}") from None
    return f"bucket {url.netloc} reachable"


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
    for name, store in ctx.config.stores.items():
        try:
            yield Check(f"store {name}", True, check_store(store))
        except ZbakError as exc:
            yield Check(f"store {name}", False, str(exc))
