"""Receive resume tokens: what a token says, read with ``zfs send -nvt TOKEN`` on the source.

An interrupted ``zfs receive -s`` leaves the target's ``receive_resume_token`` property set
(zfs-receive(8) ``-s``); ``zfs send -t TOKEN`` on the source continues the stream where it
stopped. The token itself is opaque (``VERSION-CHECKSUM-LENGTH-HEX``: a zlib-compressed
packed nvlist, libzfs ``zfs_send_resume_token_to_nvlist``), so zbak asks the source's zfs
to describe it: with ``-n -v`` zfs prints, then exits without sending anything::

    resume token contents:
    nvlist version: 0
    	fromguid = 0x9d551dcaa472ce2c      (incrementals only)
    	object = 0x80
    	offset = 0x0
    	bytes = 0x218c8                    (stream bytes already received)
    	toguid = 0x6d0851d1e98232bb
    	toname = src/data@b
    	embedok = 1                        (flags of the original send: embedok,
    	compressok = 1                      compressok, rawok, largeblockok, ...)
    send from src/data@a to src/data@b estimated size is 3.88M

That is real OpenZFS 2.3.2 output (``tests/data/resume/``). OpenZFS 2.x prints the dry-run
report on stdout, 0.7/0.8 on stderr (zfs-send(8) ``-n``); both are read. Numbers are hex
(``0x...``) in nvlist_print output, decimal is accepted too.

A token whose snapshot was destroyed since still describes: zfs prints the contents, then
fails with "'DS@SNAP' used in the initial send no longer exists". ``describe_token`` returns
the contents in that case; the planner sees that ``toguid`` is gone and aborts the receive.
"""

from __future__ import annotations

import dataclasses
import re

from zrepl_py.errors import (
    CommandFailed,
    InvalidName,
    ResumeTokenInvalid,
    ResumeTokenRefused,
    ZfsError,
)
from zrepl_py.proc.executor import Executor
from zrepl_py.zfs.errors import map_error
from zrepl_py.zfs.names import SnapshotName

TOKEN_PATTERN = re.compile(r"[0-9]+-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+")
"""``%u-%llx-%llx-%s`` (libzfs_sendrecv.c ``zfs_send_resume_token_to_nvlist``): version,
fletcher-4 checksum, packed length, hex of the compressed nvlist. Anything else is refused
before it reaches an argv (a leading ``-`` could never pass)."""

HEADER = "resume token contents:"
"""The line libzfs prints before the token's nvlist (``zfs_send_resume_impl``)."""


@dataclasses.dataclass(frozen=True)
class ResumeToken:
    """A target's ``receive_resume_token`` and what it describes.

    Attributes:
        token: the token string as the target reported it (matches ``TOKEN_PATTERN``).
        toguid: guid of the snapshot being received (64-bit unsigned).
        toname: full ``DATASET@SNAP`` name of that snapshot on the sending side, as it was
            when the send started.
        fromguid: guid of the incremental base (a snapshot or bookmark), None for a full stream.
        raw: the stream is raw (``send -w``, token flag ``rawok``).
        compressed: the stream carries compressed records (``send -c``, flag ``compressok``).
        bytes: stream bytes already received, the resume point (token field ``bytes``).
    """

    token: str
    toguid: int
    toname: str
    fromguid: int | None
    raw: bool
    compressed: bool
    bytes: int

    @property
    def dataset(self) -> str:
        """The dataset part of ``toname``: the source dataset the stream came from."""
        return self.toname.split("@", 1)[0]

    @property
    def incremental(self) -> bool:
        """True for an interrupted incremental stream (it has a ``fromguid``)."""
        return self.fromguid is not None


def check_token(token: str) -> str:
    """Return ``token`` if it has the shape of a resume token, for use as one argv element.

    Raises:
        ResumeTokenInvalid: anything else (empty, ``-`` meaning "none", stray characters).
    """
    if not isinstance(token, str) or not TOKEN_PATTERN.fullmatch(token):
        shown = token if isinstance(token, str) and len(token) <= 80 else f"{str(token)[:80]}..."
        raise ResumeTokenInvalid(
            f"{shown!r} is not a receive_resume_token (expected VERSION-CHECKSUM-LENGTH-HEX); "
            "abort the partial receive with `zfs receive -A TARGET`"
        )
    return token


def _number(key: str, value: str) -> int:
    text = value.strip()
    try:
        number = int(text, 16) if text.lower().startswith("0x") else int(text, 10)
    except ValueError:
        raise ResumeTokenInvalid(f"resume token field {key} = {value!r} is not a number") from None
    if not 0 <= number < 2**64:
        raise ResumeTokenInvalid(f"resume token field {key} = {value!r} is out of range")
    return number


def _flag(fields: dict[str, str | None], key: str) -> bool:
    # nvlist_print shows the send flags as "compressok = 1"; a bare name (DATA_TYPE_BOOLEAN
    # printed without a value) also means set.
    if key not in fields:
        return False
    value = fields[key]
    return value is None or value.strip() not in ("0", "B_FALSE", "false")


def _contents(text: str) -> dict[str, str | None] | None:
    """The ``key = value`` lines after HEADER; None when HEADER is missing."""
    lines = text.split("\n")
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == HEADER)
    except StopIteration:
        return None
    fields: dict[str, str | None] = {}
    for line in lines[start + 1 :]:
        if line.startswith("nvlist version"):
            continue
        if not line.startswith(("\t", " ")):
            break  # "full send of ..." / "send from ..." ends the nvlist
        body = line.lstrip("\t ")
        key, sep, value = body.partition(" = ")
        # Values are kept exact: a toname may end in a space (names allow spaces, not "=").
        fields[key.strip()] = value if sep else None
    return fields


def parse_token_description(text: str, token: str) -> ResumeToken:
    """Read the output of ``zfs send -nvt TOKEN`` into a ResumeToken.

    Args:
        text: what zfs printed (stdout, or stdout and stderr joined); only the nvlist after
            ``resume token contents:`` is read, unknown fields are ignored.
        token: the token that was described; kept in the result.

    Raises:
        ResumeTokenInvalid: ``token`` is malformed, there is no token contents section, or
            ``toguid``/``toname`` is missing or unreadable.
    """
    check_token(token)
    fields = _contents(text)
    if fields is None:
        raise ResumeTokenInvalid(f"no {HEADER!r} in the zfs send -nvt output: {text[-300:]!r}")
    toguid, named = fields.get("toguid"), fields.get("toname")
    if toguid is None or named is None:
        raise ResumeTokenInvalid(f"resume token without toguid/toname: {sorted(fields)}")
    try:
        toname = SnapshotName(named)
    except InvalidName as exc:
        raise ResumeTokenInvalid(f"resume token toname: {exc}") from None
    fromguid = fields.get("fromguid")
    size = fields.get("bytes")
    return ResumeToken(
        token=token,
        toguid=_number("toguid", toguid),
        toname=str(toname),
        fromguid=None if fromguid is None else _number("fromguid", fromguid),
        raw=_flag(fields, "rawok"),
        compressed=_flag(fields, "compressok"),
        bytes=0 if size is None else _number("bytes", size),
    )


def describe_token(
    executor: Executor, token: str, *, zfs: str = "zfs", timeout: float | None = None
) -> ResumeToken:
    """Describe a resume token by running ``zfs send -n -v -t TOKEN`` on the SOURCE host.

    The token is read by the sending side's zfs (the target's may be another version and
    does not hold the snapshots). Nothing is sent (``-n``).

    Args:
        executor: runs the command on the source host.
        token: the target's ``receive_resume_token`` (``Zfs.resume_token``).
        zfs: the zfs command on that host.
        timeout: seconds the command may take; None waits.

    Returns:
        the token's contents, also when its snapshot no longer exists on the source (zfs
        prints the contents, then fails): callers compare ``toguid`` with the source.

    Raises:
        ResumeTokenInvalid: malformed (nothing run), corrupt or expired ("resume token is
            corrupt"), or no readable contents.
        Unsupported: this zfs has no ``send -t`` (zfs-fuse: "invalid option 't'").
        ZfsError / PermissionDenied: another failure of the command.
        HostUnreachable / HostKeyMismatch: from an SSH executor.
    """
    argv = [zfs, "send", "-n", "-v", "-t", check_token(token)]
    try:
        done = executor.run(argv, check=False, timeout=timeout)
    except ZfsError:
        raise
    except CommandFailed as exc:  # timeout, missing binary
        raise map_error(exc) from exc
    for text in (done.text, done.stderr.decode("utf-8", errors="surrogateescape")):
        if _contents(text) is not None:
            return parse_token_description(text, token)
    message = done.error_text or done.text.strip()[-2000:]
    if done.returncode != 0:
        error = map_error(CommandFailed(list(done.argv), done.returncode, message, executor.host))
        if not isinstance(error, ResumeTokenRefused):
            raise error
    raise ResumeTokenInvalid(
        f"[{executor.host}] zfs cannot read resume token {token[:40]}...: "
        f"{message or '(no output)'}; abort the partial receive (zfs receive -A) and "
        "replicate again"
    )
