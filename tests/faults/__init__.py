"""Fault injection for the reliability suite (issue 7 item 1): wrappers, never patches.

Every fault here wraps a REAL component and changes what passes through it, so the code under
test runs unmodified against real stores, real processes and real ZFS:

``faults.backend``
    :class:`~faults.backend.FaultyBackend` wraps any ``zrepl_py.stores.base.Backend`` (the
    ``file://`` store or the S3 store against moto): reads truncated, a byte flipped, garbage
    appended (on every read or only the first N reads of a key), an operation that fails once,
    every mutating call after the N-th failing (or a hook run after each one: the crash
    runner SIGKILLs itself there), and operations that hang.
``faults.executor``
    :class:`~faults.executor.RecordingExecutor` and :class:`~faults.executor.FaultyExecutor`
    wrap an ``Executor`` (record every argv; answer chosen commands with an injected failure or
    extra stderr); the ``*_stage`` helpers wrap a pipeline ``Stage`` in ``faults/stagewrap.py``
    (kill the sender after N bytes, inject stderr, fail after the whole stream, a receiver that
    fails while the sender still writes, a sender of garbage).
``faults/crash_runner.py``
    runs ``zbak`` (``zrepl_py.cli.main``) with every store opened through a ``FaultyBackend``
    that SIGKILLs the process after the k-th store or catalog step (``ZBAK_FAULT_KILL_AFTER``),
    recording each step (``ZBAK_FAULT_STEPS_FILE``): "crash at every step" without an exception
    the code under test could catch.

Tests import this package as ``faults`` (``tests/`` is on ``sys.path`` through the rootdir
conftest).
"""
