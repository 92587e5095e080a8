"""Where a send stream's processes run: ``stages`` turns one transfer into the pipeline's
stages on each side (local, or over ssh with a shared connection), for every job that moves a
stream (replication, archive, restore, failback, audit, files)."""
