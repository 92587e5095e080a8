"""The catalog API: short transactions in, plain frozen dataclasses out.

Every method opens its own transaction and commits before returning, so callers never hold a
database lock across a zfs or S3 operation (the write orders, docs/design.md#write-orders,
order those writes). Rows come back as frozen dataclasses, never database rows. Times are aware
UTC; guids are ints 0 .. 2**64-1; sizes are bytes. It is written in SQLAlchemy Core (``models``
holds the tables): no ORM is loaded.

Chains are checked twice: here, to raise ``ChainBroken`` with a message saying what to do, and by
the database's own constraints (models.py), which catch anything that slips past.

``Catalog`` is a thin facade over one class per concern, each in its own module: ``snapshots``,
``runs``, ``cursors``, ``streams`` (and volumes), ``thaws``, ``stamps`` (what an audit last
read of each manifest), ``failovers``, ``drills`` (restore drills) and ``bulk`` (column-wise reads
for audits and prunes at scale), all
on ``base.CatalogBase`` (engine, transactions). The rows they
take and give are in ``rows`` (no SQLAlchemy there).
"""

from __future__ import annotations

from zrepl_py.catalog.bulk import BulkReads
from zrepl_py.catalog.cursors import Cursors
from zrepl_py.catalog.drills import Drills
from zrepl_py.catalog.failovers import Failovers
from zrepl_py.catalog.runs import Runs
from zrepl_py.catalog.snapshots import Snapshots
from zrepl_py.catalog.stamps import ManifestStamps
from zrepl_py.catalog.streams import Streams
from zrepl_py.catalog.thaws import Thaws


class Catalog(Snapshots, Runs, Cursors, Streams, Thaws, ManifestStamps, BulkReads, Failovers,
              Drills):
    """Reads and writes the catalog through ``engine`` (from ``db.make_engine``).
    
    The schema must be at head (:func:`zrepl_py.catalog.db.require_current`). Every method is
    one short transaction. Database failures surface as ``CatalogError`` subclasses:
    ``CatalogUnavailable`` (cannot reach it), ``CatalogNotCurrent`` (no schema: run
    ``zbak init``), ``CatalogConflict`` (duplicate or illegal change), ``NotInCatalog`` (unknown
    id), ``ChainBroken`` (a stream write would break a chain). Bad argument values (naive
    datetimes, unknown actions or states, negative sizes) raise ``ValueError``.
    """
