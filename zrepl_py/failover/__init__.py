"""Replica failover and failback (docs/design.md#replica-failover-and-failback).

``zbak failover`` makes a job's replica the live dataset and marks it so replication never
writes to it; ``zbak failback`` brings the source back from the newest common snapshot,
keeping what the source wrote after it aside, and makes the replica a replica again.

Modules: ``mark`` (the ``zbak:`` properties that record the state on the datasets
themselves, and the name of a kept-aside dataset; pure), ``plan`` (the failover and
failback planners over plain facts; pure), ``replica`` (promote, demote and release of one
replica dataset over a ``Zfs``, and the remote verbs that do it through ``zbak serve``),
``facts`` (the listings the planners read), ``failover`` and ``failback`` (the drivers).
"""
