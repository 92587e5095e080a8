"""Retention: which snapshots and which archive chains may go, and deleting them safely.

PURE planners: ``rules`` (the retention grid), ``snapshot_plan`` (snapshots x rules x
protections -> destroy list with reasons), ``chain_plan`` (whole chains of one dataset ->
delete list, never a chain something depends on). Drivers: ``source`` and ``replica`` (zbak's
snapshots), ``holds`` (replication and archive bases), ``archive`` (a job's chains in its
store), ``recheck`` (the releasing chain re-read right before a delete), ``chain_delete``
(condemn, delete objects, delete rows, in that order), ``job`` (``zbak prune``).
"""
