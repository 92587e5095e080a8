"""The rsync fallback: a snapshot's files into point-in-time trees in a target directory.

For targets that cannot receive ZFS streams (docs/design.md#replication, rsync fallback). Layout
of a target directory ``DIR`` (one dataset per directory):

- ``DIR/snapshots/SHORT``: one complete tree per replicated snapshot, never changed again;
  a file that is the same in two trees is one inode (hard links), so a tree costs only the
  files that changed;
- ``DIR/current``: a symlink to ``snapshots/SHORT`` of the newest replicated snapshot (by
  the source's createtxg, never by name: docs/style.md#utc-everywhere-and-order-by-createtxg);
- ``DIR/partial/GUID``: the tree being written for the snapshot with that guid; an
  interrupted run leaves it (with ``--partial`` files) and the next run continues in it.

One run (``replicate_snapshot_rsync``): read the snapshot through ``snapshot_view``, rsync
it into ``DIR/partial/GUID/`` with ``--link-dest`` pointing at the nearest trees already
there, then ``mv`` it to ``DIR/snapshots/SHORT`` (a rename: the tree appears complete or not
at all) and repoint ``current``. A failed rsync records nothing.

Why a fresh tree with ``--link-dest`` rather than rsync into a shared ``current`` plus
``cp -al current snapshots/SHORT``: rsync updates an unchanged file's mode, owner, times,
ACLs or xattrs in place, on the inode every hard-linked older tree shares, so a ``chmod`` on
the source would rewrite history (rsync(1) on ``--link-dest``: "existing files may get their
attributes tweaked, and that can affect alternate destination files via hard-links"; the
same holds for ``cp -al`` trees). Into an empty directory rsync only ever creates files or
links to identical ones (same content by checksum and same attributes), never modifies an
inode it did not create. Changed content is written to a temporary file and renamed, and
with ``--link-dest`` rsync uses the older file as the delta basis, so only changed blocks
cross the wire. ``GUID`` keys the partial tree so a snapshot destroyed and re-created under
the same name never continues the old one's partial tree.

rsync exit status (rsync(1) "EXIT VALUES"): 0 success; 24 "some files vanished" is a
warning (a ZFS snapshot is immutable, so it points at a live directory); 23 and everything
else fail with ``RsyncFailed``; rsync missing on either side raises ``RsyncNotFound``.

A timetable ``bandwidth_limit`` (``values.timetable``) cannot reach a running rsync, whose
``--bwlimit`` is fixed: the rsync runs until the next change of the limit, is stopped then and
started again with the new ``--bwlimit`` into the same ``DIR/partial/GUID`` (``--partial``
kept what arrived; ``--checksum`` skips the files finished already). Only the last run's
bytes are counted (rsync's ``--stats`` of a stopped run are lost with it;
docs/decisions.md#a-new-limit-reaches-running-transfers).

Where rsync runs: push (source here, target an SSH host) and local (both here) run rsync
here; pull (source an SSH host, target here) runs it here too, reading over ssh. Remote to
remote is refused (rsync cannot copy between two remote hosts).
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from zrepl_py.clock import Clock, SystemClock
from zrepl_py.config.hosts import Endpoint, HostConfig
from zrepl_py.errors import CommandFailed, DatasetNotFound, RsyncFailed, RsyncNotFound, UsageError
from zrepl_py.proc.executor import Completed, Executor
from zrepl_py.proc.openssh import remote_command, ssh_argv_without_address
from zrepl_py.replication.snapshot_view import snapshot_view
from zrepl_py.values.timetable import Timetable
from zrepl_py.zfs.client import Zfs
from zrepl_py.zfs.model import SnapshotInfo
from zrepl_py.zfs.names import SnapshotName

log = logging.getLogger(__name__)

RSYNC = "rsync"
COPY_OPTIONS = ("-aHAX", "--numeric-ids", "--delete", "--partial", "--checksum")
"""Archive mode with hard links, ACLs and xattrs, ids as numbers (no name mapping between
hosts), an exact copy (``--delete``), partial files kept for resuming, and files compared by
checksum rather than size and mtime."""
REPORT_OPTIONS = ("--stats", "--no-human-readable")
"""Byte counts at the end of the output, as plain digits (no thousands separators)."""
MAX_LINK_DEST = 20
"""rsync accepts at most 20 ``--link-dest`` directories (rsync(1))."""
VANISHED = 24
"""rsync's "partial transfer due to vanished source files": a warning, not a failure."""
SNAPSHOTS = "snapshots"
PARTIAL = "partial"
CURRENT = "current"

_NOT_FOUND = re.compile(r"rsync\W?: (?:(?:command )?not found|No such file or directory)")
_STAT_LINE = re.compile(r"^([A-Za-z][A-Za-z ]*): (\d+)(?![\d.])", re.MULTILINE)


# -- pure parts --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Location:
    """One side of an rsync transfer: a directory here, or on ``address`` over ssh.

    Attributes:
        path: absolute directory path on that host.
        address: ``HostConfig.address`` of the host, None for this machine.
    """

    path: str
    address: str | None = None

    def spec(self) -> str:
        """The rsync argument for the directory's contents: ``PATH/`` or ``HOST:PATH/``.

        The trailing ``/`` means "the contents of", on both sides. An IPv6 address is put in
        brackets (rsync(1) "USAGE": ``[ADDR]:PATH``), which rsync strips before calling ssh.
        """
        path = self.path.rstrip("/") + "/"
        if self.address is None:
            return path
        host = self.address
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{path}"


def bwlimit_kib(bandwidth_limit: int) -> int:
    """Convert a limit in bytes per second to rsync's ``--bwlimit`` unit, KiB per second.

    Rounded down so the limit is never exceeded, but at least 1 (0 would mean unlimited and
    rsync cannot go below 1024 bytes/s; rsync(1) ``--bwlimit``).

    Raises:
        ValueError: ``bandwidth_limit`` is not a positive integer.
    """
    if not isinstance(bandwidth_limit, int) or bandwidth_limit <= 0:
        raise ValueError(f"bandwidth_limit must be a positive number of bytes/s, "
                         f"not {bandwidth_limit!r}")
    return max(1, bandwidth_limit // 1024)


def rsync_argv(
    source: Location,
    destination: Location,
    *,
    ssh: Sequence[str] | None = None,
    bandwidth_limit: int | None = None,
    link_dest: Sequence[str] = (),
    rsync_path: str | None = None,
) -> list[str]:
    """Build the rsync command that makes ``destination`` an exact copy of ``source``.

    ``rsync -aHAX --numeric-ids --delete --partial --checksum --stats --no-human-readable
    [-s] [--bwlimit=KiB] [-e SSH] [--rsync-path=CMD] [--link-dest=DIR ...] -- SRC/ DST/``.

    With a remote side, ``-s`` (``--secluded-args``, called ``--protect-args`` before rsync
    3.2.6; the short form works with every rsync since 3.0.0) sends paths and options through
    the rsync protocol instead of the remote shell's command line, so directory names with
    spaces or shell characters arrive intact whatever the remote rsync's version (3.2.4 and
    later also backslash-escape by default; older ones did not). The ``-e`` string is
    ``remote_command(ssh)``, the one argv-to-string join (docs/style.md#no-shell-strings).

    Args:
        source, destination: the two directories; at most one may have an address.
        ssh: the ssh argv without the address (``ssh_argv_without_address``); required
            exactly when a side is remote.
        bandwidth_limit: bytes per second, None for unlimited (see ``bwlimit_kib``).
        link_dest: absolute directories on the destination's host holding earlier trees:
            identical files are hard-linked from them instead of copied, in the order given;
            at most 20.
        rsync_path: the command that starts rsync on the remote side, a shell string (e.g.
            ``"sudo -n rsync"``); None for plain ``rsync``.

    Raises:
        ValueError: both sides remote; ssh missing or superfluous; a link_dest not absolute
            or more than 20; a bad bandwidth_limit; a relative path.
    """
    remote = [loc for loc in (source, destination) if loc.address is not None]
    if len(remote) > 1:
        raise ValueError("rsync cannot copy between two remote hosts")
    if bool(remote) != (ssh is not None):
        raise ValueError("ssh options are needed exactly when one side is remote")
    if rsync_path is not None and not remote:
        raise ValueError("rsync_path only applies to a remote side")
    for loc in (source, destination):
        if not loc.path.startswith("/"):
            raise ValueError(f"rsync path {loc.path!r} is not absolute")
    if len(link_dest) > MAX_LINK_DEST:
        raise ValueError(f"rsync takes at most {MAX_LINK_DEST} --link-dest directories")
    if any(not d.startswith("/") for d in link_dest):
        raise ValueError(f"--link-dest directories must be absolute: {list(link_dest)}")
    argv = [RSYNC, *COPY_OPTIONS, *REPORT_OPTIONS]
    if remote:
        argv.append("-s")
    if bandwidth_limit is not None:
        argv.append(f"--bwlimit={bwlimit_kib(bandwidth_limit)}")
    if ssh is not None:
        argv += ["-e", remote_command(ssh, sudo=False)]
    if rsync_path is not None:
        argv.append(f"--rsync-path={rsync_path}")
    argv += [f"--link-dest={d}" for d in link_dest]
    argv += ["--", source.spec(), destination.spec()]
    return argv


def exit_outcome(returncode: int | None) -> Literal["ok", "warning", "failed"]:
    """Classify an rsync exit status: 0 ok, 24 (vanished source files) warning, anything
    else, including 23 (partial transfer due to error) and None (killed), failed."""
    if returncode == 0:
        return "ok"
    if returncode == VANISHED:
        return "warning"
    return "failed"


def parse_stats(output: str) -> dict[str, int]:
    """Read ``--stats --no-human-readable`` output into ``{label: integer}``.

    E.g. ``{"Number of files": 7, "Total bytes sent": 1336, ...}``; lines whose value is
    not a whole number (times in seconds) are left out.
    """
    return {m.group(1): int(m.group(2)) for m in _STAT_LINE.finditer(output)}


def looks_like_missing_rsync(stderr: str) -> bool:
    """True when stderr says a shell or sudo could not find the rsync program
    (bash "rsync: command not found", dash "rsync: not found", env "'rsync': No such file
    or directory", with GNU's typographic quotes in a UTF-8 locale)."""
    return bool(_NOT_FOUND.search(stderr))


# -- running rsync -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RsyncRun:
    """A finished rsync that did not fail.

    Attributes:
        returncode: 0, or 24 when source files vanished.
        stats: ``parse_stats`` of its output.
        warnings: its stderr lines (e.g. ``file has vanished: "..."``), empty when quiet.
    """

    returncode: int
    stats: dict[str, int]
    warnings: list[str]


def run_rsync(executor: Executor, argv: Sequence[str], *, timeout: float | None = None) -> RsyncRun:
    """Run an rsync argv on ``executor``'s host (normally this machine) and classify it.

    Args:
        executor: where rsync runs.
        argv: from ``rsync_argv``.
        timeout: seconds before rsync is killed; None waits forever. A killed rsync leaves
            its partial files (``--partial``: the receiver keeps them when its sender goes
            away).

    Raises:
        RsyncNotFound: rsync is missing here, or the remote shell could not find it.
        RsyncFailed: any exit status but 0 and 24, or a timeout (``returncode`` None).
    """
    try:
        done = executor.run(list(argv), check=False, timeout=timeout)
    except CommandFailed as exc:  # the executor's timeout or missing binary
        kind = RsyncNotFound if exc.returncode == 127 else RsyncFailed
        raise kind(exc.argv, exc.returncode, exc.stderr, exc.host) from exc
    stderr = done.error_text
    if exit_outcome(done.returncode) == "failed":
        # rsync itself never exits 127; a shell or env does when the program is missing.
        missing = done.returncode == 127 or looks_like_missing_rsync(stderr)
        kind = RsyncNotFound if missing else RsyncFailed
        raise kind(list(done.argv), done.returncode, stderr, executor.host)
    warnings = [line for line in stderr.splitlines() if line.strip()]
    return RsyncRun(done.returncode, parse_stats(done.text), warnings)


def check_rsync_installed(executor: Executor) -> None:
    """Run ``rsync --version`` on ``executor``'s host.

    Raises:
        RsyncNotFound: it failed (not installed, not on PATH, not allowed by sudo).
        HostUnreachable, HostKeyMismatch: from an SSH executor.
    """
    try:
        done = executor.run([RSYNC, "--version"], check=False, timeout=60)
    except CommandFailed as exc:
        raise RsyncNotFound(exc.argv, exc.returncode, exc.stderr, exc.host) from exc
    if done.returncode != 0:
        raise RsyncNotFound(list(done.argv), done.returncode,
                            done.error_text or "rsync --version failed", executor.host)


# -- the target directory ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TargetLayout:
    """Paths inside one rsync target directory (see the module doc).

    Attributes:
        directory: the target's absolute directory (``Endpoint.directory``).
    """

    directory: str

    @property
    def snapshots(self) -> str:
        """``DIR/snapshots``: the finished trees."""
        return posixpath.join(self.directory, SNAPSHOTS)

    @property
    def partial(self) -> str:
        """``DIR/partial``: trees being written, one per snapshot guid."""
        return posixpath.join(self.directory, PARTIAL)

    @property
    def current(self) -> str:
        """``DIR/current``: symlink to the newest tree."""
        return posixpath.join(self.directory, CURRENT)

    def tree(self, short: str) -> str:
        """``DIR/snapshots/SHORT``."""
        return posixpath.join(self.snapshots, short)

    def partial_tree(self, guid: int) -> str:
        """``DIR/partial/GUID``."""
        return posixpath.join(self.partial, str(int(guid)))


def _find_subdirs(executor: Executor, directories: Sequence[str]) -> Completed:
    """One ``find D1 [D2] -mindepth 1 -maxdepth 1 -type d -print0`` (GNU, BSD, busybox)."""
    return executor.run(
        ["find", *directories, "-mindepth", "1", "-maxdepth", "1", "-type", "d", "-print0"],
        check=False,
    )


def _list_subdirs(executor: Executor, directory: str) -> list[str]:
    """Names of the subdirectories of ``directory`` (sorted), ``[]`` if it does not exist.

    Raises:
        CommandFailed: find failed although ``directory`` exists.
    """
    done = _find_subdirs(executor, [directory])
    if done.returncode != 0:
        if executor.run(["test", "-e", directory], check=False).returncode != 0:
            return []
        raise CommandFailed(list(done.argv), done.returncode, done.error_text, executor.host)
    return sorted(posixpath.basename(p) for p in done.text.split("\0") if p)


def _prepare_target(executor: Executor, layout: TargetLayout) -> tuple[set[str], list[str]]:
    """Create ``DIR/snapshots`` and ``DIR/partial`` (mode 0700 when new; ``mkdir -p``) and
    list both: (short names with a tree, guid names of partial trees). Two commands.

    Raises:
        CommandFailed: a directory cannot be created or listed.
    """
    executor.run(["mkdir", "-p", "-m", "0700", layout.snapshots, layout.partial])
    done = _find_subdirs(executor, [layout.snapshots, layout.partial])
    if done.returncode != 0:
        raise CommandFailed(list(done.argv), done.returncode, done.error_text, executor.host)
    trees: set[str] = set()
    partials: list[str] = []
    for path in filter(None, done.text.split("\0")):
        parent, name = posixpath.split(path)
        if parent == layout.snapshots:
            trees.add(name)
        elif parent == layout.partial and name.isdigit():
            partials.append(name)
    return trees, sorted(partials)


def last_synced(target_executor: Executor, directory: str) -> list[str]:
    """List the snapshot trees in ``DIR/snapshots`` on the target: short snapshot names.

    Sorted by name only for a stable output; to find the newest, order them by the source's
    createtxg (docs/style.md#utc-everywhere-and-order-by-createtxg). Trees being written
    (``DIR/partial``) are not listed.

    Args:
        target_executor: runs on the target host (LocalExecutor for a local directory).
        directory: the target's directory (``Endpoint.directory``).

    Raises:
        CommandFailed: the listing failed (e.g. permission denied).
        HostUnreachable, HostKeyMismatch: from an SSH executor.
    """
    return _list_subdirs(target_executor, TargetLayout(directory).snapshots)


def pick_link_dests(
    snapshots: Sequence[SnapshotInfo], wanted: SnapshotName, present: set[str]
) -> list[str]:
    """Choose which existing trees rsync should link against: short names, best first.

    The nearest older snapshot that has a tree (usually the previous run's), then the
    nearest newer one (when an older snapshot is filled in late). Pure.

    Args:
        snapshots: the source dataset's snapshots, oldest first (createtxg order).
        wanted: the snapshot being replicated.
        present: short names that have a tree on the target.
    """
    shorts = [s.short for s in snapshots]
    if wanted.short not in shorts:
        return []
    at = shorts.index(wanted.short)
    older = [s for s in reversed(shorts[:at]) if s in present]
    newer = [s for s in shorts[at + 1 :] if s in present]
    return older[:1] + newer[:1]


def newest_present(snapshots: Sequence[SnapshotInfo], present: set[str]) -> str | None:
    """The short name of the newest (highest createtxg) source snapshot with a tree. Pure."""
    best = max((s for s in snapshots if s.short in present), key=lambda s: s.createtxg,
               default=None)
    return best.short if best is not None else None


# -- one snapshot ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RsyncResult:
    """The outcome of ``replicate_snapshot_rsync``.

    Attributes:
        bytes_sent: bytes that crossed from source to target side, protocol included
            (rsync's "Total bytes sent", or "Total bytes received" when pulling); 0 when the
            tree was already there; None when rsync printed no stats.
        warnings: rsync's warnings (exit 24 "vanished" lines), and zbak's own (``current``
            is not a symlink).
        snapshot_dir: the finished tree on the target, ``DIR/snapshots/SHORT``.
        already_present: the tree existed before the call; nothing was transferred.
    """

    bytes_sent: int | None
    warnings: list[str]
    snapshot_dir: str
    already_present: bool = False


@dataclasses.dataclass(frozen=True)
class _Route:
    """Who runs rsync and how the two sides are named on its command line."""

    runner: Executor
    far: Executor | None
    source_address: str | None
    target_address: str | None
    ssh: list[str] | None
    rsync_path: str | None
    sent_key: str


def _route(
    source_zfs: Zfs,
    target_host: HostConfig | None,
    target_executor: Executor,
    source_host: HostConfig | None,
    known_hosts_default: Path,
    control_dir: Path | None = None,
) -> _Route:
    source_remote = source_zfs.host != "local"
    if source_remote and target_host is not None:
        raise UsageError(
            f"rsync cannot copy from remote host {source_zfs.host} to remote host "
            f"{target_executor.host}; replicate to a ZFS target or run zbak on one of them"
        )
    if target_host is not None:  # push
        return _Route(
            runner=source_zfs.executor,
            far=target_executor,
            source_address=None,
            target_address=target_host.address,
            ssh=ssh_argv_without_address(target_host, known_hosts_default=known_hosts_default,
                                         control_dir=control_dir),
            rsync_path=remote_command([RSYNC], sudo=True) if target_host.sudo else None,
            sent_key="Total bytes sent",
        )
    if source_remote:  # pull
        host = source_host or getattr(source_zfs.executor, "config", None)
        if not isinstance(host, HostConfig):
            raise UsageError(f"pulling from {source_zfs.host} with rsync needs its HostConfig")
        return _Route(
            runner=target_executor,
            far=source_zfs.executor,
            source_address=host.address,
            target_address=None,
            ssh=ssh_argv_without_address(host, known_hosts_default=known_hosts_default,
                                         control_dir=control_dir),
            rsync_path=remote_command([RSYNC], sudo=True) if host.sudo else None,
            sent_key="Total bytes received",
        )
    return _Route(source_zfs.executor, None, None, None, None, None, "Total bytes sent")


def _snapshot_info(source_zfs: Zfs, snap: SnapshotName) -> list[SnapshotInfo]:
    """The dataset's snapshots (createtxg order), checking ``snap`` is among them."""
    snapshots = source_zfs.tree(snap.dataset, recursive=False).snapshots(snap.dataset)
    if not any(s.name == snap for s in snapshots):
        raise DatasetNotFound(["zfs", "get", "guid", snap], 1,
                              f"cannot open '{snap}': dataset does not exist", source_zfs.host)
    return snapshots


def _point_current(
    executor: Executor, layout: TargetLayout, short: str, warnings: list[str]
) -> None:
    """Make ``DIR/current`` a relative symlink to ``snapshots/SHORT`` (``ln -sfn``).

    ``ln -sfn`` replaces a symlink by unlink and symlink: a crash in between leaves no
    ``current``, which the next run recreates. A real file or directory named ``current``
    (not made by zbak) is left alone, with a warning.
    """
    current = layout.current
    # A symlink or nothing: `test -L X -o ! -e X` (XSI test, in GNU, BSD and busybox).
    replaceable = ["test", "-L", current, "-o", "!", "-e", current]
    if executor.run(replaceable, check=False).returncode != 0:
        warnings.append(f"{current} exists and is not a symlink; left unchanged")
        return
    executor.run(["ln", "-sfn", "--", posixpath.join(SNAPSHOTS, short), current])


def replicate_snapshot_rsync(
    source_zfs: Zfs,
    snapshot: SnapshotName | str,
    target: Endpoint,
    target_host: HostConfig | None,
    target_executor: Executor,
    *,
    known_hosts_default: Path,
    bandwidth_limit: Timetable | None = None,
    source_host: HostConfig | None = None,
    timeout: float | None = None,
    control_dir: Path | None = None,
    clock: Clock | None = None,
) -> RsyncResult:
    """Copy one snapshot's files into ``DIR/snapshots/SHORT`` on the target (see module doc).

    Idempotent: when the tree exists already (e.g. a crash after the rename), only
    ``current`` is checked and ``already_present`` is returned. After a failure, calling
    again for the same snapshot continues in ``DIR/partial/GUID``. Partial trees of
    snapshots that are gone from the source or finished meanwhile are removed after a
    success (they were offered to rsync as link/basis directories first).

    Commands on the target (``mkdir -p``, ``find``, ``mv``, ``ln -sfn``, ``rm -rf`` of
    ``DIR/partial/GUID`` only) run through ``target_executor``; those on the source through
    ``source_zfs``; rsync itself runs on this machine (push: source local, target over ssh;
    local: both here; pull: source over ssh, target here).

    Args:
        source_zfs: client for the source host; ``source_zfs.host`` is ``"local"`` or an
            SSH host name.
        snapshot: the snapshot to copy (``DATASET@SHORT``); its dataset's snapshots are
            listed once (createtxg order) to choose link directories and ``current``.
        target: a directory endpoint (``target.directory`` set).
        target_host: the target's HostConfig, None for a directory on this machine.
        target_executor: runs commands on the target host.
        known_hosts_default: known_hosts file for hosts without their own
            (``<state_dir>/known_hosts``), for the ``ssh`` that rsync starts.
        bandwidth_limit: bytes per second on the wire, or a timetable of them (a change
            restarts rsync, see the module doc); None for unlimited.
        source_host: the source's HostConfig when pulling; default the source executor's
            own ``config`` (SSHExecutor).
        timeout: seconds the rsync may run before it is killed (RsyncFailed, returncode
            None; partial files stay for the next run); None for no limit.
        control_dir: share the host's ssh connection (``openssh.control_dir``); rsync
            counts its bytes itself, so sharing costs nothing here.
        clock: what ``bandwidth_limit`` is read by (default the system clock).

    Returns:
        RsyncResult (bytes, warnings, the tree's path).

    Raises:
        ValueError: ``target`` is not a directory endpoint.
        UsageError: source and target are both remote, or a pull lacks the source's config.
        RsyncNotFound: rsync is missing on this machine or on the remote side.
        RsyncFailed: rsync failed (exit 23, connection lost, killed...): no tree recorded.
        DatasetNotFound: the snapshot does not exist.
        SnapshotViewError, ZfsError: reading the snapshot (see ``snapshot_view``).
        CommandFailed: a command on the target failed (permission denied, disk full).
        HostUnreachable, HostKeyMismatch: from an SSH executor.
    """
    if target.directory is None:
        raise ValueError(f"{target} is not a directory target")
    snap = SnapshotName(snapshot)
    layout = TargetLayout(target.directory)
    route = _route(source_zfs, target_host, target_executor, source_host, known_hosts_default,
                   control_dir)
    check_rsync_installed(route.runner)
    if route.far is not None:
        check_rsync_installed(route.far)
    snapshots = _snapshot_info(source_zfs, snap)
    info = next(s for s in snapshots if s.name == snap)
    present, partials = _prepare_target(target_executor, layout)
    warnings: list[str] = []
    if snap.short in present:
        if newest_present(snapshots, present) == snap.short:
            _point_current(target_executor, layout, snap.short, warnings)
        log.info("[%s] %s is already in %s", target_executor.host, snap, layout.tree(snap.short))
        return RsyncResult(0, warnings, layout.tree(snap.short), already_present=True)

    link_dest = [layout.tree(s) for s in pick_link_dests(snapshots, snap, present)]
    link_dest += [posixpath.join(layout.partial, p) for p in partials if p != str(info.guid)]
    destination = layout.partial_tree(info.guid)
    run = _rsync_snapshot(source_zfs, snap, route, destination, link_dest, target_executor.host,
                          bandwidth_limit=bandwidth_limit or Timetable(), timeout=timeout,
                          clock=clock or SystemClock())
    warnings += run.warnings
    tree = _settle(target_executor, layout, snap, destination, snapshots, present, partials,
                   warnings)
    sent = run.stats.get(route.sent_key)
    log.info("[%s] %s is in %s (%s bytes sent)", target_executor.host, snap, tree, sent)
    return RsyncResult(sent, warnings, tree)


def _rsync_snapshot(source_zfs: Zfs, snap: SnapshotName, route: _Route, destination: str,
                    link_dest: list[str], target: str, *, bandwidth_limit: Timetable,
                    timeout: float | None, clock: Clock) -> RsyncRun:
    """rsync the files of ``snap`` (through ``snapshot_view``) into ``destination`` on the
    target, hard-linking unchanged files against ``link_dest`` (at most ``MAX_LINK_DEST``),
    restarted at each change of ``bandwidth_limit`` (see the module doc).

    Raises:
        RsyncFailed, RsyncNotFound, SnapshotViewError, ZfsError: see
            ``replicate_snapshot_rsync``.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    with snapshot_view(source_zfs, snap) as view:
        while True:
            in_force = bandwidth_limit.at(clock.now())
            argv = rsync_argv(
                Location(view, route.source_address),
                Location(destination, route.target_address),
                ssh=route.ssh,
                bandwidth_limit=in_force.limit,
                link_dest=link_dest[:MAX_LINK_DEST],
                rsync_path=route.rsync_path,
            )
            log.info("[%s] rsync %s -> %s:%s (bandwidth limit %s)", route.runner.host, snap,
                     target, destination, in_force.describe())
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            change = (None if in_force.until is None
                      else max(1.0, (in_force.until - clock.now()).total_seconds()))
            stops = change is not None and (left is None or change < left)
            try:
                run = run_rsync(route.runner, argv, timeout=change if stops else left)
            except RsyncFailed as exc:
                if not (stops and exc.returncode is None):
                    raise
                log.info("[%s] rsync of %s stopped: the bandwidth limit changes at %s;"
                         " starting it again (--partial kept what arrived)", route.runner.host,
                         snap, f"{in_force.until:%Y-%m-%d %H:%MZ}")
                continue
            break
    if run.returncode == VANISHED:
        log.warning("rsync of %s: source files vanished (exit 24): %s", snap, run.warnings)
    return run


def _settle(target: Executor, layout: TargetLayout, snap: SnapshotName, destination: str,
            snapshots: list[SnapshotInfo], present: set[str], partials: list[str], warnings: list[str]) -> str:
    """Make the finished ``destination`` the snapshot's tree, point ``current`` at it when it
    is the newest, and remove partial trees no longer wanted (snapshots gone from the source
    or finished meanwhile); return the tree's path.

    Raises:
        CommandFailed: a command on the target failed.
    """
    tree = layout.tree(snap.short)
    target.run(["mv", "--", destination, tree])
    present.add(snap.short)
    if newest_present(snapshots, present) == snap.short:
        _point_current(target, layout, snap.short, warnings)
    pending = {str(s.guid) for s in snapshots if s.short not in present}
    guid = next(str(s.guid) for s in snapshots if s.name == snap)
    for stale in partials:
        if stale != guid and stale not in pending:
            target.run(["rm", "-rf", "--", posixpath.join(layout.partial, stale)])
    return tree
