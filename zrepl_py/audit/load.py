"""Read what the graph audit needs from the catalog, one query per table (bulk reads only).

The scope is a host and a dataset tree (one job) or the whole catalog. Snapshots-table rows
are read selectively (what :class:`~zrepl_py.audit.graph.GraphInput` needs: the snapshots the
cursors name and the newest archived ones): reading every snapshot would cost more than the
rest of the audit together on a large catalog, and so would a join of every carried snapshot
with the snapshots table (0.1-0.3 s for 196,000 rows on SQLite), so the createtxg cross-check
covers those rows only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from zrepl_py.audit.graph import ArchiveExpectation, CarriedTable, GraphInput, TargetListing
from zrepl_py.catalog.repository import Catalog, CursorRow

NAMES_UP_TO = 20_000
"""Carried snapshots are read with their names while the scope holds at most this many
streams; above it, findings name snapshots the catalog's snapshot rows do not by guid."""


def load_graph_input(
    catalog: Catalog,
    *,
    host: str | None = None,
    below: str | None = None,
    archives: Sequence[tuple[str, str]] = (),
    cursors: Sequence[CursorRow] = (),
    targets: Mapping[tuple[str, str], TargetListing] | None = None,
) -> GraphInput:
    """Load a :class:`GraphInput` for the streams of ``host`` at or below ``below``.

    Args:
        host, below: the scope (None: everything).
        archives: ``(job, store)`` pairs whose archive must keep up: every dataset in scope
            becomes an ArchiveExpectation, with the start of the job's last successful
            archive run of it to the store (None: never).
        cursors: the replica cursors to check (``Catalog.cursors``).
        targets: target listings gathered by the driver.

    Raises:
        CatalogError: the database failed.
    """
    streams = catalog.stream_links(host=host, below=below)
    names = len(streams) <= NAMES_UP_TO
    carried = CarriedTable.from_columns(
        *catalog.carried_columns(host=host, below=below, names=names))
    volumes = catalog.volume_totals(host=host, below=below)
    expectations, snapshots = [], []
    datasets = catalog.dataset_names(host=host, below=below) if archives else []
    for job, store in archives:
        seen = set()
        for row_host, dataset, last, newest in catalog.archive_heads(job, store, host=host,
                                                                     below=below):
            expectations.append(ArchiveExpectation(row_host, dataset, store, last))
            seen.add((row_host, dataset))
            if newest is not None:
                snapshots.append(newest)
        expectations += [ArchiveExpectation(h, n, store, None)
                         for h, n in datasets if (h, n) not in seen]
    snapshots += catalog.snapshots_by_guid(
        (c.source_host, c.source_dataset, c.guid) for c in cursors)
    return GraphInput(streams=streams, volumes=volumes, carried=carried, snapshots=snapshots,
                      cursors=cursors, archives=expectations, targets=targets or {})
