"""The paths an admin names inside a dataset (PURE): ``--path PATH`` of ``zbak restore`` and
the PATH of ``zbak find``.

A PATH is relative to the dataset's root, the directory its ``mountpoint`` shows
(docs/decisions.md#a-file-path-is-relative-to-the-dataset): ``home/alice/notes.txt`` of
``tank/data`` mounted at ``/tank/data``. An absolute PATH is refused, with the hint, because
the dataset's mountpoint is not known wherever its files are read (a replica, an archive
chain received into scratch, a pool that is gone). ``..`` anywhere is refused; empty and
``.`` components are dropped (``a//./b`` is ``a/b``); ``.`` alone is the whole dataset. Any
other byte a file name may hold is kept as it is (spaces, a leading ``-``, a newline): such
names exist in real file systems and are restored like any other; they reach processes as
argv elements only (docs/style.md#no-shell-strings).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from zrepl_py.errors import UsageError

ROOT = "."
"""The PATH of the whole dataset."""


class InvalidPath(UsageError):
    """A PATH cannot name a file of the dataset (absolute, ``..``, empty, a NUL byte); exit 2
    before anything is read."""


def parse_path(text: str, what: str = "PATH") -> str:
    """``text`` as a normalised relative path (the module doc), ``ROOT`` for the dataset root.

    Raises:
        InvalidPath: empty, a NUL byte, absolute, or a ``..`` component.
    """
    if not text:
        raise InvalidPath(f"{what} is empty: name a file or directory relative to the"
                          " dataset's mountpoint, or . for all of it")
    if "\x00" in text:
        raise InvalidPath(f"{what} {text!r} holds a NUL byte")
    if text.startswith("/"):
        raise InvalidPath(f"{what} {text!r} is absolute: give it relative to the dataset's"
                          " mountpoint (for /tank/data/home/x of tank/data mounted at"
                          " /tank/data: home/x)")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidPath(f"{what} {text!r} has a '..' component: name the file by its path"
                          " from the dataset's mountpoint")
    return "/".join(parts) or ROOT


def covering(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths with every path inside another one left out, sorted (``a`` covers
    ``a/b``; ``ROOT`` covers all)."""
    unique = sorted(set(paths))
    if ROOT in unique:
        return (ROOT,)
    kept: list[str] = []
    for path in unique:  # sorted: a directory comes right before what is inside it
        if not any(path.startswith(k + "/") for k in kept):
            kept.append(path)
    return tuple(kept)


def parents(path: str) -> list[str]:
    """The directories ``path`` is reached through, outermost first: ``a/b/c`` gives
    ``["a", "a/b"]``; a top-level path or ``ROOT`` gives ``[]``."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))] if path != ROOT else []


def member_path(name: str) -> str | None:
    """A tar member's name as a normalised relative path (``./a/b/`` gives ``a/b``, ``.``
    gives ``ROOT``), or None when it is absolute, has a ``..`` component or a NUL byte."""
    if not name or name.startswith("/") or "\x00" in name:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return None
    return "/".join(parts) or ROOT


def within(path: str, paths: Sequence[str]) -> bool:
    """True when ``path`` is one of ``paths`` or inside one of them."""
    return any(p == ROOT or path == p or path.startswith(p + "/") for p in paths)
