"""``zbak serve --root POOL/PATH``: the SSH forced command of a least-privilege remote side.

Put in ``authorized_keys`` on the backup host (or a pull source), never run by hand::

    command="zbak serve --root backup/replicas",restrict ssh-ed25519 AAAA... zbak@master

It reads ``$SSH_ORIGINAL_COMMAND``, runs it if it is one of the commands zbak issues on
datasets inside the root, and otherwise exits 126 with the reason on stderr and in the log
(``zrepl_py.serve``). It reads no config file.

``--keep-newer-than DURATION [--keep-last N]`` gives the host a floor (``serve.floor``): what
it keeps whatever the master asks (``docs/design.md#security``). ``--allow-failover`` lets
through the failover verbs (``serve.failover``), ``--failover-mounts DIR`` where a promoted
replica may be mounted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click

from zrepl_py.cli.common import FilePath, Invocation, pass_invocation
from zrepl_py.errors import InvalidName, InvalidProperty, UsageError

if TYPE_CHECKING:
    from zrepl_py.serve.floor import Floor
    from zrepl_py.zfs.properties import ReceiveProperties


@click.command("serve")
@click.option("--root", "roots", multiple=True, required=True, metavar="POOL/PATH",
              help="Allow datasets at or below this one (repeatable).")
@click.option("--allow-destroy-own", is_flag=True,
              help="Allow destroying zbak's own snapshots/bookmarks and zfs rollback "
                   "(on_divergence = rollback, replica retention, source prune).")
@click.option("--allow-force-receive", is_flag=True,
              help="Allow zfs receive -F (zbak never asks for it).")
@click.option("--allow-drill", is_flag=True,
              help="Allow restore drills on this host: destroying a drill's scratch"
                   " (.../zbak-drill-<hex>) and zbak digest SNAPSHOT (file checksums).")
@click.option("--keep-newer-than", "keep_newer_than", metavar="DURATION",
              help="Refuse to destroy or roll back past a snapshot younger than this by "
                   "this host's clock (e.g. 7d; s, m, h, d, w, y), whatever the master asks.")
@click.option("--keep-last", "keep_last", type=click.IntRange(min=1), metavar="N",
              help="Also refuse it for the newest N snapshots of each dataset (receive "
                   "order); needs --keep-newer-than.")
@click.option("--floor-journal", "floor_journal", type=FilePath(), metavar="FILE",
              help="Where the floor records when this host saw each pool's snapshots "
                   "[default: ~/.local/state/zbak/floor-journal.tsv].")
@click.option("--allow-file-read", is_flag=True,
              help="Answer zbak restore --path and zbak find: read files of snapshots "
                   "inside the roots through a temporary view (needs root to mount it).")
@click.option("--prefix", default="zbak", show_default=True,
              help="Snapshot prefix marking zbak's own snapshots.")
@click.option("--receive-set", "receive_set", multiple=True, metavar="PROP=VALUE",
              help="A replica property receives may set (zfs receive -o), over the defaults "
                   "canmount=noauto readonly=on; as the job's [replicate.properties] set "
                   "(repeatable).")
@click.option("--receive-exclude", "receive_exclude", multiple=True, metavar="PROP",
              help="A property receives may exclude (zfs receive -x), besides the defaults "
                   "mountpoint, sharenfs, sharesmb, refreservation (repeatable).")
@click.option("--allow-failover", is_flag=True,
              help="Allow the failover verbs: zbak replica promote (writable, mounted), "
                   "demote and release, each on one dataset inside a root.")
@click.option("--failover-mounts", "failover_mounts", multiple=True, metavar="DIR",
              help="A directory a promoted replica may be mounted at or below (repeatable; "
                   "default: none, a promoted replica keeps its inherited mountpoint).")
@click.option("--log", "log_file", type=FilePath(),
              help="Append the audit log here (default: syslog, authpriv).")
@click.option("--zfs", "zfs_path", default="zfs", show_default=True, help="zfs to execute.")
@click.option("--zpool", "zpool_path", default="zpool", show_default=True,
              help="zpool to execute.")
@click.option("--zstd", "zstd_path", default="zstd", show_default=True, help="zstd to execute.")
@click.option("--mbuffer", "mbuffer_path", default="mbuffer", show_default=True,
              help="mbuffer to execute (the receive buffer before zfs receive).")
@pass_invocation
def command(inv: Invocation, roots: tuple[str, ...], allow_destroy_own: bool,
            allow_force_receive: bool, allow_file_read: bool, allow_drill: bool,
            keep_newer_than: str | None, keep_last: int | None, floor_journal: Path | None,
            prefix: str, receive_set: tuple[str, ...],
            receive_exclude: tuple[str, ...], allow_failover: bool,
            failover_mounts: tuple[str, ...], log_file: Path | None, zfs_path: str,
            zpool_path: str, zstd_path: str, mbuffer_path: str) -> None:
    """Run $SSH_ORIGINAL_COMMAND if zbak may (SSH forced command); exit 126 otherwise."""
    # imported here: `zbak --help` imports every command module
    from zrepl_py.serve.execute import audit_logger, exit_now, serve
    from zrepl_py.serve.policy import Policy
    from zrepl_py.zfs.names import DatasetName, check_short_name

    try:
        policy = Policy(
            roots=tuple(DatasetName(root) for root in roots),
            allow_destroy_own=allow_destroy_own,
            allow_force_receive=allow_force_receive,
            allow_drill=allow_drill,
            prefix=check_short_name(prefix, "snapshot prefix"),
            properties=_properties(receive_set, receive_exclude),
            zfs=zfs_path, zpool=zpool_path, zstd=zstd_path, mbuffer=mbuffer_path,
            floor=_floor(keep_newer_than, keep_last, floor_journal, inv.env),
            allow_file_read=allow_file_read,
            allow_failover=allow_failover, failover_mounts=failover_mounts,
        )  # fmt: skip
    except (InvalidName, ValueError) as exc:
        raise UsageError(f"zbak serve: {exc}") from None
    try:
        log = audit_logger(log_file)
    except OSError as exc:
        raise UsageError(f"zbak serve: cannot open --log {log_file}: {exc.strerror or exc}") from None
    exit_now(serve(inv.env.get("SSH_ORIGINAL_COMMAND"), policy, log=log, env=inv.env))


def _properties(assign: tuple[str, ...], exclude: tuple[str, ...]) -> ReceiveProperties:
    """What ``--receive-set``/``--receive-exclude`` allow: the set values over zbak's
    defaults (as a job's ``set``), and the exclusions besides the defaults (an extra ``-x``
    only ever keeps a stream's value off a replica, so the defaults stay allowed).

    Raises:
        InvalidProperty (an InvalidName): a malformed ``PROP=VALUE`` or a refused property.
    """
    from zrepl_py.zfs.properties import DEFAULT_EXCLUDE, ReceiveProperties

    pairs = {}
    for item in assign:
        name, sep, value = item.partition("=")
        if not sep:
            raise InvalidProperty(f"--receive-set {item!r}: expected PROP=VALUE")
        pairs[name] = value
    defaults = [p for p in DEFAULT_EXCLUDE if p not in pairs]
    return ReceiveProperties.of(pairs, (*defaults, *exclude))


def _floor(keep_newer_than: str | None, keep_last: int | None, journal: Path | None,
           env: Mapping[str, str]) -> Floor | None:
    """The floor of ``--keep-newer-than``/``--keep-last``/``--floor-journal``, None without
    ``--keep-newer-than``.

    Raises:
        ValueError: a bad duration, or ``--keep-last``/``--floor-journal`` alone: a count
            alone is no floor, since the master can push junk snapshots until the real ones
            are no longer the newest (``docs/decisions.md#the-serve-floor-trusts-the-replicas-own-witnesses``).
    """
    from zrepl_py.serve.floor import Floor
    from zrepl_py.serve.journal import DEFAULT_JOURNAL
    from zrepl_py.values.units import parse_duration

    if keep_newer_than is None:
        if keep_last is not None or journal is not None:
            raise ValueError("--keep-last and --floor-journal need --keep-newer-than: a "
                             "count alone is no floor (the master can push junk snapshots "
                             "until the real ones are no longer the newest)")
        return None
    try:
        age = parse_duration(keep_newer_than)
    except ValueError as exc:
        raise ValueError(f"--keep-newer-than: {exc}") from None
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    return Floor(age, keep_last or 0, journal or home / DEFAULT_JOURNAL, keep_newer_than)
