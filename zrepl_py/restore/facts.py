"""What a restore is planned from: plain facts ``gather.gather_restore`` reads and
``plan.plan_restore`` decides from (frozen values, no handles).

A module of its own so the pure planner loads none of the I/O that gathers them (the
invocation context, the ZFS client, the stores).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from zrepl_py.catalog.rows import StreamRow, VolumeRow
from zrepl_py.config.restore import RestoreConfig
from zrepl_py.objects.manifest import CarriedSnapshot


@dataclasses.dataclass(frozen=True)
class Listing:
    """The snapshots of one dataset somewhere (the original, or a replica target).

    Attributes:
        host / dataset: where.
        snapshots: its snapshots in createtxg order (empty when it cannot be listed).
        problem: why it could not be listed (dataset, pool or host gone), else None.
    """

    host: str
    dataset: str
    snapshots: tuple[CarriedSnapshot, ...] = ()
    problem: str | None = None


@dataclasses.dataclass(frozen=True)
class StoreFacts:
    """What one store holds of the dataset, per the catalog and one listing of the store.

    Attributes:
        name: the store's name in the config.
        streams: the dataset's streams in this store, any state, chain order.
        carried: stream id -> the snapshots it carries (createtxg order).
        volumes: stream id -> its volumes by index.
        damaged: stream id -> what is wrong with its volumes (missing or resized), for the
            living streams the listing checked (manifests are not needed to restore).
        problem: why the store could not be listed (not configured, unreachable), else None.
    """

    name: str
    streams: tuple[StreamRow, ...]
    carried: Mapping[int, tuple[CarriedSnapshot, ...]]
    volumes: Mapping[int, tuple[VolumeRow, ...]]
    damaged: Mapping[int, str] = dataclasses.field(default_factory=dict)
    problem: str | None = None


@dataclasses.dataclass(frozen=True)
class IntoFacts:
    """The destination: ``host:dataset`` to create.

    Attributes:
        exists: the dataset exists already.
        problem: why it cannot be created there (its parent or pool is missing, the host
            cannot be reached), else None.
        snapshots: an existing dataset's snapshots, oldest first.
        restoring: an existing dataset's ``RESTORING`` mark (``HOST:DATASET`` of the restore
            that created it and did not finish), else None.
    """

    host: str
    dataset: str
    exists: bool = False
    problem: str | None = None
    snapshots: tuple[CarriedSnapshot, ...] = ()
    restoring: str | None = None


@dataclasses.dataclass(frozen=True)
class RestoreFacts:
    """Everything ``plan.plan_restore`` decides from (plain data, no handles).

    Attributes:
        host / dataset: the dataset restored, as catalogued.
        local: the dataset on its own host.
        replicas: one listing per ZFS replica target of the dataset (catalog cursors).
        stores: one per store holding streams of the dataset, by name.
        catalogued: snapshots the catalog knows of the dataset (destroyed ones too).
        into: the destination.
        restore: the ``[restore]`` config (thaw tier and prices, for the cost estimate).
    """

    host: str
    dataset: str
    local: Listing
    replicas: tuple[Listing, ...]
    stores: tuple[StoreFacts, ...]
    catalogued: tuple[CarriedSnapshot, ...]
    into: IntoFacts
    restore: RestoreConfig
