"""The allow-list of ``zbak serve``: which commands zbak issues, and on what (pure).

``check(commands, policy)`` takes the argvs from ``cmdline.split_command_line`` and returns
the argvs to run, or raises ``CommandRefused`` naming the rule. Every allowed shape below is
one zbak itself issues (``zfs/client.py``, ``zfs/capabilities.py``, ``zfs/resume.py``,
``zfs/sendrecv.py``, ``transport/stages.py``); options are read as zfs's getopt reads them
(``options.parse``), so a flag placed after an operand is still seen.

"Inside" means a dataset equal to one of the ``--root`` datasets or below it (a snapshot or
bookmark counts by its dataset). Names are validated with ``zfs.names`` first, so none has a
leading ``-``, a ``%`` or ``,`` (destroy ranges and lists) or a shell character.

Read-only, names inside a root (``-r``/``-d`` allowed):
  ``zfs get [-Hpr] [-d N] [-o F] [-s S] [-t T] PROPS NAME...``,
  ``zfs list [-Hpr] [-d N] [-o P] [-s P] [-S P] [-t T] NAME...``, ``zfs holds [-Hpr] SNAP...``.
  The roots' ancestors (their pool included) may be read too, but not recursively, except
  ``zfs list -o name,origin -r POOL`` (names and origins only: zbak looks for clones
  pool-wide). ``zpool get [-Hp] [-o F] PROPS POOL``, ``zpool status [-LPpvx] POOL`` and
  ``zpool list [-HLPpv] [-o P] POOL`` for the roots' pools. ``zfs version``, ``zpool version``.
  ``zpool sync POOL`` for the roots' pools (writes dirty data out so ``written`` is current
  before ``min_change`` reads it; it changes no data).
Capability probes (``zfs/capabilities.py``; they change nothing): ``zfs send`` with flags and
  no snapshot (zfs prints its usage), ``zfs snapshot POOL@zbak%probe1 POOL@zbak%probe2`` (both
  names are invalid, so nothing is created), ``zfs receive -x mountpoint`` with no dataset
  (zfs prints its usage and reads no stream), ``mbuffer -V`` (``transport/stages.py``
  ``MBUFFER_PROBE``: prints mbuffer's version, the one way mbuffer may run alone).
Replication, inside a root:
  ``zfs receive -u [-s] [-o PROP=VALUE]... [-x PROP]... DS`` with only the configured replica
  properties (``Policy.properties``: each ``-o`` one of its set values exactly, each ``-x``
  one of its exclusions; ``-F`` only with ``allow_force_receive``), ``zfs receive -A DS``,
  ``zfs set PROP=VALUE DS...`` for the same set values (and a non-inheritable exclusion's reset
  value, such as ``refreservation=none``), ``zfs inherit PROP DS`` for an inheritable
  exclusion (``replication/zfs_target.py`` repairs a replica with these after a receive),
  ``zfs set zbak:restoring=HOST:DATASET DS`` and ``zfs inherit zbak:restoring DS`` (the mark
  of a restore into a root, ``restore.mark``),
  ``zfs set zbak:source-mountpoint=PATH DS`` (PATH absolute and normalised, or ``none``,
  ``legacy``) and ``zfs inherit zbak:source-mountpoint DS`` (the source's mountpoint a
  replication records, ``replication.settle``: a user property, mounting nothing),
  ``zfs create [-p] DS``, ``zfs hold TAG SNAP...``, ``zfs release TAG SNAP...``,
  ``zfs snapshot [-r] DS@PREFIX_YYYYMMDDTHHMMSSZ...`` (zbak's own names only),
  ``zfs bookmark SNAP DS#NAME`` (same dataset),
  ``zfs send [-wcLenvPp] [-i|-I BASE] SNAP`` (BASE inside too),
  ``zfs send [-nvP] -t TOKEN`` where the token's snapshot is inside (``token``; for a real
  send the caller also checks the guid, see ``Approved.token``).
With ``allow_destroy_own`` (``on_divergence = "rollback"``, replica retention, source prune):
  ``zfs destroy DS@PREFIX_YYYYMMDDTHHMMSSZ`` and ``zfs destroy DS#zbak_...`` (one name, no
  flags: never ``-r``/``-R``/``-f``), ``zfs rollback SNAP`` (no flags: zfs refuses while
  newer snapshots exist). With a ``floor`` those are further checked when they run
  (``serve.floor``, ``serve.guard``), and ``zfs release`` takes zbak's own tags only.
Restores and drills on this host (``restore.execute``, ``zrepl_py.drill``):
  ``zfs send [...] SNAP | zfs receive -u [...] DS``, both checked as above: a copy from one
  dataset inside a root to another, which the master could make anyway by sending with one
  request and receiving with another (the stream then stays on this host);
  ``zfs create -o canmount=off -o mountpoint=none -o zbak:drill=NODE:PID:START DS`` for a
  drill's scratch ``DS`` (its last component ``zbak-drill-<8 hex>``: ``drill.scratch``).
With ``allow_drill`` (``--allow-drill``):
  ``zfs destroy NAME`` (one name, no flags) of a dataset or snapshot at or below a scratch
  ``.../zbak-drill-<8 hex>`` inside a root (a drill destroys its scratch one name at a time);
  ``zbak digest [--zfs ZFS] SNAP`` for a snapshot inside a root, answered by zbak serve itself
  (``drill.manifest``: its files' SHA-256 and metadata, read through ``.zfs/snapshot`` or a
  temporary clone ``POOL/zbak-view-<hex>``), the ``--zfs`` of the request ignored for serve's own.
Pipelines, exactly the data path's shapes (``transport/stages.py``):
  ``[zstd -q -d -c |] [mbuffer -q -v 1 -s 128k -m <N>k |] zfs receive ...`` (at least one of
  the two before ``zfs receive``, never ``receive -A``) and ``zfs send ... | zstd -q -T0 -3 -c``.
  zstd takes ``-q -c -d -T# -#`` only and no file operand: it reads stdin and writes stdout.
  mbuffer takes exactly ``-q -v 1 -s 128k -m <N>k`` (``stages.mbuffer_argv``), with N whole
  KiB from 1 MiB (``ReplicateConfig.receive_buffer``'s floor) to ``mbuffer.MAX_BYTES``:
  mbuffer(1) can also read and write files (``-i``, ``-o``, ``-l``, ``-T``), listen on and
  connect to TCP ports (``-I``, ``-O``) and run a command (``-A``), so nothing else passes.
With ``allow_file_read``: the file verbs ``zbak-files probe``, ``zbak-files read SNAP PATH...``
  and ``zbak-files versions DS PATH [GUID...]`` (``files.verbs``), alone, the snapshot or
  dataset inside a root; serve runs them itself (``serve.files``), making and removing the
  one view clone a read needs.
With ``allow_failover``: the failover verbs ``zbak replica promote|demote|release`` on one
  dataset inside a root (``serve.failover``), never as raw commands.
Never: any other program, ``sudo``, a shell, another ``zfs set/inherit``, ``zfs clone/promote/
rename/allow/mount/upgrade``, ``zpool`` changes, ``receive -F`` (by default), ``destroy`` of a
dataset (but a drill's scratch).
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from zrepl_py.drill.names import MARK, is_scratch, within
from zrepl_py.errors import CommandRefused, InvalidName
from zrepl_py.files import verbs
from zrepl_py.proc import mbuffer
from zrepl_py.restore.mark import RESTORING, is_mark_value
from zrepl_py.serve.failover import PROGRAM as VERB_PROGRAM
from zrepl_py.serve.failover import Verb, check_verb
from zrepl_py.serve.floor import Floor, FloorAction
from zrepl_py.serve.options import Parsed, parse
from zrepl_py.serve.token import TokenTarget, read_token
from zrepl_py.snapshots.naming import is_own
from zrepl_py.values.failover import MOUNTPOINT_PROPERTY
from zrepl_py.zfs.names import (
    BookmarkName,
    DatasetName,
    SnapshotName,
    check_hold_tag,
    check_property_name,
    check_user_property_value,
    parse_any_name,
)
from zrepl_py.zfs.properties import ReceiveProperties

N = TypeVar("N", DatasetName, SnapshotName)

OWN_BOOKMARK_PREFIX = "zbak_"
"""Start of zbak's cursor bookmarks (``zfs.protect.bookmark_prefix``)."""

PROBE_SNAPSHOTS = ("zbak%probe1", "zbak%probe2")
"""Short names of the multi-snapshot probe (``zfs/capabilities.py``, probe 6)."""

_GET_FIELDS = frozenset({"name", "property", "value", "received", "source"})
_TYPES = frozenset({"filesystem", "volume", "snapshot", "snap", "bookmark", "all"})
_SOURCES = frozenset({"local", "default", "inherited", "temporary", "received", "none"})
_ZSTD_ARG = re.compile(r"-q|-c|-d|-T[0-9]{1,3}|-(?:[1-9]|1[0-9])")

_MBUFFER_SIZE = re.compile(r"([1-9][0-9]{0,11})k")
_MBUFFER_OPTIONS = frozenset({"-q", "-v", "-s", "-m"})
_RECEIVE_PIPELINES = (("zstd", "zfs"), ("mbuffer", "zfs"), ("zstd", "mbuffer", "zfs"))


@dataclasses.dataclass(frozen=True)
class Policy:
    """What one ``zbak serve`` allows (its command-line options).

    Attributes:
        roots: datasets under which names are allowed (``--root``, at least one; plain
            strings are parsed, InvalidName if one is not a dataset name).
        allow_destroy_own: allow destroying zbak's own snapshots and bookmarks and plain
            ``zfs rollback`` (``--allow-destroy-own``).
        allow_force_receive: allow ``zfs receive -F`` (``--allow-force-receive``; zbak never
            issues it).
        prefix: the snapshot prefix that marks zbak's own snapshots (``--prefix``).
        properties: the replica properties receives may set (``-o``) and exclude (``-x``)
            (``--receive-set``, ``--receive-exclude``; by default zbak's defaults, as a job
            without ``[replicate] properties`` uses them).
        zfs, zpool, zstd, mbuffer: the programs actually executed (``--zfs`` etc.); a
            request may name a program by its plain name or by exactly this path.
        floor: what is kept whatever the master asks (``--keep-newer-than``,
            ``--keep-last``; ``serve.floor``), None without one; ValueError together with
            ``allow_force_receive`` (a forced receive destroys snapshots).
        allow_file_read: answer the file verbs (``--allow-file-read``; ``serve.files``).
        allow_failover: allow the failover verbs (``--allow-failover``, ``serve.failover``).
        failover_mounts: directories a promoted replica may be mounted at or below
            (``--failover-mounts``; absolute and normalised, ValueError otherwise).
        allow_drill: allow a drill's scratch destroys and the ``zbak digest`` verb
            (``--allow-drill``).
    """

    roots: tuple[DatasetName, ...]
    allow_destroy_own: bool = False
    allow_force_receive: bool = False
    prefix: str = "zbak"
    properties: ReceiveProperties = ReceiveProperties.of()
    zfs: str = "zfs"
    zpool: str = "zpool"
    zstd: str = "zstd"
    mbuffer: str = "mbuffer"
    floor: Floor | None = None
    allow_file_read: bool = False
    allow_failover: bool = False
    failover_mounts: tuple[str, ...] = ()
    allow_drill: bool = False

    def __post_init__(self) -> None:
        if not self.roots:
            raise ValueError("zbak serve needs at least one --root")
        if self.floor is not None and self.allow_force_receive:
            raise ValueError("--allow-force-receive cannot be used with a floor "
                             "(--keep-newer-than): zfs receive -F destroys snapshots")
        for directory in self.failover_mounts:
            if not directory.startswith("/") or posixpath.normpath(directory) != directory \
                    or directory == "/":
                raise ValueError(f"--failover-mounts {directory!r}: a normalised absolute "
                                 "directory other than / is needed")
        # Parse, don't validate: plain strings become DatasetName (InvalidName if bad).
        object.__setattr__(self, "roots", tuple(DatasetName(root) for root in self.roots))

    @property
    def pools(self) -> frozenset[str]:
        """The pools the roots live in."""
        return frozenset(root.pool for root in self.roots)

    def inside(self, dataset: str) -> bool:
        """True when ``dataset`` is a root or below one."""
        return any(dataset == root or dataset.startswith(root + "/") for root in self.roots)

    def above(self, dataset: str) -> bool:
        """True when ``dataset`` is a proper ancestor of a root (its pool included)."""
        return any(root.startswith(dataset + "/") for root in self.roots)


@dataclasses.dataclass(frozen=True)
class Approved:
    """An allowed request.

    Attributes:
        argvs: the commands to run, a pipeline when more than one, each starting with the
            program to execute (``Policy.zfs`` etc.).
        token: for a real ``zfs send -t`` (not ``-n``), the snapshot the token names; the
            executor must check a snapshot with ``token.toguid`` exists below
            ``token.toname``'s dataset before running it (see ``serve.token``).
        floor: with a floor, what it does around this request (``serve.guard``).
        files: a file verb to run in serve itself (``serve.files``); ``argvs`` is empty.
        verb: a failover verb to carry out in place of ``argvs`` (``serve.failover``).
        digest: for ``zbak digest``, the snapshot whose manifest zbak serve prints itself
            (``argvs`` is empty then).
    """

    argvs: tuple[tuple[str, ...], ...]
    token: TokenTarget | None = None
    floor: FloorAction | None = None
    files: verbs.FileRequest | None = None
    verb: Verb | None = None
    digest: SnapshotName | None = None


def check(commands: Sequence[Sequence[str]], policy: Policy) -> Approved:
    """Return what to run for ``commands`` (from ``cmdline.split_command_line``).

    Raises:
        CommandRefused: the request is not one of the shapes in the module doc; the message
            says which rule it broke.
    """
    if commands and commands[0] and commands[0][0] == verbs.PROGRAM:
        return _files(commands, policy)
    if (len(commands) == 1 and list(commands[0][1:2]) == ["digest"]
            and _program(commands[0][0], policy) == "zbak"):  # before the failover verbs
        return Approved((), digest=_zbak_digest(commands[0], policy))
    if len(commands) == 1 and commands[0][0] == VERB_PROGRAM:
        return Approved((), verb=check_verb(commands[0], policy))
    programs = [_program(argv[0], policy) for argv in commands]
    if len(commands) == 1:
        if programs[0] == "zstd":
            raise CommandRefused("zstd runs only in a pipeline with zfs send or zfs receive")
        if programs[0] == "mbuffer":
            if tuple(commands[0][1:]) != mbuffer.PROBE[1:]:
                raise CommandRefused("mbuffer is not allowed alone except as the probe "
                                     "'mbuffer -V'; it runs only directly before zfs receive")
            return Approved(((policy.mbuffer, *mbuffer.PROBE[1:]),))
        token = _check_one(programs[0], commands[0], policy)
        return Approved((_resolved(programs[0], commands[0], policy),), token)
    if "zbak" in programs:
        raise CommandRefused("zbak digest runs alone, not in a pipeline")
    resolved = tuple(_resolved(p, c, policy) for p, c in zip(programs, commands, strict=True))
    if tuple(programs) in _RECEIVE_PIPELINES:
        if programs[0] == "zstd":
            _check_zstd(commands[0], decompress=True)
        if programs[-2] == "mbuffer":
            _check_mbuffer(commands[-2])
        if not _is_receive(commands[-1]):
            raise CommandRefused(f"{'zstd -d' if programs[-2] == 'zstd' else 'mbuffer'} "
                                 "may only feed zfs receive")
        _check_one("zfs", commands[-1], policy)
        return Approved(resolved)
    if tuple(programs) == ("zfs", "zfs"):
        if list(commands[0][1:2]) != ["send"]:
            raise CommandRefused("zfs | zfs must be zfs send | zfs receive")
        if not _is_receive(commands[1]):
            raise CommandRefused("zfs send may only feed zfs receive")
        token = _check_one("zfs", commands[0], policy)
        _check_one("zfs", commands[1], policy)
        return Approved(resolved, token)
    if tuple(programs) == ("zfs", "zstd"):
        _check_zstd(commands[1], decompress=False)
        if len(commands[0]) < 2 or commands[0][1] != "send":
            raise CommandRefused("zstd -c may only read from zfs send")
        token = _check_one("zfs", commands[0], policy)
        return Approved(resolved, token)
    shape = " | ".join(programs)
    where = "; mbuffer runs only directly before zfs receive" if "mbuffer" in programs else ""
    raise CommandRefused(f"pipeline {shape!r} is not one zbak uses (only 'zstd -d | zfs "
                         "receive', 'zstd -d | mbuffer | zfs receive', 'mbuffer | zfs receive', "
                         f"'zfs send | zstd' and 'zfs send | zfs receive'){where}")


def _files(commands: Sequence[Sequence[str]], policy: Policy) -> Approved:
    """A file verb (``files.verbs``), alone, with ``--allow-file-read``, on a snapshot or
    dataset inside a root."""
    if len(commands) != 1:
        raise CommandRefused(f"{verbs.PROGRAM} runs alone, never in a pipeline")
    if not policy.allow_file_read:
        raise CommandRefused("reading files is not allowed (start zbak serve with "
                             "--allow-file-read, as root: a snapshot's files are read "
                             "through a mounted view)")
    request = verbs.parse_request(commands[0])
    if isinstance(request, verbs.ReadFiles):
        _require_inside(request.snapshot, policy, f"{verbs.PROGRAM} read")
    elif isinstance(request, verbs.FileVersions):
        _require_inside(request.dataset, policy, f"{verbs.PROGRAM} versions")
    return Approved((), files=request)


def _program(name: str, policy: Policy) -> str:
    for plain, configured in (("zfs", policy.zfs), ("zpool", policy.zpool),
                              ("zstd", policy.zstd), ("mbuffer", policy.mbuffer)):  # fmt: skip
        if name in (plain, configured):
            return plain
    if name == "zbak" or (name.startswith("/") and posixpath.basename(name) == "zbak"):
        return "zbak"
    if name == "sudo":
        raise CommandRefused("sudo is not allowed: zbak serve runs commands as the login user; "
                             "set sudo = false for this host and delegate with zfs allow")
    raise CommandRefused(f"program {name!r} is not allowed (only zfs, zpool, zstd or "
                         "mbuffer in a pipeline, and zbak digest)")


def _resolved(program: str, argv: Sequence[str], policy: Policy) -> tuple[str, ...]:
    return (getattr(policy, program), *argv[1:])


def _check_zstd(argv: Sequence[str], *, decompress: bool) -> None:
    args = list(argv[1:])
    bad = [a for a in args if not _ZSTD_ARG.fullmatch(a)]
    if bad:
        raise CommandRefused(f"zstd argument {bad[0]!r} is not allowed (no files, no options "
                             "beyond -q -c -d -T# -#)")
    if ("-d" in args) != decompress or "-c" not in args:
        want = "zstd -d -c before zfs receive" if decompress else "zstd -c (no -d) after zfs send"
        raise CommandRefused(f"zstd arguments {args!r}: expected {want}")


def _check_mbuffer(argv: Sequence[str]) -> None:
    """Require exactly ``mbuffer -q -v 1 -s 128k -m <N>k`` with N KiB within the bounds."""
    args = list(argv[1:])
    for arg in args:
        if arg.startswith("-") and arg not in _MBUFFER_OPTIONS:
            raise CommandRefused(f"mbuffer option {arg!r} is not allowed (mbuffer can write "
                                 "files, open network connections and run commands; only "
                                 "-q -v 1 -s 128k -m <N>k)")
    if tuple(args[:-1]) != mbuffer.FIXED_ARGS:
        raise CommandRefused(f"mbuffer arguments {args!r} are not allowed: expected exactly "
                             "-q -v 1 -s 128k -m <N>k (no file operands)")
    size = _MBUFFER_SIZE.fullmatch(args[-1])
    if size is None:
        raise CommandRefused(f"mbuffer -m {args[-1]!r} is not allowed: expected whole KiB "
                             "as <digits>k")
    if not mbuffer.MIN_BYTES <= int(size.group(1)) * 1024 <= mbuffer.MAX_BYTES:
        raise CommandRefused(f"mbuffer -m {args[-1]} is not allowed: the buffer must be "
                             f"{mbuffer.MIN_BYTES // 1024}k to {mbuffer.MAX_BYTES // 1024}k "
                             "(1 MiB to 16 GiB)")


def _is_receive(argv: Sequence[str]) -> bool:
    """True for ``zfs receive``/``recv`` without ``-A`` (alone or in a cluster), i.e. a
    command that reads a stream."""
    if len(argv) < 2 or argv[1] not in ("receive", "recv"):
        return False
    return not any(arg.startswith("-") and "A" in arg for arg in argv[2:])


def _check_one(program: str, argv: Sequence[str], policy: Policy) -> TokenTarget | None:
    if len(argv) < 2:
        raise CommandRefused(f"{program} without a subcommand is not allowed")
    sub, args = argv[1], list(argv[2:])
    table = _ZFS if program == "zfs" else _ZPOOL
    if program == "zfs" and sub == "recv":
        sub = "receive"
    checker = table.get(sub)
    if checker is None:
        raise CommandRefused(f"{program} {sub} is not allowed")
    return checker(args, policy)


def _zbak_digest(argv: Sequence[str], policy: Policy) -> SnapshotName:
    """Check ``zbak digest [--zfs ZFS] SNAP``; return the snapshot."""
    what = "zbak digest"
    if list(argv[1:2]) != ["digest"]:
        raise CommandRefused(f"zbak {' '.join(argv[1:2])!s} is not allowed (only zbak digest)")
    if not policy.allow_drill:
        raise CommandRefused(f"{what} is not allowed (start zbak serve with --allow-drill to"
                             " let drills compare this host's copies)")
    args = list(argv[2:])
    if len(args) == 3 and args[0] == "--zfs":
        args = args[2:]
    if len(args) != 1 or "@" not in args[0]:
        raise CommandRefused(f"{what} takes [--zfs ZFS] and one snapshot")
    return _snapshot(args[0], policy, what)


def _in_scratch(name: str, policy: Policy) -> bool:
    """True when ``name`` (a dataset or snapshot) is at or below a drill's scratch
    ``.../zbak-drill-<8 hex>`` that is below a root."""
    found = within(_dataset_part(name))
    return found is not None and policy.inside(found) and found not in policy.roots


# -- names -----------------------------------------------------------------------------


def _name(text: str, what: str) -> DatasetName | SnapshotName | BookmarkName:
    try:
        return parse_any_name(text)
    except InvalidName as exc:
        raise CommandRefused(f"{what}: {exc}") from None


def _dataset_part(name: str) -> str:
    return name.split("@", 1)[0].split("#", 1)[0]


def _require_inside(name: str, policy: Policy, what: str) -> None:
    if not policy.inside(_dataset_part(name)):
        roots = ", ".join(policy.roots)
        raise CommandRefused(f"{what}: {name} is outside the allowed root ({roots})")


def _readable(names: Sequence[str], policy: Policy, *, recursive: bool, what: str,
              pool_wide_ok: bool = False) -> None:
    if not names:
        raise CommandRefused(f"{what} needs a dataset (listing every pool is not allowed)")
    for text in names:
        name = _name(text, what)
        dataset = _dataset_part(name)
        if policy.inside(dataset):
            continue
        if policy.above(dataset):
            if not recursive or (pool_wide_ok and dataset in policy.pools and name == dataset):
                continue
            raise CommandRefused(f"{what}: recursive read of {name}, above the allowed root, "
                                 "is not allowed")
        raise CommandRefused(f"{what}: {name} is outside the allowed root "
                             f"({', '.join(policy.roots)})")


def _recursive(parsed: Parsed) -> bool:
    return parsed.has("r") or any(d != "0" for d in parsed.values("d"))


def _check_depths(parsed: Parsed, what: str) -> None:
    for depth in parsed.values("d"):
        if not depth.isdigit():
            raise CommandRefused(f"{what}: -d {depth!r} is not a depth")


def _check_list(value: str, allowed: frozenset[str] | None, what: str) -> list[str]:
    items = value.split(",")
    for item in items:
        if allowed is not None:
            if item not in allowed:
                raise CommandRefused(f"{what}: {item!r} is not allowed")
        else:
            try:
                check_property_name(item)
            except InvalidName as exc:
                raise CommandRefused(f"{what}: {exc}") from None
    return items


def _named(kind: Callable[[str], N], text: str, policy: Policy, what: str) -> N:
    """``kind(text)`` (DatasetName or SnapshotName), refused unless valid and inside the root."""
    try:
        name = kind(text)
    except InvalidName as exc:
        raise CommandRefused(f"{what}: {exc}") from None
    _require_inside(name, policy, what)
    return name


def _snapshot(text: str, policy: Policy, what: str) -> SnapshotName:
    return _named(SnapshotName, text, policy, what)


def _dataset(text: str, policy: Policy, what: str) -> DatasetName:
    return _named(DatasetName, text, policy, what)


def _no_options(parsed: Parsed, what: str) -> None:
    if parsed.options:
        raise CommandRefused(f"{what} takes no options here")


# -- zfs -------------------------------------------------------------------------------


def _zfs_get(args: list[str], policy: Policy) -> None:
    what = "zfs get"
    parsed = parse(args, flags="Hpr", valued="dost", what=what)
    _check_depths(parsed, what)
    for value in parsed.values("o"):
        _check_list(value, _GET_FIELDS, f"{what} -o")
    for value in parsed.values("t"):
        _check_list(value, _TYPES, f"{what} -t")
    for value in parsed.values("s"):
        _check_list(value, _SOURCES, f"{what} -s")
    if not parsed.operands:
        raise CommandRefused(f"{what} needs a property list and a dataset")
    props = parsed.operands[0]
    if props != "all":
        _check_list(props, None, f"{what} property")
    _readable(parsed.operands[1:], policy, recursive=_recursive(parsed), what=what)


def _zfs_list(args: list[str], policy: Policy) -> None:
    what = "zfs list"
    parsed = parse(args, flags="Hpr", valued="dostS", what=what)
    _check_depths(parsed, what)
    columns: list[str] = []
    for value in parsed.values("o"):
        columns += _check_list(value, None, f"{what} -o")
    for letter in "sS":
        for value in parsed.values(letter):
            _check_list(value, None, f"{what} -{letter}")
    for value in parsed.values("t"):
        _check_list(value, _TYPES, f"{what} -t")
    # zbak finds clones pool-wide (Zfs.clones): names and origins only.
    clones_listing = columns == ["name", "origin"] and not parsed.has("d")
    _readable(parsed.operands, policy, recursive=_recursive(parsed), what=what,
              pool_wide_ok=clones_listing)


def _zfs_holds(args: list[str], policy: Policy) -> None:
    what = "zfs holds"
    parsed = parse(args, flags="Hpr", what=what)
    for text in parsed.operands:
        if "@" not in text:
            raise CommandRefused(f"{what}: {text!r} is not a snapshot")
    _readable(parsed.operands, policy, recursive=parsed.has("r"), what=what)


def _zfs_receive(args: list[str], policy: Policy) -> None:
    what = "zfs receive"
    parsed = parse(args, flags="usAF", valued="ox", what=what)
    if not parsed.operands and list(parsed.options) == [("x", "mountpoint")]:
        return  # capability probe: zfs prints its usage and reads no stream
    if len(parsed.operands) != 1:
        raise CommandRefused(f"{what} takes exactly one dataset")
    _check_receive_properties(parsed, policy, what)
    if parsed.has("A"):
        if parsed.letters() != {"A"}:
            raise CommandRefused(f"{what} -A takes no other option")
    else:
        if parsed.has("F") and not policy.allow_force_receive:
            raise CommandRefused(f"{what} -F is not allowed (it rolls back and destroys "
                                 "snapshots on this host; start zbak serve with "
                                 "--allow-force-receive to permit it)")
        if not parsed.has("u"):
            raise CommandRefused(f"{what} without -u is not allowed (nothing is mounted "
                                 "by a receive)")
    _dataset(parsed.operands[0], policy, what)


def _check_receive_properties(parsed: Parsed, policy: Policy, what: str) -> None:
    assigned = dict(policy.properties.assigned)
    for value in parsed.values("o"):
        name, sep, wanted = value.partition("=")
        if not sep or assigned.get(name) != wanted:
            shown = ", ".join(f"{k}={v}" for k, v in policy.properties.assigned) or "none"
            raise CommandRefused(f"{what} -o {value!r} is not allowed (only the configured "
                                 f"replica properties: {shown}; see --receive-set)")
    for name in parsed.values("x"):
        if name not in policy.properties.excluded:
            shown = ", ".join(policy.properties.excluded) or "none"
            raise CommandRefused(f"{what} -x {name!r} is not allowed (only the configured "
                                 f"exclusions: {shown}; see --receive-exclude)")


def _repair(args: list[str], policy: Policy, what: str, *, many: bool = False
            ) -> tuple[str, list[str]]:
    """Check ``zfs set|inherit WORD DS...`` (no option, every DS a dataset inside a root;
    several only when ``many``); return WORD and the datasets."""
    parsed = parse(args, what=what)
    _no_options(parsed, what)
    word, *names = parsed.operands or [""]
    if not names or (len(names) > 1 and not many) or any("=" in n for n in names):
        raise CommandRefused(f"{what} takes exactly one property and "
                             f"{'one or more datasets' if many else 'one dataset'}")
    for name in names:
        _dataset(name, policy, what)
    return word, names


def _zfs_set(args: list[str], policy: Policy) -> None:
    # Several datasets: zbak sets a property on every replica a batch created at once
    # (replication.settle step 1; zfs-set(8) takes several names).
    what = "zfs set"
    word, datasets = _repair(args, policy, what, many=True)
    name, sep, value = word.partition("=")
    if sep and name == RESTORING:  # a restore into a root marks its new dataset (one)
        if len(datasets) != 1 or not is_mark_value(value):
            raise CommandRefused(f"{what} {RESTORING} takes HOST:DATASET and one dataset")
        return
    if sep and name == MOUNTPOINT_PROPERTY:  # what a failover would mount it at, recorded
        if len(datasets) != 1 or not (value in ("none", "legacy") or (
                value.startswith("/") and posixpath.normpath(value) == value)):
            raise CommandRefused(f"{what} {MOUNTPOINT_PROPERTY} takes a normalised absolute "
                                 "path (or none, legacy) and one dataset")
        return
    if not sep or policy.properties.repairs()[0].get(name) != value:
        raise CommandRefused(f"{what} {word!r} is not allowed (only the configured replica "
                             "properties; see --receive-set)")


def _zfs_inherit(args: list[str], policy: Policy) -> None:
    what = "zfs inherit"
    name, _ = _repair(args, policy, what)
    if name not in (RESTORING, MOUNTPOINT_PROPERTY) and name not in policy.properties.repairs()[1]:
        raise CommandRefused(f"{what} {name!r} is not allowed (only the configured "
                             "exclusions that inherit; see --receive-exclude)")


def _zfs_create(args: list[str], policy: Policy) -> None:
    what = "zfs create"
    parsed = parse(args, flags="p", valued="o", what=what)
    if len(parsed.operands) != 1:
        raise CommandRefused(f"{what} takes exactly one dataset")
    dataset = _dataset(parsed.operands[0], policy, what)
    if parsed.has("o"):
        _check_scratch_options(parsed, dataset, what)


def _check_scratch_options(parsed: Parsed, dataset: DatasetName, what: str) -> None:
    """Allow exactly a drill scratch's ``-o canmount=off -o mountpoint=none -o
    zbak:drill=VALUE`` on a scratch name (``drill.scratch.create``)."""
    if not is_scratch(dataset) or parsed.has("p"):
        raise CommandRefused(f"{what} -o is allowed only for a drill's scratch "
                             "(.../zbak-drill-<8 hex>, without -p)")
    given = dict(value.partition("=")[::2] for value in parsed.values("o"))
    if len(given) != len(parsed.values("o")) or set(given) != {"canmount", "mountpoint", MARK} \
            or given["canmount"] != "off" or given["mountpoint"] != "none":
        raise CommandRefused(f"{what}: a drill's scratch takes exactly -o canmount=off "
                             f"-o mountpoint=none -o {MARK}=NODE:PID:START")
    try:
        check_user_property_value(given[MARK], MARK)
    except InvalidName as exc:
        raise CommandRefused(f"{what}: {exc}") from None


def _zfs_snapshot(args: list[str], policy: Policy) -> None:
    what = "zfs snapshot"
    parsed = parse(args, flags="r", what=what)
    probe = [f"{pool}@{short}" for pool in sorted(policy.pools) for short in PROBE_SNAPSHOTS]
    if not parsed.options and len(parsed.operands) == 2 \
            and list(parsed.operands) in [probe[i:i + 2] for i in range(0, len(probe), 2)]:
        return  # capability probe: '%' is invalid, so zfs creates nothing
    if not parsed.operands:
        raise CommandRefused(f"{what} needs a snapshot name")
    for text in parsed.operands:
        snap = _snapshot(text, policy, what)
        if not is_own(policy.prefix, snap.short):
            raise CommandRefused(f"{what}: {snap} is not a zbak snapshot name "
                                 f"({policy.prefix}_YYYYMMDDTHHMMSSZ)")


def _zfs_hold_or_release(args: list[str], policy: Policy, what: str) -> None:
    parsed = parse(args, what=what)
    if len(parsed.operands) < 2:
        raise CommandRefused(f"{what} needs a tag and a snapshot")
    try:
        check_hold_tag(parsed.operands[0])
    except InvalidName as exc:
        raise CommandRefused(f"{what}: {exc}") from None
    for text in parsed.operands[1:]:
        _snapshot(text, policy, what)


def _zfs_hold(args: list[str], policy: Policy) -> None:
    _zfs_hold_or_release(args, policy, "zfs hold")


def _zfs_release(args: list[str], policy: Policy) -> None:
    _zfs_hold_or_release(args, policy, "zfs release")


def _zfs_bookmark(args: list[str], policy: Policy) -> None:
    what = "zfs bookmark"
    parsed = parse(args, what=what)
    if len(parsed.operands) != 2:
        raise CommandRefused(f"{what} takes a snapshot and a bookmark")
    source = _name(parsed.operands[0], what)
    if isinstance(source, DatasetName) or not isinstance(source, (SnapshotName, BookmarkName)):
        raise CommandRefused(f"{what}: {source} is not a snapshot or bookmark")
    _require_inside(source, policy, what)
    try:
        mark = BookmarkName(parsed.operands[1])
    except InvalidName as exc:
        raise CommandRefused(f"{what}: {exc}") from None
    if _dataset_part(mark) != _dataset_part(source):
        raise CommandRefused(f"{what}: {mark} is not in the dataset of {source}")


def _zfs_send(args: list[str], policy: Policy) -> TokenTarget | None:
    what = "zfs send"
    parsed = parse(args, flags="wcLenvPp", valued="iIt", what=what)
    bases = parsed.values("i") + parsed.values("I")
    tokens = parsed.values("t")
    if len(bases) > 1 or len(tokens) > 1:
        raise CommandRefused(f"{what}: one -i/-I base and one -t token at most")
    if tokens:
        if bases or parsed.operands or not parsed.letters() <= {"t", "n", "v", "P"}:
            raise CommandRefused(f"{what} -t takes only -n -v -P and no snapshot")
        target = read_token(tokens[0])
        _require_inside(target.toname, policy, f"{what} -t (the token's snapshot)")
        return None if parsed.has("n") else target
    if not parsed.operands:
        if bases:
            raise CommandRefused(f"{what} -i/-I needs a snapshot")
        return None  # capability probe: zfs prints its usage and sends nothing
    if len(parsed.operands) != 1:
        raise CommandRefused(f"{what} takes exactly one snapshot")
    snap = _snapshot(parsed.operands[0], policy, what)
    if bases:
        base = _name(bases[0], f"{what} base")
        if isinstance(base, BookmarkName) and parsed.has("I"):
            raise CommandRefused(f"{what} -I does not take a bookmark")
        if not isinstance(base, (SnapshotName, BookmarkName)):
            raise CommandRefused(f"{what}: base {base} is not a snapshot or bookmark")
        if _dataset_part(base) != snap.dataset:
            raise CommandRefused(f"{what}: base {base} is not in the dataset of {snap}")
    return None


def _zfs_destroy(args: list[str], policy: Policy) -> None:
    what = "zfs destroy"
    if policy.allow_drill and len(args) == 1 and not args[0].startswith("-") \
            and "#" not in args[0] and _in_scratch(_name(args[0], what), policy):
        return  # a drill destroys its own scratch, one name at a time
    if not policy.allow_destroy_own:
        raise CommandRefused(f"{what} is not allowed (start zbak serve with "
                             "--allow-destroy-own to let zbak destroy its own snapshots)")
    parsed = parse(args, what=what)
    _no_options(parsed, what)
    if len(parsed.operands) != 1:
        raise CommandRefused(f"{what} takes exactly one snapshot or bookmark")
    name = _name(parsed.operands[0], what)
    _require_inside(name, policy, what)
    if isinstance(name, SnapshotName):
        if not is_own(policy.prefix, name.short):
            raise CommandRefused(f"{what}: {name} is not a zbak snapshot "
                                 f"({policy.prefix}_YYYYMMDDTHHMMSSZ); only those may be "
                                 "destroyed")
    elif isinstance(name, BookmarkName):
        if not name.split("#", 1)[1].startswith(OWN_BOOKMARK_PREFIX):
            raise CommandRefused(f"{what}: {name} is not a zbak bookmark")
    else:
        raise CommandRefused(f"{what}: {name} is a dataset; only zbak's own snapshots may be "
                             "destroyed")


def _zfs_rollback(args: list[str], policy: Policy) -> None:
    what = "zfs rollback"
    if not policy.allow_destroy_own:
        raise CommandRefused(f"{what} is not allowed (start zbak serve with "
                             "--allow-destroy-own for on_divergence = \"rollback\")")
    parsed = parse(args, what=what)
    _no_options(parsed, what)
    if len(parsed.operands) != 1:
        raise CommandRefused(f"{what} takes exactly one snapshot")
    _snapshot(parsed.operands[0], policy, what)


def _version(args: list[str], policy: Policy) -> None:
    if args:
        raise CommandRefused("version takes no arguments")


_ZFS: dict[str, Callable[[list[str], Policy], TokenTarget | None]] = {
    "get": _zfs_get,
    "list": _zfs_list,
    "holds": _zfs_holds,
    "receive": _zfs_receive,
    "set": _zfs_set,
    "inherit": _zfs_inherit,
    "create": _zfs_create,
    "snapshot": _zfs_snapshot,
    "hold": _zfs_hold,
    "release": _zfs_release,
    "bookmark": _zfs_bookmark,
    "send": _zfs_send,
    "destroy": _zfs_destroy,
    "rollback": _zfs_rollback,
    "version": _version,
}


# -- zpool -----------------------------------------------------------------------------


def _pool_operand(parsed: Parsed, policy: Policy, what: str, *, skip: int = 0) -> None:
    operands = parsed.operands[skip:]
    if len(operands) != 1:
        raise CommandRefused(f"{what} takes exactly one pool")
    if operands[0] not in policy.pools:
        raise CommandRefused(f"{what}: pool {operands[0]!r} is not the pool of an allowed root "
                             f"({', '.join(sorted(policy.pools))})")


def _zpool_get(args: list[str], policy: Policy) -> None:
    what = "zpool get"
    parsed = parse(args, flags="Hp", valued="o", what=what)
    for value in parsed.values("o"):
        _check_list(value, frozenset({"name", "property", "value", "source"}), f"{what} -o")
    if not parsed.operands:
        raise CommandRefused(f"{what} needs a property list and a pool")
    if parsed.operands[0] != "all":
        _check_list(parsed.operands[0], None, f"{what} property")
    _pool_operand(parsed, policy, what, skip=1)


def _zpool_status(args: list[str], policy: Policy) -> None:
    what = "zpool status"
    parsed = parse(args, flags="LPpvx", what=what)
    _pool_operand(parsed, policy, what)


def _zpool_list(args: list[str], policy: Policy) -> None:
    what = "zpool list"
    parsed = parse(args, flags="HLPpv", valued="o", what=what)
    for value in parsed.values("o"):
        _check_list(value, None, f"{what} -o")
    _pool_operand(parsed, policy, what)


def _zpool_sync(args: list[str], policy: Policy) -> None:
    what = "zpool sync"
    _pool_operand(parse(args, flags="", what=what), policy, what)


_ZPOOL: dict[str, Callable[[list[str], Policy], TokenTarget | None]] = {
    "get": _zpool_get,
    "sync": _zpool_sync,
    "status": _zpool_status,
    "list": _zpool_list,
    "version": _version,
}
