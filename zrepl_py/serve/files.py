"""``zbak serve``'s file verbs (``--allow-file-read``): a replica's files, read on this host.

``policy.check`` approves a ``zbak-files`` request (``files.verbs``) when serve was started
with ``--allow-file-read`` and the snapshot or dataset is inside a root; ``run_files`` then
does here what the master does itself on a host it has a shell on (``files.snapshot_files``),
with this host's ``zfs``:

- ``probe``: prints ``verbs.PROBE_ANSWER``;
- ``read``: removes the view clones of killed runs of this host from the snapshot's pool
  (``replication.snapshot_view.remove_dead_views``), makes a view of the snapshot
  (``.zfs/snapshot/NAME`` or a temporary clone ``POOL/zbak-view-<hex>``, the only dataset a
  verb creates, named by zbak and stamped with this process), checks every path, runs
  ``tar`` with its stdout on the ssh channel and waits; the view is removed when tar ends,
  fails, or the client goes away (SIGHUP, SIGTERM, SIGINT and SIGPIPE end the wait, kill
  tar, and remove it); a path that is not there exits ``verbs.PATH_UNREADABLE`` with the
  reason on stderr;
- ``versions``: one ``FileState`` JSON line per snapshot (``snapshot_files.file_states``).

A view clone must be mounted to be read, which on Linux only root can do: the forced command
of a key with ``--allow-file-read`` runs as root (docs/security.md#reading-files-through-zbak-serve).
The clone is made and destroyed inside the verb; ``zfs clone``, ``rename``, ``promote`` and
dataset ``destroy`` stay refused as raw commands.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from types import FrameType
from typing import TextIO

from zrepl_py.errors import ZbakError
from zrepl_py.files import verbs
from zrepl_py.files.snapshot_files import PathUnreadable, file_states, tar_of
from zrepl_py.proc import spawn
from zrepl_py.proc.local import LocalExecutor
from zrepl_py.replication.snapshot_view import remove_dead_views
from zrepl_py.zfs.client import Zfs

FAILED = 1


class _Stopped(BaseException):
    """The client went away or serve was told to stop (a signal): clean up and leave."""


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise _Stopped(signal.Signals(signum).name)


def run_files(request: verbs.FileRequest, zfs_program: str, env: Mapping[str, str], *,
              stderr: TextIO | None = None) -> int:
    """Carry out an approved file verb (the module doc); return the exit status.

    Args:
        request: from ``files.verbs.parse_request`` (checked by ``policy.check``).
        zfs_program: the zfs to run (``Policy.zfs``).
        env: the environment for the commands (``execute.clean_env``).
        stderr: where failures are explained to the client (default ``sys.stderr``).
    """
    stderr = stderr or sys.stderr
    if isinstance(request, verbs.Probe):
        print(verbs.PROBE_ANSWER, flush=True)
        return 0
    # LocalExecutor's commands inherit this process's environment: make it the clean one.
    os.environ.clear()
    os.environ.update(env)
    for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
        signal.signal(signum, _stop)
    zfs = Zfs(LocalExecutor(), zfs=zfs_program)
    try:
        if isinstance(request, verbs.ReadFiles):
            return _read(zfs, request, env)
        for state in file_states(zfs, request.dataset, request.path, set(request.guids)):
            sys.stdout.write(json.dumps(state.to_json()) + "\n")
            sys.stdout.flush()
        return 0
    except PathUnreadable as exc:
        print(f"zbak serve: {exc}", file=stderr, flush=True)
        return verbs.PATH_UNREADABLE
    except (ZbakError, OSError) as exc:
        print(f"zbak serve: {exc}", file=stderr, flush=True)
        return FAILED
    except _Stopped:
        return FAILED


def _read(zfs: Zfs, request: verbs.ReadFiles, env: Mapping[str, str]) -> int:
    """Stream the tar of ``request``'s paths to stdout; tar's exit status."""
    remove_dead_views(zfs, request.snapshot.dataset.pool)
    with tar_of(zfs, request.snapshot, request.paths) as argv:
        sys.stdout.flush()
        tar = spawn.popen(argv, env=env, stdin=spawn.DEVNULL)  # stdout: the ssh channel
        try:
            status = tar.wait()
            return 128 - status if status < 0 else status  # killed by a signal: as a shell
        finally:
            if tar.poll() is None:  # stopped by a signal: tar must not outlive the view
                tar.kill()
                tar.wait()
