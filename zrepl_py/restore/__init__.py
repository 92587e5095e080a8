"""``zbak restore``: a dataset back to a snapshot from the cheapest valid source.

``gather`` reads the facts (catalog, listings, store states; nothing changes), ``plan`` chooses
(PURE, with ``catalog.paths``), ``thaw`` asks cold objects back, ``fetch`` downloads and verifies
volumes before anything reaches ``zfs receive``, ``execute`` receives.
"""
