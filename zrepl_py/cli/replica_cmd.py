"""``zbak replica promote|demote|release DATASET``: the replica host's side of ``zbak failover``
and ``zbak failback`` (``failover.replica``).

``zbak failover`` and ``zbak failback`` send these over ssh to the target host: a
least-privilege host's ``zbak serve --allow-failover`` checks and runs them, a host where
zbak is installed runs them as this command, and a host without zbak gets the same zfs
commands one by one. They read no config. ``--mark`` is the ``zbak:failover`` value zbak
writes (``values.failover``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from zrepl_py.cli.common import Invocation, pass_invocation
from zrepl_py.errors import ExitStatus, UsageError

if TYPE_CHECKING:
    from zrepl_py.zfs.client import Zfs
    from zrepl_py.zfs.names import DatasetName


def _zfs() -> Zfs:
    from zrepl_py.proc.local import LocalExecutor
    from zrepl_py.zfs.client import Zfs

    return Zfs(LocalExecutor(), timeout=120)


def _dataset(text: str) -> DatasetName:
    from zrepl_py.zfs.names import DatasetName

    return DatasetName(text)


@click.group("replica")
def command() -> None:
    """The replica host's side of zbak failover and failback (sent over ssh; reads no
    config): promote makes a replica live, demote makes it read-only and unmounted again,
    release clears its failover mark and hold."""


@command.command("promote")
@click.option("--mark", required=True, help="The zbak:failover value to record.")
@click.option("--mountpoint", metavar="PATH", help="Mount it here (default: as it is).")
@click.argument("dataset")
@pass_invocation
def promote(inv: Invocation, mark: str, mountpoint: str | None, dataset: str) -> ExitStatus:
    """Mark DATASET failed over, hold its newest snapshot, make it writable and mount it."""
    from zrepl_py.failover.replica import promote_replica
    from zrepl_py.values.failover import FailoverMark

    name = _dataset(dataset)
    parsed = FailoverMark.parse(mark)
    if mountpoint is not None and not (mountpoint in ("none", "legacy")
                                       or mountpoint.startswith("/")):
        raise UsageError(f"--mountpoint {mountpoint!r}: an absolute path, none or legacy")
    promote_replica(_zfs(), name, parsed, mountpoint)
    return ExitStatus.OK


def _release_or_demote(verb: str, summary: str) -> None:
    """Register ``zbak replica VERB DATASET`` (``failover.replica``'s function of that
    verb, with no option)."""

    @command.command(verb, help=summary)
    @click.argument("dataset")
    def run(dataset: str) -> ExitStatus:
        from zrepl_py.failover import replica

        action = replica.demote_replica if verb == "demote" else replica.release_replica
        action(_zfs(), _dataset(dataset))
        return ExitStatus.OK


_release_or_demote("demote", "Make DATASET read-only and unmounted, as a replica (its mark "
                             "stays).")
_release_or_demote("release", "Release DATASET's way-back hold and clear its failover mark: "
                              "a replica again.")
