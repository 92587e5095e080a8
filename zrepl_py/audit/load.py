"""Read what the graph audit needs from the catalog (bulk reads only, no ORM objects).

The scope is a host and a dataset tree (one job) or the whole catalog. Every stream's chain
facts are read (``Catalog.stream_links``: the chains are resolved in Python); the volume and
carried-snapshot rules are checked by the database (``Catalog.screen_streams`` returns only
the failing stream ids; it runs in a thread while this one reads the links), and the detail
of volumes and carried snapshots is read afterwards for the few streams the findings
describe (:class:`~zrepl_py.audit.graph.Screened`). Reading every volume and carried row
instead cost 0.9 s of CPU of the 1.8 s audit of 100,000 streams on SQLite
(benchmarks/catalog.py).

Snapshots-table rows are read selectively (what :class:`~zrepl_py.audit.graph.GraphInput`
needs: the snapshots the cursors name and the newest archived ones): reading every snapshot
would cost more than the rest of the audit together on a large catalog, so the createtxg
cross-check of carried snapshots covers those rows only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from zrepl_py.audit.graph import ArchiveExpectation, GraphInput, Screened, TargetListing
from zrepl_py.catalog.repository import Catalog
from zrepl_py.catalog.rows import CursorRow
from zrepl_py.runtime.gcpause import gc_paused


@gc_paused
def load_graph_input(
    catalog: Catalog,
    *,
    host: str | None = None,
    below: str | None = None,
    archives: Sequence[tuple[str, str]] = (),
    cursors: Sequence[CursorRow] = (),
    targets: Mapping[tuple[str, str], TargetListing] | None = None,
    datasets: Sequence[int] | None = None,
) -> GraphInput:
    """Load a :class:`GraphInput` for the streams of ``host`` at or below ``below``.

    Args:
        host, below: the scope (None: everything).
        archives: ``(job, store)`` pairs whose archive must keep up: every dataset in scope
            becomes an ArchiveExpectation, with the start of the job's last successful
            archive run of it to the store (None: never).
        cursors: the replica cursors to check (``Catalog.cursors``).
        targets: target listings gathered by the driver.
        datasets: only the datasets of these ids as well (at most ``catalog.base.CHUNK``;
            None: every dataset in scope): one batch of a large audit (``audit.job``).

    Raises:
        CatalogError: the database failed (also later, from ``audit_graph``, which reads
            the detail of the streams it describes through the returned ``screened``).
    """
    failed = _screen_while(catalog, host, below, datasets)
    streams = catalog.stream_links(host=host, below=below, datasets=datasets)
    screened = Screened(
        failed=frozenset(failed()),
        volumes_of=catalog.volume_totals_of,
        carried_of=catalog.carried,
        carrying=catalog.carrying,
    )
    expectations, snapshots = [], []
    names = catalog.dataset_names(host=host, below=below, datasets=datasets) if archives else []
    for job, store in archives:
        seen = set()
        for row_host, dataset, last, newest in catalog.archive_heads(
                job, store, host=host, below=below, datasets=datasets):
            expectations.append(ArchiveExpectation(row_host, dataset, store, last))
            seen.add((row_host, dataset))
            if newest is not None:
                snapshots.append(newest)
        expectations += [ArchiveExpectation(h, n, store, None)
                         for h, n in names if (h, n) not in seen]
    snapshots += catalog.snapshots_by_guid(
        (c.source_host, c.source_dataset, c.guid) for c in cursors)
    return GraphInput(streams=streams, snapshots=snapshots, cursors=cursors,
                      archives=expectations, targets=targets or {}, screened=screened)


def _screen_while(catalog: Catalog, host: str | None, below: str | None,
                  datasets: Sequence[int] | None = None) -> Callable[[], set[int]]:
    """Start ``Catalog.screen_streams`` in a thread and return what waits for its result.

    The screen is one query that the database answers with few rows: SQLite's C code runs
    it without the GIL (PostgreSQL in its server), so it overlaps reading the stream links
    in this thread (benchmarks/catalog.py: the 0.25 s screen of 100,000 streams on SQLite
    hidden behind the 0.37 s read). Sequential where the catalog cannot read concurrently.
    """
    if not catalog.reads_concurrently:
        result = catalog.screen_streams(host=host, below=below, datasets=datasets)
        return lambda: result
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zbak-screen")
    future = pool.submit(catalog.screen_streams, host=host, below=below, datasets=datasets)
    pool.shutdown(wait=False)
    return future.result
