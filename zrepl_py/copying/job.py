"""``zbak copy`` for one job: copy every stream of the job's datasets that the target store
lacks, oldest first (``copying.plan``), one stream at a time (``copying.stream``).

Under the job's lock (an archive or prune of the job waits), one run row per job and target
(``copy``, target ``STORE:DATASET``). Before anything, the target's catalog exports are
checked against this machine's high-water marks (``catalog.export.StoreGuard``, as archive
does: a rolled-back target stops the run), except the job's own mark when the catalog holds
none of the job's streams in the target: that mark is forgotten first (a refill of a lost
store, docs/copies.md#refilling-a-lost-store). After a run that is not a dry run, the job's
export in the target is rewritten with the target's streams. A dataset whose stream fails
stops there (its later streams apply on it) and the other datasets still run. Streams of a
codec chain the target does not store alike are re-encoded (``copying.reencode``): a sealed
one needs an identity that opens it, asked for before anything is copied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from zrepl_py.archive.throttle import Throttle
from zrepl_py.catalog.export import StoreGuard
from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import StreamRow
from zrepl_py.config.jobs import JobConfig
from zrepl_py.copying.inside import inside_s3
from zrepl_py.copying.lag import copy_source, wanted_in
from zrepl_py.copying.plan import CopyPlan, plan_copy
from zrepl_py.copying.reencode import Recoding
from zrepl_py.copying.stream import CopiedStream, StreamCopy, copy_stream
from zrepl_py.errors import IdentityNeeded, UsageError, ZbakError
from zrepl_py.invocation.context import Context, lock_key
from zrepl_py.observe.runlog import RunSet
from zrepl_py.pruning.archive import store_streams
from zrepl_py.stores.sealing import writing_codec
from zrepl_py.streams.codec import Codec, Sealing


@dataclasses.dataclass
class CopyResult:
    """One job's copy from store ``source`` to store ``target``.

    Attributes:
        plan: what the target lacked.
        copied: each stream copied (source row) with what copying it did.
        failed: the stream that failed per dataset, with the error.
        recodings: how the streams of each codec chain and recipients (:func:`stored_as`)
            the target does not store alike are re-encoded; the others are copied byte for
            byte.
    """

    job: str
    source: str
    target: str
    dry_run: bool
    plan: CopyPlan
    copied: list[tuple[StreamRow, CopiedStream]] = dataclasses.field(default_factory=list)
    failed: list[tuple[StreamRow, str]] = dataclasses.field(default_factory=list)
    recodings: dict[StoredAs, Recoding] = dataclasses.field(default_factory=dict)

    @property
    def stored_bytes(self) -> int:
        """Bytes put into the target by this run."""
        return sum(c.stored_bytes for _, c in self.copied)


def copy_pairs(ctx: Context, name: str, job: JobConfig, source: str | None,
               target: str | None) -> list[tuple[str, str]]:
    """The ``(from store, to store)`` pairs a copy of job ``name`` runs: to ``target``, else
    to every store of ``[jobs.NAME.copy.STORE]``; from ``source``, else the copy's ``from``,
    else the job's archive store.

    Raises:
        UsageError: no target and no ``[jobs.NAME.copy.STORE]``, no source (no archive
            store), the same store twice, or a name that is not under ``[stores]``.
    """
    if target is None and not job.copies:
        raise UsageError(f"job {name} has no [jobs.{name}.copy.STORE] in {ctx.config_path}:"
                         " name the store to copy to with --to STORE")
    pairs = []
    for to in [target] if target is not None else list(job.copies):
        origin = source or copy_source(job, to)
        if origin is None:
            raise UsageError(f"job {name} has no [jobs.{name}.archive] section in"
                             f" {ctx.config_path}: name the store to copy from with --from")
        known_stores(ctx, origin, to)
        if origin == to:
            raise UsageError(f"--from and --to are both store {to}: name two stores")
        pairs.append((origin, to))
    return pairs


def known_stores(ctx: Context, *names: str | None) -> None:
    """Check that every name given (None: not given) is a store of the config.

    Raises:
        UsageError: one is not under ``[stores]``.
    """
    for store in names:
        if store is not None and store not in ctx.config.stores:
            known = ", ".join(ctx.config.stores) or "none"
            raise UsageError(f"store {store!r} is not under [stores] in {ctx.config_path}"
                             f" (stores: {known})")


def copy_job(ctx: Context, name: str, job: JobConfig, *, source: str | None = None,
             target: str | None = None, dry_run: bool = False) -> list[CopyResult]:
    """Copy job ``name``'s streams for each pair of :func:`copy_pairs` (see the module
    docstring), one result per pair.

    Raises:
        UsageError: as :func:`copy_pairs`.
        IdentityNeeded: a stream to copy is sealed, the target writes another codec chain,
            and no identity opens the source (nothing is copied); IdentityRefused: the
            identity given opens none of its volumes (the run stops there).
        IdentityUnusable, ExtraMissing: an identity or recipient cannot be used, pyrage is
            missing.
        Locked: another run holds the job's lock (exit 3).
        CatalogReplay, CatalogExportCorrupt: the target's catalog export is older than this
            machine wrote, gone, or damaged.
        CatalogError, StoreError: reading the catalog, or listing or writing the target's
            export, failed (a stream's failure is in the result instead).
    """
    return [_copy(ctx, name, job, origin, to, dry_run)
            for origin, to in copy_pairs(ctx, name, job, source, target)]


def _copy(ctx: Context, name: str, job: JobConfig, source: str, target: str,
          dry_run: bool) -> CopyResult:
    """Copy job ``name``'s streams from store ``source`` to store ``target``."""
    catalog = ctx.catalog()
    host, root = job.source.host, str(job.source.dataset)
    src_backend, dst_backend = ctx.store(source), ctx.store(target)
    dst_cfg = ctx.config.stores[target]
    chosen = job.copies.get(target)
    classes = (chosen.storage_class if chosen else None) or dst_cfg.storage_class
    with ctx.lock(lock_key(job), "copy"), \
            RunSet(catalog, ctx.clock, name, "copy",
                   [] if dry_run else [f"{target}:{root}"]) as runs:
        guard = StoreGuard(dst_backend, target, ctx.state_dir, job=name)
        existing = store_streams(catalog, job, target)
        if not existing and not dry_run:
            guard.forget()  # a refill: docs/copies.md#refilling-a-lost-store
        if existing or not dry_run:  # a dry run of a refill forgets nothing, so checks none
            guard.check()
        originals = store_streams(catalog, job, source)
        plan = plan_copy(originals, existing, _wanted(ctx, job, catalog, target, source))
        result = CopyResult(name, source, target, dry_run, plan,
                            recodings=_recodings(ctx, job, plan, source, target))
        if dry_run:
            return result
        volumes = catalog.bulk_volumes(host=host, below=root, store=source)
        carried = catalog.bulk_carried(host=host, below=root, store=source)
        throttle = Throttle(dst_cfg.bandwidth_limit, ctx.clock)
        inside = inside_s3(source, ctx.config.stores[source], src_backend, target, dst_cfg,
                           dst_backend)
        there = {s.object_prefix: s.id for s in existing}
        prefixes = {s.id: s.object_prefix for s in originals}
        stopped: set[str] = set()
        for stream in plan.copy:
            if stream.dataset in stopped:
                continue
            parent = (None if stream.parent_id is None
                      else there.get(prefixes[stream.parent_id]))
            item = StreamCopy(
                stream, volumes.get(stream.id, ()), parent,
                classes.full if stream.kind == "full" else classes.incremental,
                carried.get(stream.id))
            try:
                copied = copy_stream(item, src_backend, dst_backend, catalog, ctx.clock.now,
                                     throttle, inside, result.recodings.get(stored_as(stream)))
            except UsageError:  # the identity opens none: neither would it the others
                if result.copied:
                    guard.publish(store_streams(catalog, job, target), ctx.clock.now())
                raise
            except ZbakError as exc:
                result.failed.append((stream, str(exc)))
                stopped.add(stream.dataset)
                continue
            there[stream.object_prefix] = copied.stream_id
            result.copied.append((stream, copied))
        guard.publish(store_streams(catalog, job, target), ctx.clock.now())
        record = runs.records[f"{target}:{root}"]
        record.bytes = result.stored_bytes
        if result.failed:
            record.result = "partial" if result.copied else "failed"
            record.error = "; ".join(f"{s.dataset}@{s.to_name}: {e}" for s, e in result.failed)
    return result


def _wanted(ctx: Context, job: JobConfig, catalog: Catalog, target: str,
            source: str) -> frozenset[str] | None:
    """``copying.lag.wanted_in`` over the job's streams (read only when the copy table of
    ``target`` has a ``retention``)."""
    chosen = job.copies.get(target)
    if chosen is None or chosen.retention is None:
        return None
    every = catalog.bulk_streams(host=job.source.host, below=str(job.source.dataset))
    return wanted_in(job, target, source, every, ctx.clock.now())


StoredAs = tuple[str, tuple[str, ...] | None]
"""A stream's codec chain (the catalog's ``compression``) and the recipients the catalog
records it was sealed to (None: plain, or not known)."""


def stored_as(stream: StreamRow) -> StoredAs:
    """How ``stream``'s volumes are stored, as far as a copy compares them."""
    return stream.compression, stream.sealed_to


def _recodings(ctx: Context, job: JobConfig, plan: CopyPlan, source: str,
               target: str) -> dict[StoredAs, Recoding]:
    """The :class:`Recoding` of each :func:`stored_as` among ``plan``'s streams that store
    ``target`` does not store alike (a stream's chain with the recipients it was sealed to,
    else store ``source``'s recipients now, ``Codec.stores_like``); the others are copied
    byte for byte, and a stream sealed to other keys than the target's is re-encoded
    (docs/sealed.md#changing-the-recipients). The target encodes at the job's archive
    ``compression_level`` (docs/copies.md#codec-chains).

    Raises:
        IdentityNeeded: a sealed chain to re-encode and no identity for store ``source``
            (exit 2; one line naming both stores).
        IdentityUnusable, ExtraMissing: the identity file or a recipient cannot be used,
            pyrage is missing.
    """
    kinds = sorted({stored_as(s) for s in plan.copy}, key=repr)
    if not kinds:
        return {}
    level = job.archive.compression_level if job.archive else Codec().level
    writes = writing_codec(target, ctx.config.stores[target], level)
    keys = writing_codec(source, ctx.config.stores[source], level).sealing
    opening = ctx.reading_codecs(source)
    recodings: dict[StoredAs, Recoding] = {}
    for kind in kinds:
        chain, sealed_to = kind
        sealing = keys if sealed_to is None else Sealing(sealed_to)
        if writes.stores_like(Codec.named(chain, sealing=sealing)):
            continue
        try:
            reads = opening(chain)
        except IdentityNeeded as exc:
            raise IdentityNeeded(f"store {target} writes {writes.name}, so store {source}'s"
                                 f" {chain} streams are re-encoded for it: {exc}") from None
        recodings[kind] = Recoding(reads, writes)
    return recodings


def copy_rows(results: Sequence[CopyResult]) -> list[dict[str, object]]:
    """One row per stream copied, failed, skipped or planned (dry run), for the CLI table
    and ``--json``."""
    rows: list[dict[str, object]] = []
    for r in results:
        base = {"job": r.job, "from": r.source, "to": r.target}
        codecs = {kind: recoding.label for kind, recoding in r.recodings.items()}
        done = {s.id: c for s, c in r.copied}
        failed = dict((s.id, e) for s, e in r.failed)
        for s in r.plan.copy:
            c = done.get(s.id)
            state = ("planned" if r.dry_run else "copied" if c else
                     "failed" if s.id in failed else "not reached")
            rows.append({**base, "dataset": s.dataset, "stream": _label(s), "result": state,
                         "codec": codecs.get(stored_as(s), s.compression),
                         "bytes": c.stored_bytes if c else 0,
                         "volumes": (f"{c.volumes_written} written, {c.volumes_kept} kept"
                                     if c else ""),
                         "problem": failed.get(s.id)})
        for skip in r.plan.skipped:
            rows.append({**base, "dataset": skip.stream.dataset, "stream": _label(skip.stream),
                         "result": "skipped", "codec": skip.stream.compression, "bytes": 0,
                         "volumes": "", "problem": skip.reason})
    return rows


def _label(s: StreamRow) -> str:
    return (f"full @{s.to_name}" if s.kind == "full"
            else f"incremental @{s.from_name} -> @{s.to_name}")

