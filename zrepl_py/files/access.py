"""Reach a host's snapshots to read files: directly, or through ``zbak serve``'s file verbs.

- This machine, or a host zbak logs in to with a shell (root, or ``sudo = true``): zbak
  itself makes the view (``.zfs/snapshot`` or a temporary clone), checks the paths and runs
  ``tar``, ``find`` and ``sha256sum`` there (``snapshot_files``), over the host's SSH
  executor; the tar stream comes back over OpenSSH (``transport.stages.Side``).
- A host whose key runs ``zbak serve --allow-file-read``: the same steps run inside serve on
  that host (``serve.files``), asked with one request (``verbs``); no clone, tar or mktemp
  passes serve as a raw command.

Which of the two a host is, is asked once per run with ``zbak-files probe``: serve answers
``verbs.PROBE_ANSWER``, a serve without ``--allow-file-read`` refuses (exit 126, its reason
shown), and a login shell does not know the program (127): direct. A ``sudo`` host is always
direct (serve runs no sudo). In both ways the stream leaves the host as a tar of the
requested paths only: no dataset is copied (docs/decisions.md#files-from-a-replica-travel-as-a-tar-of-the-paths).
"""

from __future__ import annotations

import contextlib
import enum
import json
from collections.abc import Collection, Iterator, Sequence

from zrepl_py.config.hosts import LOCAL_HOST
from zrepl_py.errors import CommandRefused, PipelineFailed, RestoreError
from zrepl_py.files import verbs
from zrepl_py.files.snapshot_files import PathUnreadable, file_states, tar_of
from zrepl_py.files.versions import FileState
from zrepl_py.invocation.context import Context
from zrepl_py.proc.python_end import SendReader
from zrepl_py.replication.snapshot_view import remove_dead_views
from zrepl_py.transport.stages import Side
from zrepl_py.zfs.names import DatasetName, SnapshotName

SERVE_REFUSED = 126
"""``zbak serve``'s exit status for a refused request (``serve.execute.REFUSED``)."""


class Route(enum.Enum):
    """How a host's snapshots are read (the module doc)."""

    DIRECT = "direct"
    SERVE = "zbak serve"


def route(ctx: Context, host: str) -> Route:
    """How ``host``'s snapshots are read (one probe for a remote host without sudo).

    Raises:
        CommandRefused: the host runs ``zbak serve`` without ``--allow-file-read``.
        HostUnreachable, HostKeyMismatch: the host cannot be reached safely.
    """
    config = ctx.config.hosts.get(host)
    if host == LOCAL_HOST or config is None or config.sudo:
        return Route.DIRECT
    done = ctx.executors().get(host).run(verbs.probe_argv(), check=False)
    if done.returncode == 0 and done.text.strip() == verbs.PROBE_ANSWER:
        return Route.SERVE
    if done.returncode == SERVE_REFUSED:
        raise CommandRefused(
            f"{host} runs zbak serve, which refused to read files ({done.error_text}); add"
            " --allow-file-read to the forced command in its authorized_keys")
    return Route.DIRECT


class _ServedStream:
    """The tar stream of ``zbak-files read``: a ``SendReader`` whose failure because a
    path is missing becomes ``PathUnreadable`` with serve's reason."""

    def __init__(self, reader: SendReader):
        self._reader = reader

    def read(self, size: int) -> bytes:
        try:
            return self._reader.read(size)
        except PipelineFailed as exc:
            if exc.culprit.returncode == verbs.PATH_UNREADABLE:
                reason = exc.culprit.stderr.strip().splitlines()[-1:] or [str(exc)]
                raise PathUnreadable(reason[0].removeprefix("zbak serve: ")) from None
            raise


@contextlib.contextmanager
def open_tar(ctx: Context, host: str, snapshot: SnapshotName,
             paths: Sequence[str]) -> Iterator[_ServedStream | SendReader]:
    """A readable tar stream of ``paths`` of ``snapshot`` on ``host`` (the module doc);
    the view it is read from exists until the block ends. Views left on the pool by killed
    runs of this machine are removed first (``remove_dead_views``).

    Raises:
        PathUnreadable: a path is missing or reached through a non-directory (for a served
            host: when the stream is read).
        CommandRefused: see ``route``.
        PipelineFailed: raised by ``read`` when tar (or serve) failed: the stream was cut.
        SnapshotViewError, ZfsError, CommandFailed, HostUnreachable.
    """
    side = Side.of(ctx.config, host)
    if route(ctx, host) is Route.SERVE:
        stages = side.wrap([verbs.read_argv(snapshot, paths)], "zbak serve: read files")
        with SendReader(stages) as reader:
            yield _ServedStream(reader)
        return
    zfs = ctx.zfs(host, snapshot.dataset.pool)
    remove_dead_views(zfs, snapshot.dataset.pool)
    with tar_of(zfs, snapshot, paths) as argv, SendReader(side.wrap([argv], "tar")) as reader:
        yield reader


def states_at(ctx: Context, host: str, dataset: DatasetName, path: str,
              guids: Collection[int] = ()) -> list[FileState]:
    """``path``'s state in the snapshots of ``host:dataset`` (those with ``guids`` when
    given), oldest first (``snapshot_files.file_states``, run there or by serve).

    Raises:
        CommandRefused: see ``route``.
        RestoreError: serve answered something that is not its JSON lines.
        DatasetNotFound, SnapshotViewError, ZfsError, CommandFailed, HostUnreachable.
    """
    if route(ctx, host) is Route.DIRECT:
        zfs = ctx.zfs(host, dataset.pool)
        remove_dead_views(zfs, dataset.pool)
        return list(file_states(zfs, dataset, path, set(guids)))
    executor = ctx.executors().get(host)
    wanted = sorted(set(guids))
    states: list[FileState] = []
    for start in range(0, max(len(wanted), 1), verbs.MAX_GUIDS):
        done = executor.run(verbs.versions_argv(dataset, path, wanted[start:start + verbs.MAX_GUIDS]))
        try:
            states += [FileState.from_json(json.loads(line))
                       for line in done.text.splitlines() if line]
        except ValueError as exc:
            raise RestoreError(f"zbak serve on {host} answered {done.text[:200]!r} to"
                               f" zbak-files versions: {exc}") from exc
    return states
