"""Replication: the pure planner (``planner``), and the drivers that list both sides, run the
planned ``zfs send | zfs receive`` pipelines (``transport.stages``) and move the source
protections (``zfs.protect``)."""
