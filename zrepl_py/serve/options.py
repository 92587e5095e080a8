"""Read a command's options the way zfs and zpool will, so the check sees what runs.

zfs and zpool parse options with glibc ``getopt``, which *permutes*: an option is recognised
anywhere on the command line, not only before the first operand (getopt(3), "By default,
getopt() permutes the contents of argv as it scans"). ``zfs receive pool/x -F`` therefore
means ``zfs receive -F pool/x``. ``parse`` does the same: every argument that starts with
``-`` is read as a cluster of option letters wherever it stands; a letter that takes a value
consumes the rest of the cluster or the next argument (even one starting with ``-``), as
getopt does. Long options (``--raw``) and the ``--`` terminator are refused: zbak writes
neither, and after ``--`` getopt would take a ``-`` word as an operand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from zrepl_py.errors import CommandRefused


@dataclasses.dataclass(frozen=True)
class Parsed:
    """One command's options and operands.

    Attributes:
        options: ``(letter, value)`` in command-line order; value is None for a flag.
        operands: the remaining arguments, in order.
    """

    options: tuple[tuple[str, str | None], ...]
    operands: tuple[str, ...]

    def has(self, letter: str) -> bool:
        """True when option ``letter`` was given at least once."""
        return any(opt == letter for opt, _ in self.options)

    def values(self, letter: str) -> list[str]:
        """Every value given to option ``letter``, in order."""
        return [value for opt, value in self.options if opt == letter and value is not None]

    def letters(self) -> set[str]:
        """The option letters given."""
        return {opt for opt, _ in self.options}


def parse(args: Sequence[str], *, flags: str = "", valued: str = "", what: str) -> Parsed:
    """Split ``args`` (after the subcommand) into options and operands, getopt-style.

    Args:
        args: the arguments after e.g. ``zfs receive``.
        flags: letters allowed without a value (e.g. ``"us"``).
        valued: letters allowed with a value (e.g. ``"o"`` for ``-o name,guid``).
        what: the command for messages (``"zfs receive"``).

    Raises:
        CommandRefused: a letter outside ``flags``/``valued``, a long option, ``--``, a lone
            ``-``, or a valued letter without its value.
    """
    options: list[tuple[str, str | None]] = []
    operands: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            operands.append(arg)
            continue
        if arg == "-" or arg.startswith("--"):
            raise CommandRefused(f"{what}: argument {arg!r} is not allowed")
        j = 1
        while j < len(arg):
            letter = arg[j]
            j += 1
            if letter in valued:
                if j < len(arg):
                    value, j = arg[j:], len(arg)
                elif i < len(args):
                    value, i = args[i], i + 1
                else:
                    raise CommandRefused(f"{what}: option -{letter} needs a value")
                options.append((letter, value))
            elif letter in flags:
                options.append((letter, None))
            else:
                raise CommandRefused(f"{what}: option -{letter} is not allowed")
    return Parsed(tuple(options), tuple(operands))
