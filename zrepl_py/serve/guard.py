"""Apply the floor around one approved request (the driver of ``serve.floor``).

* A destroy or rollback: under the journal's lock, list the dataset's snapshots (``zfs list
  -H -o name,createtxg -t snapshot -s createtxg -d 1 DS``) and its pool's key (the guid of
  the pool's root dataset, ``zfs get -H -p -o value guid POOL``), record the listing as a
  witness, and refuse unless ``floor.check_destroy``/``check_rollback`` let it through. The
  lock is held until the command has finished, so no other destroy runs between this check
  and zfs (``serve.execute`` runs the command as a child, not with exec, to keep it).
* A receive or snapshot (``creates``): once it has run, whatever its exit status, list each
  dataset it names and record the witness. A failure there is logged and the request keeps
  its status: the snapshot is then dated by the next witness (later, so younger).

Listing errors refuse a destroy or rollback (the floor cannot be checked, so nothing goes).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Iterator, Mapping, Sequence

from zrepl_py.errors import CommandRefused, UnsafeDirectory
from zrepl_py.proc import spawn
from zrepl_py.serve import journal
from zrepl_py.serve.floor import (
    Floor,
    FloorAction,
    Snap,
    Witness,
    check_destroy,
    check_rollback,
)

_TIMEOUT = 120
"""Seconds a listing may take before the request is refused."""


@contextlib.contextmanager
def guarded(action: FloorAction, floor: Floor, zfs: str, env: Mapping[str, str],
            log: logging.Logger) -> Iterator[None]:
    """Check ``action`` before the request runs (inside) and witness what it created after.

    Args:
        action: from ``floor.floor_action``.
        floor: the rules and the journal.
        zfs: the zfs program (``Policy.zfs``).
        env: the commands' environment (``execute.clean_env``).
        log: the audit log (witness failures are logged there).

    Raises:
        CommandRefused: on entry, for a destroy or rollback the floor does not allow, or
            whose dataset cannot be listed, or when the journal cannot be read.
    """
    if action.kind == "creates":
        try:
            yield
        finally:
            _witness_after(action.datasets, floor, zfs, env, log)
        return
    assert action.target is not None
    check = check_destroy if action.kind == "destroy" else check_rollback
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(journal.locked(floor.journal))
        except (OSError, UnsafeDirectory) as exc:
            raise CommandRefused(f"zfs {action.kind}: cannot open the floor journal "
                                 f"{floor.journal}: {exc}") from None
        snaps = list_snapshots(zfs, action.datasets[0], env, f"zfs {action.kind}")
        pool = action.datasets[0].split("/", 1)[0]
        guid = pool_guid(zfs, pool, env, f"zfs {action.kind}")
        try:
            known = journal.read(floor.journal)
        except OSError as exc:
            raise CommandRefused(f"zfs {action.kind}: cannot read the floor journal "
                                 f"{floor.journal}: {exc.strerror or exc}") from None
        _record(snaps, pool, guid, known, floor, log)
        check(action.target, snaps, floor, guid, known, dt.datetime.now(dt.UTC))
        yield


def list_snapshots(zfs: str, dataset: str, env: Mapping[str, str], what: str) -> list[Snap]:
    """``dataset``'s snapshots, oldest first by createtxg.

    Raises:
        CommandRefused: zfs cannot list them (the message keeps zfs's words, so "does not
            exist" reads as DatasetNotFound on the master).
    """
    out = _zfs(zfs, ["list", "-H", "-o", "name,createtxg", "-t", "snapshot", "-s", "createtxg",
                     "-d", "1", dataset], env, what)
    snaps = []
    for line in out.splitlines():
        name, _, txg = line.partition("\t")
        if not txg.strip().isdigit():
            raise CommandRefused(f"{what}: unexpected zfs list line {line!r}")
        snaps.append(Snap(name, int(txg)))
    return snaps


def pool_guid(zfs: str, pool: str, env: Mapping[str, str], what: str) -> int:
    """The guid of ``pool``'s root dataset: the journal's key for the pool (a pool created
    again under the same name gets a new one, and its txgs start afresh).

    Raises:
        CommandRefused: zfs cannot tell it.
    """
    value = _zfs(zfs, ["get", "-H", "-p", "-o", "value", "guid", pool], env, what).strip()
    if not value.isdigit():
        raise CommandRefused(f"{what}: unexpected guid {value!r} of pool {pool}")
    return int(value)


def _zfs(zfs: str, args: Sequence[str], env: Mapping[str, str], what: str) -> str:
    try:
        done = spawn.run([zfs, *args], env=env, stdin=spawn.DEVNULL, capture_output=True,
                         timeout=_TIMEOUT, check=False)
    except (OSError, spawn.TimeoutExpired) as exc:
        raise CommandRefused(f"{what}: cannot check the floor: {exc}") from None
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip()
        raise CommandRefused(f"{what}: cannot check the floor: {err}")
    text: str = done.stdout.decode("utf-8", "replace")
    return text


def _record(snaps: Sequence[Snap], pool: str, guid: int, known: list[Witness], floor: Floor,
            log: logging.Logger) -> None:
    """Add the witness a listing gives (its newest createtxg, now) to the journal."""
    if not snaps:
        return
    witness = Witness(journal.witness_time(), guid, max(s.createtxg for s in snaps), pool)
    try:
        journal.add(floor.journal, witness, known)
    except (OSError, UnsafeDirectory) as exc:
        log.warning("floor journal %s: cannot record %r: %s", floor.journal, witness, exc)


def _witness_after(datasets: Sequence[str], floor: Floor, zfs: str, env: Mapping[str, str],
                   log: logging.Logger) -> None:
    """Record a witness of each dataset a receive or snapshot named (best effort)."""
    try:
        with journal.locked(floor.journal):
            known = journal.read(floor.journal)
            for dataset in datasets:
                pool = dataset.split("/", 1)[0]
                try:
                    snaps = list_snapshots(zfs, dataset, env, "witness")
                    guid = pool_guid(zfs, pool, env, "witness")
                except CommandRefused as exc:
                    log.warning("floor journal: no witness of %s: %s", dataset, exc)
                    continue
                _record(snaps, pool, guid, known, floor, log)
                known = journal.read(floor.journal)
    except (OSError, UnsafeDirectory) as exc:
        log.warning("floor journal %s: no witness recorded: %s", floor.journal, exc)
