"""Gather what a job's drill is planned from (the I/O half of ``drill.plan``).

Reads, and changes nothing: the catalog (the streams of the job's datasets per store, their
carried snapshots and volumes, the catalogued snapshots, the job's ZFS replica cursors), one
listing per store and dataset (objects gone from it), the snapshots of each replica dataset
and the source's snapshots now (one listing of the job's tree). A place that cannot be
listed becomes a fact with the reason, never an error here.

Where each source's copies are restored (docs/drills.md#where-a-drill-restores): a store's
below ``[restore] scratch`` (``POOL/PATH`` on this machine); a replica's on the replica's own host,
below ``[hosts.HOST] scratch`` (for a target on this machine ``[restore] scratch`` when that
is on this machine), else below the target dataset's parent, next to the replica. Each source
gets a scratch name of its own (``drill.scratch.new_name``), each dataset ``SCRATCH/dN``.
"""

from __future__ import annotations

from zrepl_py.catalog.rows import LIVING_STATES, CursorRow, StreamRow
from zrepl_py.config.hosts import LOCAL_HOST, parse_endpoint
from zrepl_py.config.jobs import JobConfig
from zrepl_py.drill.plan import REPLICA, STORE, DrillFacts, SourceFacts, select_sources
from zrepl_py.drill.scratch import new_name
from zrepl_py.errors import DatasetNotFound, ZbakError
from zrepl_py.invocation.context import Context
from zrepl_py.objects.manifest import CarriedSnapshot
from zrepl_py.restore.facts import IntoFacts, Listing, RestoreFacts, StoreFacts
from zrepl_py.restore.gather import listing, store_facts
from zrepl_py.stores.sealing import identity_for
from zrepl_py.zfs.names import DatasetName

NOT_DRILLED = "not a source of this drill"
"""The problem of the dataset's own listing in a drill's restore facts: only the drilled
source may be used."""


def gather_drill(ctx: Context, name: str, job: JobConfig, from_: str | None = None
                 ) -> DrillFacts:
    """Read the facts the drill of job ``name`` is planned from (see the module doc), of
    the sources ``from_`` names (all when None; ``plan.select_sources``).

    Raises:
        UsageError: ``from_`` names no source of the job (before the dataset is listed).
        CatalogError: the catalog cannot be read.
    """
    catalog = ctx.catalog()
    host, root = job.source.host, str(job.source.dataset)
    known: dict[str, tuple[CarriedSnapshot, ...]] = {}
    for snap in catalog.snapshots(host=host, below=root, include_destroyed=True):
        known[snap.dataset] = (*known.get(snap.dataset, ()),
                               CarriedSnapshot(snap.name, snap.guid, snap.createtxg))
    streams = catalog.bulk_streams(host=host, below=root)
    sources = select_sources(name, [*_stores(ctx, job, streams, known),
                                    *_replicas(ctx, name, job, known)], from_)
    thaw = job.drill.thaw if job.drill is not None else False
    originals, unreadable = _originals(ctx, job)
    return DrillFacts(name, tuple(sources), originals, unreadable, thaw)


def _restore_facts(ctx: Context, host: str, dataset: str, known: tuple[CarriedSnapshot, ...],
                   into: IntoFacts, *, replicas: tuple[Listing, ...] = (),
                   stores: tuple[StoreFacts, ...] = ()) -> RestoreFacts:
    """Restore facts holding only the drilled source (the dataset itself is not one)."""
    return RestoreFacts(host, dataset, Listing(host, dataset, problem=NOT_DRILLED), replicas,
                        stores, known, into, ctx.config.restore)


def _stores(ctx: Context, job: JobConfig, streams: list[StreamRow],
            known: dict[str, tuple[CarriedSnapshot, ...]]) -> list[SourceFacts]:
    host = job.source.host
    by_store: dict[str, dict[str, list[StreamRow]]] = {}
    for stream in streams:
        by_store.setdefault(stream.store, {}).setdefault(stream.dataset, []).append(stream)
    scratch = ctx.config.restore.scratch
    where = parse_endpoint(scratch, allow_directory=False) if scratch is not None else None
    found = []
    for store, datasets in sorted(by_store.items()):
        living = {d: rows for d, rows in datasets.items()
                  if any(s.state in LIVING_STATES for s in rows)}
        if store not in ctx.config.stores or where is None:
            problem = (f"store {store} is not in {ctx.config_path}" if where is not None else
                       'nowhere to restore: set [restore] scratch = "POOL/PATH"')
            found.append(SourceFacts(store, STORE, where.host if where else LOCAL_HOST, None,
                                     (), problem=problem))
            continue
        target = new_name(str(where.dataset))
        ids = [s.id for rows in living.values() for s in rows]
        carried = ctx.catalog().carried(ids)
        volumes = ctx.catalog().bulk_volumes(host=host, below=str(job.source.dataset),
                                             store=store)
        facts = []
        for index, (dataset, rows) in enumerate(sorted(living.items())):
            mine = tuple(rows)
            restore = store_facts(ctx, store, mine, {s.id: tuple(carried.get(s.id, ()))
                                                     for s in mine},
                                  {s.id: tuple(volumes.get(s.id, ())) for s in mine})
            into = IntoFacts(where.host, f"{target}/d{index}")
            facts.append(_restore_facts(ctx, host, dataset, known.get(dataset, ()), into,
                                        stores=(restore,)))
        settings = ctx.config.stores[store]
        found.append(SourceFacts(store, STORE, where.host, target, tuple(facts),
                                 needs_identity=settings.needs_identity,
                                 identity=identity_for(store, settings, ctx.identity) is not None))
    return found


def replica_scratch(ctx: Context, host: str, target: DatasetName) -> str | None:
    """The parent a drill of the replica ``host:target`` restores below (see the module
    doc); None when there is none (a target that is a pool, no scratch configured)."""
    settings = ctx.config.hosts.get(host)
    if settings is not None and settings.scratch is not None:
        return settings.scratch
    scratch = ctx.config.restore.scratch
    if host == LOCAL_HOST and scratch is not None:
        endpoint = parse_endpoint(scratch, allow_directory=False)
        if endpoint.is_local:
            return str(endpoint.dataset)
    parent, sep, _ = str(target).rpartition("/")
    return parent if sep else None


def _replicas(ctx: Context, name: str, job: JobConfig,
              known: dict[str, tuple[CarriedSnapshot, ...]]) -> list[SourceFacts]:
    host, root = job.source.host, str(job.source.dataset)
    by_target: dict[str, list[CursorRow]] = {}
    for cursor in ctx.catalog().cursors(name):
        if (cursor.method == "zfs" and cursor.source_host == host
                and (cursor.source_dataset == root
                     or cursor.source_dataset.startswith(root + "/"))):
            by_target.setdefault(cursor.target, []).append(cursor)
    order = {t: i for i, t in enumerate(job.replicate.targets if job.replicate else [])}
    found = []
    for target, cursors in sorted(by_target.items(), key=lambda t: (order.get(t[0], 1 << 30),
                                                                    t[0])):
        endpoint = parse_endpoint(target, allow_directory=False)
        parent = replica_scratch(ctx, endpoint.host, endpoint.dataset)
        if parent is None:
            found.append(SourceFacts(target, REPLICA, endpoint.host, None, (), problem=(
                f"nowhere to restore next to {endpoint.dataset}: set [hosts.{endpoint.host}]"
                ' scratch = "POOL/PATH"')))
            continue
        scratch = new_name(parent)
        facts = []
        for index, cursor in enumerate(sorted(cursors, key=lambda c: c.source_dataset)):
            copy = listing(ctx, endpoint.host, cursor.target_location)
            into = IntoFacts(endpoint.host, f"{scratch}/d{index}")
            facts.append(_restore_facts(ctx, host, cursor.source_dataset,
                                        known.get(cursor.source_dataset, ()), into,
                                        replicas=(copy,)))
        found.append(SourceFacts(target, REPLICA, endpoint.host, scratch, tuple(facts)))
    return found


def _originals(ctx: Context, job: JobConfig) -> tuple[dict[str, Listing], str | None]:
    """The source's snapshots now, per dataset of the job's tree (one listing), or why the
    tree cannot be listed."""
    host, root = job.source.host, str(job.source.dataset)
    try:
        tree = ctx.zfs(host).tree(root, recursive=job.recursive)
    except DatasetNotFound:
        return {}, f"{host}:{root} does not exist"
    except ZbakError as exc:
        return {}, f"cannot list {host}:{root}: {exc}"
    return {str(info.name): Listing(host, str(info.name), tuple(sorted(
        (CarriedSnapshot(s.short, s.guid, s.createtxg) for s in tree.snapshots(info.name)),
        key=lambda s: s.createtxg))) for info in tree.datasets}, None
