"""zbak: ZFS replication and cold-storage backup with a chain-checked SQL catalog."""

__version__ = "0.1.0"
