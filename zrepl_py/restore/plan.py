"""Plan ``zbak restore``: which dataset, which snapshot, and the cheapest source that has it.

Sources, cheapest first (DESIGN.md "The four jobs", 2): the snapshot on the source host
itself (a local ``zfs send | zfs receive`` copy into ``--into``), a replica target that has
it (sent back over ssh), or an archived chain (full, then each incremental in order).
``--from local|HOST|STORE`` forces one. Planning reads the catalog, lists the dataset on its
host and on each replica host, and stats nothing in the stores (the fetch checks objects).
"""

from __future__ import annotations

import dataclasses
import logging

from zrepl_py.catalog.repository import CarriedSnapshot, VolumeRow
from zrepl_py.config.schema import LOCAL_HOST, parse_endpoint
from zrepl_py.context import Context
from zrepl_py.errors import DatasetNotFound, RestoreError, UsageError, ZbakError
from zrepl_py.restore.paths import ChainPath, archive_paths
from zrepl_py.restore.thaw import ThawEstimate, estimate
from zrepl_py.zfs.names import DatasetName

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Option:
    """One way to restore, or why it cannot be used.

    Attributes:
        source: ``"local"``, ``"replica"`` or ``"archive"``.
        label: ``local``, the replica host, or the store name (what ``--from`` takes).
        snapshots: for local/replica, the snapshots to send there, oldest first, ending at
            the target (a full of the first, then ``-I`` to the target).
        host / dataset: where those snapshots are (local/replica).
        path: for archive, the chain path.
        problem: why this option cannot be used, or None.
    """

    source: str
    label: str
    snapshots: tuple[CarriedSnapshot, ...] = ()
    host: str | None = None
    dataset: str | None = None
    path: ChainPath | None = None
    problem: str | None = None


@dataclasses.dataclass(frozen=True)
class RestorePlan:
    """What ``zbak restore`` will do.

    Attributes:
        host / dataset: the dataset being restored (as catalogued).
        target: the snapshot wanted.
        into: the dataset to create (on ``host``); must not exist.
        chosen: the option used.
        options: every option considered (for the plan shown).
        volumes: for archive, the volumes of each stream of the path.
        thaw: for archive, what thawing cold volumes takes (None when nothing is cold).
    """

    host: str
    dataset: str
    target: CarriedSnapshot
    into: str
    chosen: Option
    options: tuple[Option, ...]
    volumes: dict[int, list[VolumeRow]]
    thaw: ThawEstimate | None


def _resolve_dataset(ctx: Context, dataset: str | None) -> tuple[str, str]:
    """``(host, dataset)`` from the argument, or from the only job."""
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


def _resolve_snapshot(name: str, known: list[CarriedSnapshot], dataset: str) -> CarriedSnapshot:
    short = name[1:] if name.startswith("@") else name
    found = {c.guid: c for c in known if c.name == short}
    if not found:
        names = sorted({c.name for c in known}, key=lambda n: n)
        hint = ", ".join(names[-10:]) or "none"
        raise RestoreError(f"no snapshot @{short} of {dataset} is known locally, on a replica or"
                           f" in the archive (known: {hint})")
    if len(found) > 1:
        listed = ", ".join(f"guid {g} (createtxg {c.createtxg})" for g, c in found.items())
        raise RestoreError(f"@{short} of {dataset} names {len(found)} different snapshots over"
                           f" time ({listed}); the name is ambiguous")
    return next(iter(found.values()))


def _snapshots_to(snaps: list[CarriedSnapshot], guid: int) -> tuple[CarriedSnapshot, ...]:
    snaps = sorted(snaps, key=lambda s: s.createtxg)
    index = next(i for i, s in enumerate(snaps) if s.guid == guid)
    return tuple(snaps[: index + 1])


def plan_restore(ctx: Context, dataset_arg: str | None, to: str, into: str | None,
                 from_: str | None) -> RestorePlan:
    """Plan a restore (see the module docstring); nothing is changed.

    Raises:
        UsageError: no dataset named with several jobs; ``--from`` names no known source.
        RestoreError: unknown or ambiguous snapshot; no source has it; the destination exists.
    """
    host, dataset = _resolve_dataset(ctx, dataset_arg)
    into = into or dataset
    DatasetName(into)
    catalog = ctx.catalog()
    zfs = ctx.zfs(host, DatasetName(dataset).pool)
    local: list[CarriedSnapshot] = []
    try:
        tree = zfs.tree(dataset, recursive=False)
        local = [CarriedSnapshot(s.short, s.guid, s.createtxg) for s in tree.snapshots(dataset)]
    except DatasetNotFound:
        pass
    streams = catalog.streams(host=host, dataset=dataset)
    carried = catalog.carried(s.id for s in streams)
    known = list(local) + [c for cs in carried.values() for c in cs]
    known += [CarriedSnapshot(r.name, r.guid, r.createtxg)
              for r in catalog.snapshots(host=host, dataset=dataset, include_destroyed=True)]
    target = _resolve_snapshot(to, known, dataset)

    options: list[Option] = []
    if any(s.guid == target.guid for s in local):
        problem = None if into != dataset else (
            f"@{target.name} is on {dataset} already: pass --into POOL/NAME to copy it, or roll"
            " back with zfs rollback yourself")
        options.append(Option("local", "local", _snapshots_to(local, target.guid), host, dataset,
                               problem=problem))
    options += _replica_options(ctx, host, dataset, target)
    paths = archive_paths(streams, carried, target.guid)
    for store in sorted({p.store for p in paths}):
        options.append(Option("archive", store, path=next(p for p in paths if p.store == store)))
    if not any(o.source == "archive" for o in options):
        options.append(Option("archive", "archive", problem=f"no living chain carries @{target.name}"))
    chosen = _choose(options, from_, target, dataset)
    if zfs.exists(into):
        raise RestoreError(f"{host}:{into} exists; zbak restore never overwrites a dataset."
                           " Restore --into a new name (then rename), or remove it yourself")
    parent = into.rsplit("/", 1)[0]
    if "/" in into and not zfs.exists(parent):
        raise RestoreError(f"the parent {host}:{parent} of {into} does not exist: create it first")
    volumes: dict[int, list[VolumeRow]] = {}
    thaw = None
    if chosen.path is not None:
        volumes = {s.id: catalog.volumes(s.id) for s in chosen.path.streams}
        thaw = estimate(chosen.path.streams, volumes, ctx.config.restore)
        thaw = thaw if thaw.objects else None
    return RestorePlan(host, dataset, target, into, chosen, tuple(options), volumes, thaw)


def _replica_options(ctx: Context, host: str, dataset: str, target: CarriedSnapshot) -> list[Option]:
    options = []
    for cursor in ctx.catalog().cursors():
        if cursor.method != "zfs" or (cursor.source_host, cursor.source_dataset) != (host, dataset):
            continue
        where = parse_endpoint(cursor.target, allow_directory=True)
        label = where.host
        try:
            dst = ctx.zfs(where.host, DatasetName(cursor.target_location).pool)
            tree = dst.tree(cursor.target_location, recursive=False)
        except ZbakError as exc:
            options.append(Option("replica", label, problem=f"cannot list {cursor.target_location}"
                                  f" on {where.host}: {exc}"))
            continue
        snaps = [CarriedSnapshot(s.short, s.guid, s.createtxg)
                 for s in tree.snapshots(cursor.target_location)]
        if not any(s.guid == target.guid for s in snaps):
            options.append(Option("replica", label, problem=f"{where.host}:{cursor.target_location}"
                                  f" has no @{target.name}"))
            continue
        options.append(Option("replica", label, _snapshots_to(snaps, target.guid), where.host,
                              cursor.target_location))
    return options


def _choose(options: list[Option], from_: str | None, target: CarriedSnapshot,
            dataset: str) -> Option:
    usable = [o for o in options if o.problem is None]
    if from_ is not None:
        named = [o for o in options if from_ in (o.label, o.source)]
        if not named:
            labels = ", ".join(sorted({o.label for o in options}))
            raise UsageError(f"--from {from_}: not a source of {dataset} (sources: {labels})")
        usable = [o for o in named if o.problem is None]
        if not usable:
            raise RestoreError(f"--from {from_}: {named[0].problem}")
    if not usable:
        reasons = "; ".join(f"{o.label}: {o.problem}" for o in options)
        raise RestoreError(f"nothing can restore {dataset}@{target.name}: {reasons}")
    return usable[0]
