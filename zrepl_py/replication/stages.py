"""Build the process pipeline for one send/receive step, whichever side is remote.

Push (source local), pull (target local) and remote-to-remote all become
``[ssh SRC] zfs send [| zstd] | [pv -L] | [ssh DST] [zstd -d |] zfs receive``:
compression runs on the sending host and decompression on the receiving one, so only
compressed bytes cross the wire; the rate limiter runs locally, between the two.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from zrepl_py.config.schema import HostConfig
from zrepl_py.proc.openssh import remote_command, remote_pipeline, ssh_argv
from zrepl_py.proc.pipeline import Stage

ZSTD_SEND = ("zstd", "-q", "-T0", "-3", "-c")
ZSTD_RECEIVE = ("zstd", "-q", "-d", "-c")


@dataclasses.dataclass(frozen=True)
class Side:
    """One end of a transfer: the host's name, and its SSH config (None for this machine)."""

    host: str
    config: HostConfig | None
    known_hosts_default: Path

    def wrap(self, argvs: Sequence[Sequence[str]], name: str) -> list[Stage]:
        """Stages running ``argvs`` (a pipeline) on this side: local processes, or one ssh."""
        if self.config is None:
            return [Stage(name if len(argvs) == 1 else f"{name} {i}", tuple(a))
                    for i, a in enumerate(argvs)]
        ssh = ssh_argv(self.config, known_hosts_default=self.known_hosts_default)
        if len(argvs) == 1:
            command = remote_command(argvs[0], sudo=self.config.sudo)
        else:
            command = remote_pipeline(argvs, sudo=self.config.sudo)
        return [Stage(f"ssh {self.host}: {name}", tuple(ssh) + (command,))]


def transfer_stages(
    send: Sequence[str],
    receive: Sequence[str],
    *,
    source: Side,
    target: Side,
    compress: bool,
    bandwidth_limit: int | None,
) -> list[Stage]:
    """Stages for ``send | receive`` between ``source`` and ``target``.

    Args:
        send: the ``zfs send`` argv (from ``zfs.sendrecv.send_argv``).
        receive: the ``zfs receive`` argv (from ``zfs.sendrecv.receive_argv``).
        compress: zstd on the wire; only useful when at least one side is remote.
        bandwidth_limit: bytes per second through ``pv -q -L`` (Debian ``pv``), or None.
    """
    remote = source.config is not None or target.config is not None
    squeeze = compress and remote
    stages = source.wrap([send, ZSTD_SEND] if squeeze else [send], "zfs send")
    if bandwidth_limit:
        stages.append(Stage("rate limit", ("pv", "-q", "-L", str(bandwidth_limit))))
    stages += target.wrap([ZSTD_RECEIVE, receive] if squeeze else [receive], "zfs receive")
    return stages
