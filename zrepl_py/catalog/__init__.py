"""The catalog: what zbak knows of every snapshot, replica cursor, archived stream and run, in
SQLite or PostgreSQL (SQLAlchemy + Alembic), and refusing any write that would break a chain.

Plain data first: ``rows`` (frozen row dataclasses and states, no SQLAlchemy) and ``chains``
(PURE: streams grouped into chains) are what every planner imports, with ``paths`` (PURE:
the archived streams that restore a snapshot, for restore and audit). Behind them:
``repository`` (``Catalog``, a thin facade over one class per concern: ``snapshots``,
``runs``, ``cursors``, ``streams``, ``thaws``, ``stamps``, ``bulk``, on ``base``), ``models`` and
``types`` (tables and exact column types), ``db`` (engines, migrations, error translation),
``export`` (the catalog copy in each store, rollback detection) and ``rebuild`` (a catalog
from the manifests in a store).
"""
