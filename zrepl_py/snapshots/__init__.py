"""zbak's own snapshots: ``naming`` (``PREFIX_YYYYMMDDTHHMMSSZ``), ``take`` (one atomic
``zfs snapshot`` for a tree), ``inventory`` (a job's tree as ZFS lists it, mirrored into the
catalog), ``job`` (``zbak snapshot``)."""
