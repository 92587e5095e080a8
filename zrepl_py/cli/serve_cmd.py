"""``zbak serve --root POOL/PATH``: the SSH forced command of a least-privilege remote side.

Put in ``authorized_keys`` on the backup host (or a pull source), never run by hand::

    command="zbak serve --root backup/replicas",restrict ssh-ed25519 AAAA... zbak@master

It reads ``$SSH_ORIGINAL_COMMAND``, runs it if it is one of the commands zbak issues on
datasets inside the root, and otherwise exits 126 with the reason on stderr and in the log
(``zrepl_py.serve``). It reads no config file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from zrepl_py.cli.common import FilePath, Invocation, pass_invocation
from zrepl_py.errors import InvalidName, InvalidProperty, UsageError

if TYPE_CHECKING:
    from zrepl_py.zfs.properties import ReceiveProperties


@click.command("serve")
@click.option("--root", "roots", multiple=True, required=True, metavar="POOL/PATH",
              help="Allow datasets at or below this one (repeatable).")
@click.option("--allow-destroy-own", is_flag=True,
              help="Allow destroying zbak's own snapshots/bookmarks and zfs rollback "
                   "(on_divergence = rollback, replica retention, source prune).")
@click.option("--allow-force-receive", is_flag=True,
              help="Allow zfs receive -F (zbak never asks for it).")
@click.option("--prefix", default="zbak", show_default=True,
              help="Snapshot prefix marking zbak's own snapshots.")
@click.option("--receive-set", "receive_set", multiple=True, metavar="PROP=VALUE",
              help="A replica property receives may set (zfs receive -o), over the defaults "
                   "canmount=noauto readonly=on; as the job's [replicate.properties] set "
                   "(repeatable).")
@click.option("--receive-exclude", "receive_exclude", multiple=True, metavar="PROP",
              help="A property receives may exclude (zfs receive -x), besides the defaults "
                   "mountpoint, sharenfs, sharesmb, refreservation (repeatable).")
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
            allow_force_receive: bool, prefix: str, receive_set: tuple[str, ...],
            receive_exclude: tuple[str, ...], log_file: Path | None, zfs_path: str,
            zpool_path: str, zstd_path: str, mbuffer_path: str) -> None:
    """Run $SSH_ORIGINAL_COMMAND if zbak may (SSH forced command); exit 126 otherwise."""
    # imported here: `zbak --help` imports every command module
    from zrepl_py.serve.execute import audit_logger, exit_now, serve  # noqa: PLC0415
    from zrepl_py.serve.policy import Policy  # noqa: PLC0415
    from zrepl_py.zfs.names import DatasetName, check_short_name  # noqa: PLC0415

    try:
        policy = Policy(
            roots=tuple(DatasetName(root) for root in roots),
            allow_destroy_own=allow_destroy_own,
            allow_force_receive=allow_force_receive,
            prefix=check_short_name(prefix, "snapshot prefix"),
            properties=_properties(receive_set, receive_exclude),
            zfs=zfs_path, zpool=zpool_path, zstd=zstd_path, mbuffer=mbuffer_path,
        )  # fmt: skip
    except InvalidName as exc:
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
    from zrepl_py.zfs.properties import DEFAULT_EXCLUDE, ReceiveProperties  # noqa: PLC0415

    pairs = {}
    for item in assign:
        name, sep, value = item.partition("=")
        if not sep:
            raise InvalidProperty(f"--receive-set {item!r}: expected PROP=VALUE")
        pairs[name] = value
    defaults = [p for p in DEFAULT_EXCLUDE if p not in pairs]
    return ReceiveProperties.of(pairs, (*defaults, *exclude))
