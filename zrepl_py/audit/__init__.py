"""``zbak audit``: proving every retained snapshot can be brought back (docs/design.md#audit).

Modules: ``graph`` (PURE: chains start at a full, guids continue, no gaps or orphans, cursors
and holds agree), ``restorable`` (PURE: per dataset and store, which snapshots a chain can
restore and which are stored but unrestorable), ``load`` (the catalog read in bulk for the
graph), ``objects`` (each object listed with its size, manifests read and compared),
``deep`` (volumes re-read and checksummed, BEGIN records matched, optionally received into a
scratch pool), ``findings`` (what an audit reports), ``job`` (the command: locks, stores,
the run record, ``--repair``).
"""
