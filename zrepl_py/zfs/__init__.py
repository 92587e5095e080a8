"""ZFS as zbak drives it: ``names`` (OpenZFS naming rules), ``client`` (``Zfs``: zfs/zpool argv,
parsed listings), ``errors`` (stderr -> typed errors), ``capabilities`` (what a host and pool
support, cached per host), ``model`` (listings as values), ``pool_status`` (``zpool status`` ->
a report), ``steps`` (what a plan sends), ``sendrecv`` (send/receive argv), ``resume``
(receive resume tokens), ``protect`` (the holds and bookmarks that keep a replication
or archive base)."""
