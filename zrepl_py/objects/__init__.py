"""What zbak writes into a store, readable without the catalog: ``layout`` (the key of every
stream folder, volume, manifest and catalog export), ``manifest`` (each stream described, enough
to rebuild the catalog), ``checked`` (small JSON objects with their SHA-256, written twice:
``KEY`` then ``KEY.copy``). Imports neither the catalog nor the archive."""
