"""Files out of snapshots: ``zbak restore --path`` and ``zbak find``
(docs/design.md#restoring-files, docs/files.md).

``paths`` reads the paths an admin names (PURE); ``snapshot_files`` reads them where a
snapshot lives, through any executor (this machine, an SSH login, or ``zbak serve``'s own
host); ``access`` reaches a host's snapshots directly or through ``zbak serve``'s file
verbs (``verbs``); ``extract`` writes a tar stream into a directory and nowhere else;
``versions`` folds a file's states across snapshots (PURE); ``plan`` chooses where to read
(PURE, on ``restore.plan``'s choice of source); ``scratch`` holds an archive chain received
to read its files; ``restore`` and ``find`` are the two commands' drivers.
"""
