"""zbak's own snapshots and the datasets a job works on: ``naming``
(``PREFIX_YYYYMMDDTHHMMSSZ``), ``selection`` (which datasets of a job's tree it selects:
replicas, excludes, a user property), ``take`` (which selected datasets get the snapshot,
``min_change``, and one atomic ``zfs snapshot`` for them), ``inventory`` (a job's tree as ZFS
lists it, selected, mirrored into the catalog), ``job`` (``zbak snapshot``)."""
