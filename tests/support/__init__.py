"""What the tests stand on: the real components they run against, and the faults they inject.

Real components, started by pytest fixtures (``conftest.py`` loads them as plugins): ``zfs``
(zfs-fuse pools on sparse files, in a private mount namespace), ``openzfs`` (the OpenZFS 2.3
QEMU guest), ``sshd`` (OpenSSH on 127.0.0.1, keys per run), ``s3`` (moto's server over HTTP),
``postgres`` (a PostgreSQL cluster); ``cli`` (zbak as the user runs it, and snapshot/content
helpers), ``common`` (free ports, config snippets, a missing component failing in strict mode),
``procwatch`` (peak RSS and children of a process).

Fault injection (docs/decisions.md#faults-are-injected-by-wrapping): wrappers, never patches. Every
fault wraps a REAL component and changes what passes through it, so the code under test runs
unmodified against real stores, real processes and real ZFS:

``backend``
    :class:`~support.backend.FaultyBackend` wraps any ``zrepl_py.stores.base.Backend`` (the
    ``file://`` store or the S3 store against moto): reads truncated, a byte flipped, garbage
    appended (on every read or only the first N reads of a key), an operation that fails once,
    every mutating call after the N-th failing (or a hook run after each one: the crash
    runner SIGKILLs itself there), and operations that hang.
``executor``
    :class:`~support.executor.RecordingExecutor` and :class:`~support.executor.FaultyExecutor`
    wrap an ``Executor`` (record every argv; answer chosen commands with an injected failure or
    extra stderr); the ``*_stage`` helpers wrap a pipeline ``Stage`` in ``stagewrap.py`` (kill
    the sender after N bytes, inject stderr, fail after the whole stream, a receiver that fails
    while the sender still writes, a sender of garbage).
``crash_runner.py``
    runs ``zbak`` (``zrepl_py.cli.main``) with every store opened through a ``FaultyBackend``
    that SIGKILLs the process after the k-th store or catalog step (``ZBAK_FAULT_KILL_AFTER``),
    recording each step (``ZBAK_FAULT_STEPS_FILE``): "crash at every step" without an exception
    the code under test could catch; with ``ZBAK_FAULT_ZFS_STEPS=1`` every zfs command that
    changes state and every run, cursor and failover row are steps too (failover, failback).
    ``archive_checks`` reads what such a run left behind.

Tests import this package as ``support`` (``tests/`` is on ``sys.path`` through the rootdir
conftest).
"""
