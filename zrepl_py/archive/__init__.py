"""Cold-storage archive: the next streams of each dataset's chain, zstd-compressed, written to a
store in volumes (docs/design.md#archive).

Modules: ``planner`` (PURE: snapshots, catalogued streams and the chain policy in, planned
streams out), ``damage`` (lost volumes found with one listing, streams marked ``bad``),
``volumes`` (one zstd frame per volume, SHA-256 of the stored bytes), ``writer`` (one stream:
volumes, progress record, manifest, then the catalog row), ``job`` (``zbak archive``: lock,
guard the store, plan and write each dataset, move the archive hold).
"""
