"""mbuffer(1) as zbak runs it: the receive buffer right before ``zfs receive`` on the receiving
host, and its one probe. One place for the argv, its size bounds and the noise it adds, so the
config (``ReplicateConfig.receive_buffer``), the data path (``transport.stages``) and the
forced command's allow-list (``serve.policy``) cannot disagree.
"""

from __future__ import annotations

from zrepl_py.errors import CommandFailed
from zrepl_py.proc.executor import Executor

PROBE = ("mbuffer", "-V")
"""Prints mbuffer's version and exits 0; any failure means no receive buffer."""
FIXED_ARGS = ("-q", "-v", "1", "-s", "128k", "-m")
"""mbuffer's arguments before the size: ``-q`` drops the progress line, ``-v 1`` every message
but errors (mbuffer(1)), e.g. the warning about a missing ``$HOME``; 128 KiB blocks are zfs's
own record size."""
MIN_BYTES = 1024 * 1024
"""Smallest buffer: mbuffer needs at least two of its 128 KiB blocks."""
MAX_BYTES = 16 * 1024**3
"""Largest buffer (16 GiB): mbuffer allocates it all at start, so a larger request could
exhaust the receiving host's memory. zbak's default is 64 MiB."""


def mbuffer_argv(size: int) -> tuple[str, ...]:
    """The receive buffer's argv: ``mbuffer -q -v 1 -s 128k -m <size>k``.

    Args:
        size: buffer memory in bytes, ``MIN_BYTES`` to ``MAX_BYTES``; rounded down to whole KiB.
    """
    return ("mbuffer", *FIXED_ARGS, f"{size // 1024}k")


def without_buffer_noise(stderr: str) -> str:
    """A receiving host's stderr without mbuffer's report of the pipe ``zfs receive`` closed
    by failing (``mbuffer: error: outputThread: error writing to <stdout> ...: Broken
    pipe``), which comes after the receiver's own words."""
    return "\n".join(line for line in stderr.splitlines()
                     if not (line.startswith("mbuffer: ") and "Broken pipe" in line))


def has_mbuffer(executor: Executor) -> bool:
    """True when ``mbuffer -V`` runs and exits 0 on the executor's host.

    Raises:
        HostUnreachable, HostKeyMismatch: the host cannot be reached (the transfer could not
            run either).
    """
    try:
        return executor.run(PROBE, check=False, timeout=30).returncode == 0
    except CommandFailed:  # not installed (local), or timed out
        return False
