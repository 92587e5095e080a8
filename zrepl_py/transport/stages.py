"""Build the process pipeline for one send/receive step, whichever side is remote.

Push (source local), pull (target local) and remote-to-remote all become
``[ssh SRC] zfs send [| zstd] | [pv -C -L] | [ssh DST] [zstd -d |] [mbuffer |] zfs receive``:
compression runs on the sending host and decompression on the receiving one, so only
compressed bytes cross the wire; the rate limiter runs locally, between the two.

The receive buffer: a stream that crosses ssh arrives in bursts (network, encryption) while
``zfs receive`` takes it in bursts of its own (transaction groups), and a 64 KiB pipe
between the two makes each wait for the other. An mbuffer(1) right before ``zfs receive``
on the receiving host (syncoid does the same) decouples them: a 1 GiB send over ssh to
127.0.0.1 on zfs-fuse took 4.40 s without and 3.73 s with a 64 MiB buffer (median of 4;
16 MiB: 3.92 s, 256 MiB: 3.72 s). Used when ``[replicate] receive_buffer`` is not 0 and
the receiving host answers ``mbuffer -V`` (``has_mbuffer``); else the stream goes to
``zfs receive`` directly, as before.

``metered_transfer`` also decides where the stream is counted (``proc.pipeline.Meter``) and
lets every ssh stage share its host's connection (``proc.openssh`` "Connection sharing"): a
shared ssh hands the stream to its master process, where no /proc counter of the pipeline
sees it, so where the count would fall on an ssh (a zfs-fuse source, whose daemon writes the
stream, sending straight into ssh; a remote source), a ``cat`` relays the stream and is
counted instead. That costs a copy (about 0.1 s of CPU per GiB here) and saves the ssh
handshake of every pipeline: a tiny dataset's ``zfs send | ssh HOST 'mbuffer | zfs
receive'`` took 0.28 s with its own connection and 0.04 s over a shared one (median of 10,
zfs-fuse over sshd on 127.0.0.1, benchmarks/replication.py's test bed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from zrepl_py.config.hosts import HostConfig
from zrepl_py.config.schema import Config
from zrepl_py.proc import spawn
from zrepl_py.proc.mbuffer import mbuffer_argv
from zrepl_py.proc.openssh import control_dir, remote_command, remote_pipeline, ssh_argv
from zrepl_py.proc.pipeline import Meter, Stage

ZSTD_SEND = ("zstd", "-q", "-T0", "-3", "-c")
ZSTD_RECEIVE = ("zstd", "-q", "-d", "-c")
_CONNECT_GRACE = 10.0  # seconds beyond the host's connect_timeout for its first login
RELAY = ("cat",)
"""The stage counted in place of an ssh that shares its connection (see the module doc)."""


@dataclasses.dataclass(frozen=True)
class Side:
    """One end of a transfer: the host's name, and its SSH config (None for this machine)."""

    host: str
    config: HostConfig | None
    known_hosts_default: Path
    control_dir: Path | None = None
    """Directory of shared ssh connections (``openssh.control_dir``); None: never share."""

    @classmethod
    def of(cls, config: Config, host: str) -> Side:
        """The side for ``host``: its ``[hosts]`` entry (None for ``local``), known_hosts and
        shared ssh connections under the config's state directory."""
        host_cfg = config.hosts.get(host)
        shared = control_dir(config.state_dir) if host_cfg is not None else None
        return cls(host, host_cfg, config.state_dir / "known_hosts", shared)

    def connect(self) -> Callable[[], None] | None:
        """Start this side's shared ssh connection now, without waiting for the login.

        ``ssh -O check`` asks the local socket whether a master runs (no remote request);
        if none does, ``ssh -N -f`` with the sharing options logs in, runs nothing (so a
        forced command such as ``zbak serve`` sees no request) and stays in the background
        as the master until ``openssh.CONTROL_PERSIST`` seconds pass without a session.
        (Where a master runs, ``ssh -N`` would become a session of it asking for a shell.)

        Returns:
            a function that waits until the login is done (up, or failed: the transfer that
            needs it then says why); None for a side that shares no connection.
        """
        if self.config is None or self.control_dir is None:
            return None
        argv = ssh_argv(self.config, known_hosts_default=self.known_hosts_default,
                        control_dir=self.control_dir)
        end = argv.index("--")
        options, address = argv[:end], argv[end:]
        try:
            check = spawn.run([*options, "-O", "check", *address], stdin=spawn.DEVNULL,
                              capture_output=True, timeout=_CONNECT_GRACE, check=False)
        except (OSError, spawn.SubprocessError):
            return None  # no ssh: the transfer says so
        if check.returncode == 0:
            return lambda: None
        process = spawn.popen([*options, "-N", "-f", *address], stdin=spawn.DEVNULL,
                              stdout=spawn.DEVNULL, stderr=spawn.DEVNULL)
        timeout = self.config.connect_timeout.total_seconds() + _CONNECT_GRACE

        def wait() -> None:
            try:
                process.wait(timeout)
            except spawn.TimeoutExpired:
                process.kill()
                process.wait()

        return wait

    def wrap(
        self, argvs: Sequence[Sequence[str]], name: str, *, share: bool = False
    ) -> list[Stage]:
        """Stages running ``argvs`` (a pipeline) on this side: local processes, or one ssh
        (over the host's shared connection when ``share`` and ``control_dir`` allow it)."""
        if self.config is None:
            return [Stage(name if len(argvs) == 1 else f"{name} {i}", tuple(a))
                    for i, a in enumerate(argvs)]
        ssh = ssh_argv(self.config, known_hosts_default=self.known_hosts_default,
                       control_dir=self.control_dir if share else None)
        if len(argvs) == 1:
            command = remote_command(argvs[0], sudo=self.config.sudo)
        else:
            command = remote_pipeline(argvs, sudo=self.config.sudo)
        return [Stage(f"ssh {self.host}: {name}", tuple(ssh) + (command,))]


def metered_transfer(
    send: Sequence[str],
    receive: Sequence[str],
    *,
    source: Side,
    target: Side,
    compress: bool,
    bandwidth_limit: int | None,
    send_writes_stream: bool,
    share: bool = True,
    receive_buffer: int | None = None,
    limiter: Sequence[str] | None = None,
) -> tuple[list[Stage], Meter]:
    """Stages for ``send | receive`` between ``source`` and ``target``, and the Meter that
    counts them.

    The stream is counted where a local process of the pipeline really writes or reads it:

    - local source whose ``zfs send`` writes the stream itself (``send_writes_stream``,
      OpenZFS): ``wchar`` of stage 0;
    - other sources (zfs-fuse's daemon writes the stream; a remote source's stream comes out
      of an ssh): ``rchar`` of stage 1: zstd or pv when there is one; else the ssh itself
      when it does not share its connection (``wchar`` of a remote source's ssh, ``rchar``
      of the target's); else a ``RELAY`` (``cat``): a shared ssh hands the stream to its
      master, and a local zfs-fuse ``zfs receive`` to its daemon (it reads only the
      stream's first record itself: 52 KB of a 16 MiB restore were counted).

    Every ssh stage shares its host's connection when ``share`` (and the side has a
    ``control_dir``).

    Args:
        send: the ``zfs send`` argv (from ``zfs.sendrecv.send_argv``).
        receive: the ``zfs receive`` argv (from ``zfs.sendrecv.receive_argv``).
        compress: zstd on the wire; only useful when at least one side is remote.
        bandwidth_limit: bytes per second through ``pv -q -C -L`` (Debian ``pv``), or None.
        receive_buffer: bytes of an mbuffer right before ``zfs receive`` (``mbuffer_argv``)
            when at least one side is remote; None for none. The caller checks the
            receiving host has mbuffer (``has_mbuffer``).
        send_writes_stream: the local source's ``zfs send`` writes the stream itself
            (``Capabilities.send_writes_stream``); ignored for a remote source.
        share: allow connection sharing at all.
        limiter: the argv of a rate-limiting pv stage to use instead of
            ``bandwidth_limit``'s (a limit shared with the run's other pipelines,
            ``proc.ratelimit.Lease.argv``).

    Returns:
        ``(stages, meter)``: pass both to ``proc.pipeline.run_pipeline``.
    """
    remote = source.config is not None or target.config is not None
    squeeze = compress and remote
    local_source = source.config is None
    meter = Meter.WRITTEN if local_source and send_writes_stream else Meter.READ
    sharing_source = share and source.control_dir is not None
    stages = source.wrap([send, ZSTD_SEND] if squeeze else [send], "zfs send",
                         share=sharing_source)
    if limiter is not None:
        stages.append(Stage("rate limit", tuple(limiter)))
    elif bandwidth_limit:
        # -C: pv moves data with splice(2) by default, which the kernel's rchar/wchar
        # counters do not see; the meter reads pv's rchar on zfs-fuse sources
        # (docs/decisions.md#pv-copies-so-its-bytes-are-counted: a 105 MB stream was recorded
        # as 4 MB). Cost: 256 MiB from tmpfs through `pv -q -L 4G | cat`, median of 5: 0.090 s
        # with splice, 0.136 s with -C.
        stages.append(Stage("rate limit", ("pv", "-q", "-C", "-L", str(bandwidth_limit))))
    receiving: list[tuple[str, ...]] = [ZSTD_RECEIVE] if squeeze else []
    if receive_buffer and remote:
        receiving.append(mbuffer_argv(receive_buffer))
    sharing_target = share and target.control_dir is not None
    if meter is Meter.READ and len(stages) == 1:
        if not local_source and not sharing_source:
            meter = Meter.WRITTEN  # the source's own ssh carries the stream out
        elif local_source and target.config is not None and not sharing_target:
            pass  # the target's own ssh reads the stream from the pipe: counted there
        else:  # a shared ssh or a local zfs-fuse receive would not see it (see above)
            stages.append(Stage("relay", RELAY))
    stages += target.wrap([*receiving, receive], "zfs receive", share=sharing_target)
    return stages, meter
