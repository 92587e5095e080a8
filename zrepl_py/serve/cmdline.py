"""Split ``$SSH_ORIGINAL_COMMAND`` back into argvs, accepting only what zbak itself writes.

zbak turns an argv into a remote command string in one place (``proc.openssh.remote_command``,
``shlex.join``) and a pipeline into ``CMD | CMD`` (``remote_pipeline``). ``shlex.quote``
writes a word either bare, when every character is in ``[A-Za-z0-9_@%+=:,./-]``, or inside
single quotes, with each ``'`` written as ``'"'"'`` (CPython Lib/shlex.py). So a request from
zbak consists of exactly:

- bare characters from that set;
- single-quoted strings (everything between the quotes is literal, newlines included);
- the double-quoted string ``"'"`` (one quote character);
- spaces between words, and ``|`` as a word of its own between two commands.

Everything else a shell would interpret (``;``, ``&``, ``>``, ``<``, ``$``, backticks,
``(``, ``*``, ``~``, ``\\``, newlines, tabs, non-ASCII outside quotes) is refused here, so
the request never needs a shell; the argvs are executed directly. ``shlex.split`` is not
used because it cannot tell a quoted ``'|'`` from the pipe.
"""

from __future__ import annotations

from zrepl_py.errors import CommandRefused

MAX_COMMAND_BYTES = 65536
"""Longest request accepted; zbak's longest (a hold on many snapshots) is far below."""

SAFE_BARE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")
"""Characters ``shlex.quote`` leaves unquoted (``[\\w@%+=:,./-]`` with re.ASCII)."""

_DOUBLE_QUOTED_QUOTE = "\"'\""


def split_command_line(text: str | None) -> list[list[str]]:
    """Return the commands of a ``remote_command``/``remote_pipeline`` string as argvs.

    Args:
        text: ``$SSH_ORIGINAL_COMMAND`` (None when the client asked for a login shell).

    Returns:
        one argv per command of the pipeline, each non-empty, e.g.
        ``"zstd -q -d -c | zfs receive -u 'pool/a b'"`` ->
        ``[["zstd", "-q", "-d", "-c"], ["zfs", "receive", "-u", "pool/a b"]]``.

    Raises:
        CommandRefused: no command, too long, unbalanced quotes, an empty pipeline stage, or
            any character outside the grammar in the module doc (the message names it and
            its offset).
    """
    if text is None or not text.strip(" "):
        raise CommandRefused("no command given (an interactive login or shell is never allowed)")
    if len(text.encode("utf-8", "surrogateescape")) > MAX_COMMAND_BYTES:
        raise CommandRefused(f"command longer than {MAX_COMMAND_BYTES} bytes")
    commands: list[list[str]] = [[]]
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == " ":
            i += 1
            continue
        if char == "|":
            if i + 1 < n and text[i + 1] != " ":
                raise CommandRefused(f"unquoted shell metacharacter {text[i:i + 2]!r} at "
                                     f"offset {i}: zbak serve runs no shell")
            if not commands[-1]:
                raise CommandRefused(f"empty command before '|' at offset {i}")
            commands.append([])
            i += 1
            continue
        word, i = _word(text, i)
        commands[-1].append(word)
    if not commands[-1]:
        raise CommandRefused("empty command at the end of the pipeline")
    return commands


def _word(text: str, i: int) -> tuple[str, int]:
    """Read one word starting at ``i``; return it and the offset after it."""
    parts: list[str] = []
    n = len(text)
    while i < n and text[i] != " ":
        char = text[i]
        if char in SAFE_BARE:
            start = i
            while i < n and text[i] in SAFE_BARE:
                i += 1
            parts.append(text[start:i])
        elif char == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise CommandRefused(f"unterminated single quote at offset {i}")
            parts.append(text[i + 1:end])
            i = end + 1
        elif text.startswith(_DOUBLE_QUOTED_QUOTE, i):
            parts.append("'")
            i += len(_DOUBLE_QUOTED_QUOTE)
        else:
            raise CommandRefused(f"unquoted shell metacharacter {char!r} at offset {i}: "
                                 "zbak serve runs no shell")
    return "".join(parts), i
