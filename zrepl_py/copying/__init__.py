"""``zbak copy``: a job's streams copied from one store to another, volume by volume, so the
catalog knows every copy of every snapshot (docs/copies.md).

Modules: ``plan`` (PURE: the streams of both stores in, the streams the target lacks out,
oldest first), ``stream`` (one stream: each volume copied and checked on arrival, then the
manifest, then the catalog row), ``job`` (``zbak copy`` for one job: lock, guard the target
store, plan, copy).
"""
