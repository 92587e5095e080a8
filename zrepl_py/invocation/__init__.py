"""One zbak command's world: ``context`` (``Context``: config, clock, and the catalog, host
executors, ZFS clients and stores, each opened once and closed together) and ``hosts`` (one
executor per host name: local or SSH)."""
