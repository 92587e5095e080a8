"""The file verbs of ``zbak serve`` as requests (PURE): what the master sends, what serve parses.

A backup host whose key runs ``zbak serve`` refuses ``zfs clone``, ``mktemp``, ``tar`` and
every other program a direct reading of a replica's files needs. With ``--allow-file-read``
it answers three requests instead, each one argv (``proc.openssh.remote_command`` quotes it,
``serve.cmdline`` splits it back):

- ``zbak-files probe``: prints ``PROBE_ANSWER``; the master's way to tell that the host runs
  ``zbak serve`` with file reads allowed (``files.access``);
- ``zbak-files read SNAPSHOT PATH...``: a POSIX tar stream of the paths of the snapshot on
  stdout (``files.snapshot_files.tar_argv``), read through a view serve makes and removes
  itself (``replication.snapshot_view``);
- ``zbak-files versions DATASET PATH [GUID...]``: one JSON object per line
  (``files.versions.FileState``) for each snapshot of the dataset (only those with the
  given guids, when any are given), oldest first.

``PROGRAM`` is a name no host has as a program: where zbak logs in without ``zbak serve``, the
login shell answers a request with "command not found" (127) and the master reads the
snapshot directly. Names follow the OpenZFS naming rules and paths ``files.paths``; anything
else is refused before serve does anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from zrepl_py.errors import CommandRefused, InvalidName
from zrepl_py.files.paths import InvalidPath, parse_path
from zrepl_py.zfs.names import DatasetName, SnapshotName

PROGRAM = "zbak-files"
PROBE_ANSWER = "zbak-files 1"
"""What ``zbak-files probe`` prints (the verbs' version)."""
PATH_UNREADABLE = 65
"""Exit status of ``read`` when a path is not in the snapshot (EX_DATAERR, sysexits.h);
its reason is serve's last line on stderr."""
MAX_GUIDS = 2000
"""Guids one ``versions`` request names at most (about 40 KB of request, under serve's
64 KiB limit, ``serve.cmdline.MAX_COMMAND_BYTES``)."""


@dataclasses.dataclass(frozen=True)
class Probe:
    """``zbak-files probe``."""


@dataclasses.dataclass(frozen=True)
class ReadFiles:
    """``zbak-files read SNAPSHOT PATH...``."""

    snapshot: SnapshotName
    paths: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FileVersions:
    """``zbak-files versions DATASET PATH [GUID...]``; ``guids`` empty: every snapshot."""

    dataset: DatasetName
    path: str
    guids: tuple[int, ...] = ()


FileRequest = Probe | ReadFiles | FileVersions


def probe_argv() -> list[str]:
    """The probe request."""
    return [PROGRAM, "probe"]


def read_argv(snapshot: str, paths: Sequence[str]) -> list[str]:
    """The request for a tar stream of ``paths`` of ``snapshot``."""
    return [PROGRAM, "read", str(snapshot), *paths]


def versions_argv(dataset: str, path: str, guids: Iterable[int] = ()) -> list[str]:
    """The request for PATH's state in the snapshots of ``dataset`` (with these guids)."""
    return [PROGRAM, "versions", str(dataset), path, *(str(int(g)) for g in guids)]


def parse_request(argv: Sequence[str]) -> FileRequest:
    """The request ``argv`` (``argv[0]`` is ``PROGRAM``).

    Raises:
        CommandRefused: not one of the three shapes of the module doc, a name that breaks
            the OpenZFS naming rules, a path ``files.paths`` refuses, a guid that is not a
            number.
    """
    verb, args = (argv[1], list(argv[2:])) if len(argv) > 1 else ("", [])
    try:
        if verb == "probe" and not args:
            return Probe()
        if verb == "read" and len(args) >= 2:
            return ReadFiles(SnapshotName(args[0]), tuple(parse_path(p) for p in args[1:]))
        if verb == "versions" and len(args) >= 2:
            if not all(g.isdigit() for g in args[2:]) or len(args) - 2 > MAX_GUIDS:
                raise CommandRefused(f"{PROGRAM} versions: guids must be at most"
                                     f" {MAX_GUIDS} numbers")
            return FileVersions(DatasetName(args[0]), parse_path(args[1]),
                                tuple(int(g) for g in args[2:]))
    except (InvalidName, InvalidPath) as exc:
        raise CommandRefused(f"{PROGRAM} {verb}: {exc}") from None
    raise CommandRefused(f"{PROGRAM}: expected 'probe', 'read SNAPSHOT PATH...' or 'versions"
                         " DATASET PATH [GUID...]'")
