"""The process's own plumbing, below every domain package: ``statedir`` (the private state
directory, atomic private files), ``logsetup`` (human log lines with control characters
escaped), ``gcpause`` (the cyclic GC paused while catalog-sized structures are built),
``prefetch`` (a run's waiting done ahead in one background thread)."""
