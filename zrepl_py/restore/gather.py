"""Gather what ``zbak restore`` plans from (the I/O half of the restore planner/driver pair).

``gather_restore`` reads, and changes nothing:

* the catalog: the dataset's streams per store (with the snapshots each carries and its
  volumes), its catalogued snapshots (destroyed ones too) and its replica cursors;
* the dataset on its own host, the replica targets and the ``--into`` side, each listed once;
* one listing per store holding streams of the dataset, to find objects gone from it.

Anything of the original dataset may be gone (the dataset, its pool, its host): a place that
cannot be listed becomes a fact with the reason (``Listing.problem``), never an error, so a
restore needs only the catalog, the source it uses and the ``--into`` parent
(docs/decisions.md#restore-needs-nothing-of-the-original-pool). ZFS capabilities are probed for the
``--into`` pool, never for the original one.
"""

from __future__ import annotations

from zrepl_py.catalog.rows import LIVING_STATES, StreamRow, VolumeRow
from zrepl_py.config.hosts import LOCAL_HOST, parse_endpoint
from zrepl_py.errors import DatasetNotFound, ObjectNotFound, StoreError, UsageError, ZbakError
from zrepl_py.invocation.context import Context
from zrepl_py.objects.layout import common_prefix
from zrepl_py.objects.manifest import CarriedSnapshot
from zrepl_py.restore.facts import IntoFacts, Listing, RestoreFacts, StoreFacts
from zrepl_py.restore.mark import RESTORING
from zrepl_py.stores.base import Backend, stat_recorded
from zrepl_py.zfs.names import DatasetName


def resolve_dataset(ctx: Context, dataset: str | None) -> tuple[str, str]:
    """``(host, dataset)`` from the argument, or from the only job.

    Raises:
        UsageError: no dataset named and the config has several jobs.
        InvalidName: the name breaks the ZFS naming rules.
    """
    if dataset is None:
        jobs = list(ctx.config.jobs.values())
        if len(jobs) != 1:
            raise UsageError(f"name the dataset to restore: {ctx.config_path} has {len(jobs)} jobs")
        source = jobs[0].source
        return source.host, str(source.dataset)
    endpoint = parse_endpoint(dataset, allow_directory=False)
    if endpoint.host != LOCAL_HOST or ":" in dataset:
        return endpoint.host, str(endpoint.dataset)
    for job in ctx.config.jobs.values():  # a dataset of a pull job lives on its host
        src = job.source
        if str(endpoint.dataset) == str(src.dataset) or str(endpoint.dataset).startswith(f"{src.dataset}/"):
            return src.host, str(endpoint.dataset)
    return LOCAL_HOST, str(endpoint.dataset)


def resolve_into(ctx: Context, host: str, dataset: str, into: str | None) -> tuple[str, str]:
    """``(host, dataset)`` to create: ``--into HOST:POOL/NAME``, ``--into POOL/NAME`` on the
    restored dataset's own host, or (no ``--into``) the restored dataset itself.

    Raises:
        UsageError: a malformed name, or a host that is neither ``local`` nor in the config.
    """
    if into is None:
        return host, dataset
    try:
        endpoint = parse_endpoint(into, allow_directory=False)
    except ValueError as exc:
        raise UsageError(f"--into {into}: {exc}") from None
    # A bare POOL/NAME stays on the dataset's host, as before HOST: was accepted.
    where = endpoint.host if ":" in into and "/" not in into.partition(":")[0] else host
    if where != LOCAL_HOST and where not in ctx.config.hosts:
        raise UsageError(f"--into {into}: host {where} is not in {ctx.config_path} (hosts:"
                         f" {', '.join(['local', *ctx.config.hosts])})")
    return where, str(endpoint.dataset)


def gather_restore(ctx: Context, dataset_arg: str | None, into: str | None, *,
                   destination: bool = True) -> RestoreFacts:
    """Read the facts a restore of ``dataset_arg`` into ``into`` (``resolve_into``; default:
    the dataset itself) is planned from (see the module docstring). Without
    ``destination`` the destination is not looked at (``IntoFacts`` of the dataset itself,
    nothing read): a file restore chooses its source first (``files.restore``).

    Raises:
        UsageError, InvalidName: as ``resolve_dataset``; ``into`` is not a dataset name.
        CatalogError: the catalog cannot be read.
    """
    host, dataset = resolve_dataset(ctx, dataset_arg)
    into_host, into_name = resolve_into(ctx, host, dataset, into)
    catalog = ctx.catalog()
    streams = catalog.streams(host=host, dataset=dataset)
    carried = catalog.carried(s.id for s in streams)
    known = [CarriedSnapshot(r.name, r.guid, r.createtxg)
             for r in catalog.snapshots(host=host, dataset=dataset, include_destroyed=True)]
    # One query for every volume (the scope also holds child datasets': filtered by id).
    volumes = catalog.bulk_volumes(host=host, below=dataset) if streams else {}
    stores = []
    for name in sorted({s.store for s in streams}):
        mine = tuple(s for s in streams if s.store == name)
        stores.append(store_facts(ctx, name, mine, {s.id: tuple(carried[s.id]) for s in mine},
                                   {s.id: tuple(volumes.get(s.id, ())) for s in mine}))
    replicas = replica_listings(ctx, host, dataset)
    where = destination_facts(ctx, into_host, into_name) if destination else IntoFacts(
        into_host, into_name)
    return RestoreFacts(host, dataset, listing(ctx, host, dataset), replicas, tuple(stores),
                        tuple(known), where, ctx.config.restore)


def replica_listings(ctx: Context, host: str, dataset: str) -> tuple[Listing, ...]:
    """One ``listing`` per ZFS replica of ``host:dataset`` the catalog knows (its cursors).

    Raises:
        CatalogError: the catalog cannot be read.
    """
    return tuple(listing(ctx, parse_endpoint(c.target, allow_directory=True).host,
                         c.target_location)
                 for c in ctx.catalog().cursors()
                 if c.method == "zfs" and (c.source_host, c.source_dataset) == (host, dataset))


def listing(ctx: Context, host: str, dataset: str) -> Listing:
    """List ``host:dataset``'s snapshots; a missing dataset, pool or host is a fact."""
    try:
        # No pool argument: probing capabilities needs the pool, which may be the one lost.
        tree = ctx.zfs(host).tree(dataset, recursive=False)
    except DatasetNotFound:
        return Listing(host, dataset, problem=f"{host}:{dataset} does not exist (or its pool is gone)")
    except ZbakError as exc:
        return Listing(host, dataset, problem=f"cannot list {host}:{dataset}: {exc}")
    snaps = sorted((CarriedSnapshot(s.short, s.guid, s.createtxg) for s in tree.snapshots(dataset)),
                   key=lambda s: s.createtxg)
    return Listing(host, dataset, tuple(snaps))


def destination_facts(ctx: Context, host: str, into: str) -> IntoFacts:
    """Whether ``host:into`` exists and can be created (its pool and parent exist), its
    snapshots and its ``RESTORING`` mark when it exists."""
    name = DatasetName(into)
    try:
        zfs = ctx.zfs(host, name.pool)
        if zfs.exists(into):
            mark = zfs.dataset_properties(into, [RESTORING], recursive=False).get(name, {})
            value = mark.get(RESTORING)
            return IntoFacts(host, into, exists=True, snapshots=listing(ctx, host, into).snapshots,
                             restoring=value.value if value and value.source == "local"
                             else None)
        parent = into.rsplit("/", 1)[0]
        if "/" in into and not zfs.exists(parent):
            return IntoFacts(host, into, problem=f"the parent {host}:{parent} of {into} does"
                             " not exist: create it first")
    except ZbakError as exc:
        return IntoFacts(host, into, problem=f"the pool {name.pool} of {host}:{into} cannot be"
                         f" used: {exc}; restore --into a dataset of a pool that exists"
                         " ([HOST:]POOL/NAME)")
    return IntoFacts(host, into)


def _volume_problem(backend: Backend, volume: VolumeRow, listed: dict[str, int]) -> str | None:
    """What keeps ``volume`` from being read as catalogued, by the store's listing (sizes of
    the newest versions); None when nothing does. A volume whose version the catalog
    records is asked for by that version when the listing differs (an overwrite or a delete
    marker since hides it there, docs/design.md#object-lock): one HEAD, only then."""
    size = listed.get(volume.key)
    if size != volume.stored_bytes and volume.version_id is not None:
        try:
            size = stat_recorded(backend, volume.key, volume.version_id).size
        except ObjectNotFound:
            size = None
        except StoreError as exc:
            return f"{volume.key} version {volume.version_id}: {exc}"
    if size == volume.stored_bytes:
        return None
    return (f"{volume.key} missing" if size is None else
            f"{volume.key} has {size} bytes, the catalog says {volume.stored_bytes}")


def store_facts(ctx: Context, name: str, streams: tuple[StreamRow, ...],
                 carried: dict[int, tuple[CarriedSnapshot, ...]],
                 volumes: dict[int, tuple[VolumeRow, ...]]) -> StoreFacts:
    """The store's facts, with ONE listing of the streams' common prefix (nothing is read)."""
    if name not in ctx.config.stores:
        return StoreFacts(name, streams, carried, volumes,
                          problem=f"store {name} is not in {ctx.config_path}")
    living = [s for s in streams if s.state in LIVING_STATES]
    if not living:
        return StoreFacts(name, streams, carried, volumes)
    try:
        prefix = common_prefix([s.object_prefix for s in living])
        backend = ctx.store(name)
        listed = backend.sizes(prefix)
    except ZbakError as exc:
        return StoreFacts(name, streams, carried, volumes, problem=f"cannot list store {name}: {exc}")
    damaged = {}
    for stream in living:
        problems = [problem for v in volumes[stream.id]
                    if (problem := _volume_problem(backend, v, listed)) is not None]
        if problems:
            damaged[stream.id] = "; ".join(problems[:2]) + (
                f"; {len(problems) - 2} more" if len(problems) > 2 else "")
    return StoreFacts(name, streams, carried, volumes, damaged)
