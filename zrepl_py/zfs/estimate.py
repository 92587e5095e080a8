"""The expected size of a send stream, for a transfer's ETA (``zbak status``, progress bars).

Where ``zfs send`` has a dry run (OpenZFS: ``zfs send -n -P`` prints the stream's records and
a last line ``size<TAB>BYTES`` on stdout, zfs-send(8) ``-n``/``-P``; verified on 2.3.2 for a
full, ``-i``, ``-I`` and with ``-c -L -e -p``), the size comes from the same send with ``-n
-P`` added: one command per stream, run right before it, so no separate listing is kept in
step. zfs-fuse's send has neither flag (``send [-RDp] [-[iI] snapshot]``) nor the
``written`` property: there a full's size is its snapshot's ``referenced`` (the data the
stream carries, give or take the stream's own records and compression) and an
incremental's is unknown.

An estimate never fails a transfer: a dry run or ``zfs get`` that fails leaves the size
unknown (logged at debug). See docs/decisions.md#expected-sizes-come-from-the-send-itself.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from zrepl_py.errors import ZbakError
from zrepl_py.zfs.client import Zfs

log = logging.getLogger(__name__)

SEND_DRY_RUN = "send -nP"
"""``Expected.source`` of a size from ``zfs send -n -P``."""
REFERENCED = "referenced"
"""``Expected.source`` of a full's size from its snapshot's ``referenced``."""
_TIMEOUT = 120.0  # seconds a dry run may take (it walks the snapshot's metadata)


@dataclasses.dataclass(frozen=True)
class Expected:
    """A stream's expected size: ``bytes`` (None: unknown) and where it came from
    (``SEND_DRY_RUN``, ``REFERENCED``, or None)."""

    bytes: int | None
    source: str | None


UNKNOWN = Expected(None, None)


def dry_run_argv(send: Sequence[str]) -> list[str]:
    """``send`` (``[ZFS, "send", ...]`` from ``zfs.sendrecv.send_argv``) as a dry run that
    prints its size: ``[ZFS, "send", "-n", "-P", ...]``.

    Raises:
        ValueError: ``send`` is not a ``zfs send`` argv.
    """
    if len(send) < 3 or send[1] != "send":
        raise ValueError(f"not a zfs send argv: {list(send)!r}")
    return [send[0], "send", "-n", "-P", *send[2:]]


def parse_dry_run(text: str) -> int | None:
    """The bytes of the last ``size<TAB>N`` line of ``zfs send -n -P`` output; None when
    there is none."""
    for line in reversed(text.splitlines()):
        fields = line.split("\t")
        if len(fields) == 2 and fields[0] == "size" and fields[1].strip().isdigit():
            return int(fields[1])
    return None


def expected_size(zfs: Zfs, send: Sequence[str], *, full: str | None = None) -> Expected:
    """The expected size of the stream ``send`` produces on ``zfs``'s host.

    Args:
        zfs: the sending host's client (its capabilities say whether ``send -nP`` exists).
        send: the send's argv (``zfs.sendrecv.send_argv``).
        full: the snapshot a full stream sends (``DATASET@NAME``), for ``referenced``
            where there is no dry run; None for an incremental or a resume.

    Returns:
        the size, or ``UNKNOWN``; never raises for the host.
    """
    caps = zfs.capabilities
    if caps is not None and caps.send_dry_run:
        try:
            done = zfs.executor.run(dry_run_argv(send), check=False, timeout=_TIMEOUT)
        except (ZbakError, OSError) as exc:
            log.debug("no expected size for %s: %s", " ".join(send), exc)
            return UNKNOWN
        size = parse_dry_run(done.text) if done.returncode == 0 else None
        if size is None:
            log.debug("no expected size for %s: exit %d", " ".join(send), done.returncode)
            return UNKNOWN
        return Expected(size, SEND_DRY_RUN)
    if full is None:
        return UNKNOWN
    try:
        value = zfs.get_properties(full, [REFERENCED]).get(REFERENCED, "")
    except ZbakError as exc:
        log.debug("no expected size for %s: %s", full, exc)
        return UNKNOWN
    return Expected(int(value), REFERENCED) if value.isdigit() else UNKNOWN
