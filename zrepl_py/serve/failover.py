"""``zbak serve --allow-failover``: the failover verbs, checked like the rest of the allow-list.

A failover makes a replica writable and mounts it; a failback makes it a read-only replica
again. The raw commands for that stay refused (``zfs set readonly=off``, ``zfs mount``,
``zfs inherit zbak:failover``, and clone, promote, rename and dataset destroy, which no
verb needs): a master holding zbak's key gets exactly these three verbs
(``failover.replica``), each on one dataset inside ``--root``:

- ``zbak replica promote --mark MARK [--mountpoint PATH] DATASET``: MARK must be a
  ``zbak:failover`` value zbak writes (``values.failover.FailoverMark``); PATH ``none``,
  ``legacy``, or an absolute path, normalised, at or below a ``--failover-mounts`` directory,
  reaching through no symbolic link when it runs (so a replica cannot be mounted over
  ``/etc`` or ``/root/.ssh`` of the backup host, nor through a link a replica holds).
  Without ``--failover-mounts`` a promoted replica keeps the mountpoint it inherits.
- ``zbak replica demote DATASET`` and ``zbak replica release DATASET``: only a dataset
  that carries a failover mark; release frees the hold the mark names (its own tag,
  ``zbak:<job>:failover``) and clears the mark.

``check_verb`` (pure) reads a request; ``run_verb`` carries it out with this host's zfs
(``Policy.zfs``) and the scrubbed environment, and returns the exit status. With a floor
the verbs need nothing more: none destroys or rolls back a snapshot.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import sys
from collections.abc import Mapping, Sequence
from typing import Protocol, TextIO

from zrepl_py.errors import CommandRefused, InvalidName, ZbakError
from zrepl_py.values.failover import FAILOVER_PROPERTY, FailoverMark
from zrepl_py.zfs.names import DatasetName


class Policy(Protocol):
    """What the verbs read of ``serve.policy.Policy``."""

    @property
    def allow_failover(self) -> bool: ...
    @property
    def failover_mounts(self) -> tuple[str, ...]: ...
    @property
    def roots(self) -> tuple[DatasetName, ...]: ...
    @property
    def zfs(self) -> str: ...
    @property
    def zpool(self) -> str: ...
    def inside(self, dataset: str) -> bool:
        """True when ``dataset`` is a root or below one."""
        ...

PROGRAM = "zbak"
"""The program word of a verb request (``failover.replica.verb_argv``)."""

_VERBS = ("promote", "demote", "release")


@dataclasses.dataclass(frozen=True)
class Verb:
    """An approved verb.

    Attributes:
        verb: ``promote``, ``demote`` or ``release``.
        dataset: the replica dataset (inside a root).
        mark: for promote, the mark to set.
        mountpoint: for promote, the mountpoint to give (None: keep).
    """

    verb: str
    dataset: DatasetName
    mark: FailoverMark | None = None
    mountpoint: str | None = None

    def __str__(self) -> str:
        return f"zbak replica {self.verb} {self.dataset}"


def _mountpoint(path: str, policy: Policy) -> str:
    if path in ("none", "legacy"):
        return path
    if not path.startswith("/") or posixpath.normpath(path) != path or path == "/" \
            or "\x00" in path or "\n" in path:
        raise CommandRefused(f"zbak replica promote: mountpoint {path!r} is not a normalised "
                             "absolute path (or none, legacy)")
    if not any(path == d or path.startswith(d.rstrip("/") + "/") for d in policy.failover_mounts):
        allowed = ", ".join(policy.failover_mounts) or "none: start zbak serve with " \
                                                       "--failover-mounts DIR"
        raise CommandRefused(f"zbak replica promote: mountpoint {path} is outside the "
                             f"directories a promoted replica may be mounted in ({allowed})")
    return path


def check_verb(argv: Sequence[str], policy: Policy) -> Verb:
    """Read the verb request ``argv`` (``zbak replica VERB ...``).

    Raises:
        CommandRefused: verbs not allowed (no ``--allow-failover``), or the request is not
            exactly a shape of the module doc (the message says which rule).
    """
    if not policy.allow_failover:
        raise CommandRefused("failover verbs are not allowed (start zbak serve with "
                             "--allow-failover)")
    args = list(argv[1:])
    if len(args) < 3 or args[0] != "replica" or args[1] not in _VERBS:
        raise CommandRefused(f"zbak {' '.join(args[:2])!r} is not a verb zbak serve runs "
                             f"(zbak replica {'|'.join(_VERBS)} DATASET)")
    verb, rest = args[1], args[2:]
    mark = mountpoint = None
    if verb == "promote":
        if len(rest) < 3 or rest[0] != "--mark":
            raise CommandRefused("zbak replica promote needs --mark MARK")
        try:
            mark = FailoverMark.parse(rest[1])
        except InvalidName as exc:
            raise CommandRefused(f"zbak replica promote: {exc}") from None
        rest = rest[2:]
        if rest[0] == "--mountpoint":
            if len(rest) < 3:
                raise CommandRefused("zbak replica promote: --mountpoint needs a path")
            mountpoint = _mountpoint(rest[1], policy)
            rest = rest[2:]
    if len(rest) != 1 or rest[0].startswith("-"):
        raise CommandRefused(f"zbak replica {verb} takes exactly one dataset after its options")
    try:
        dataset = DatasetName(rest[0])
    except InvalidName as exc:
        raise CommandRefused(f"zbak replica {verb}: {exc}") from None
    if not policy.inside(dataset):
        raise CommandRefused(f"zbak replica {verb}: {dataset} is outside the allowed root "
                             f"({', '.join(policy.roots)})")
    return Verb(verb, dataset, mark, mountpoint)


def run_verb(verb: Verb, policy: Policy, env: Mapping[str, str], *,
             stderr: TextIO | None = None) -> int:
    """Carry out an approved verb with this host's zfs; return 0 (done) or 1 (a zfs command
    failed: its message goes to ``stderr``, the client's).

    Raises:
        CommandRefused: what the host says now refuses it: the mountpoint reaches through
            a symbolic link, or demote/release of a dataset without a failover mark
            (``serve.execute`` logs it and exits ``REFUSED``).
    """
    from zrepl_py.failover.replica import (
        demote_replica,
        mark_of,
        promote_replica,
        release_replica,
    )
    from zrepl_py.proc.local import LocalExecutor
    from zrepl_py.zfs.client import Zfs

    stderr = stderr or sys.stderr
    zfs = Zfs(LocalExecutor(env=env), zfs=policy.zfs, zpool=policy.zpool, timeout=120)
    try:
        if verb.verb == "promote":
            assert verb.mark is not None
            if verb.mountpoint is not None and verb.mountpoint.startswith("/") \
                    and os.path.realpath(verb.mountpoint) != verb.mountpoint:
                raise CommandRefused(f"zbak replica promote: mountpoint {verb.mountpoint} "
                                     "reaches through a symbolic link")
            promote_replica(zfs, verb.dataset, verb.mark, verb.mountpoint)
            return 0
        if mark_of(zfs, verb.dataset) is None:
            raise CommandRefused(f"zbak replica {verb.verb}: {verb.dataset} is not failed over "
                                 f"(it has no {FAILOVER_PROPERTY} mark)")
        if verb.verb == "demote":
            demote_replica(zfs, verb.dataset)
        else:
            release_replica(zfs, verb.dataset)
        return 0
    except CommandRefused:
        raise
    except ZbakError as exc:
        print(f"zbak serve: {verb}: {exc}", file=stderr, flush=True)
        return 1
