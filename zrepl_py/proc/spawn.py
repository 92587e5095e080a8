"""The one way zrepl_py starts a child process
(docs/decisions.md#every-child-process-starts-through-spawn,
docs/reliability.md#r39-no-secrets-in-argv, docs/reliability.md#r40-no-secrets-in-logs).

Every ``run``, ``popen`` and ``exec_replace`` here gives the child the environment it is
handed (default: this process's) minus every secret variable (``proc.childenv.child_env``):
no caller can forget the filter, as the ``setpriv`` probe once did. The single exception is
``popen_zbak``: the daemon's own zbak child reads the AWS chain and ``{ env = ... }`` secrets
itself, so it inherits them; it is named apart so that every use is visible.

No other module of zrepl_py imports ``subprocess`` or calls ``os.exec*``/``os.spawn*``/
``os.posix_spawn``/``os.system``/``os.popen`` (a test walks the package's syntax trees).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from subprocess import (
    DEVNULL,
    PIPE,
    STDOUT,
    CompletedProcess,
    Popen,
    SubprocessError,
    TimeoutExpired,
)
from typing import Any, NoReturn

from zrepl_py.proc.childenv import child_env

__all__ = ["DEVNULL", "PIPE", "STDOUT", "CompletedProcess", "Popen", "SubprocessError",
           "TimeoutExpired", "exec_replace", "popen", "popen_zbak", "run"]


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
        **kwargs: Any) -> CompletedProcess[Any]:
    """``subprocess.run(argv, ...)`` with ``env`` (default ``os.environ``) minus its secrets.

    Args:
        argv: the command, one str per argument (never a shell string).
        env: the environment to filter; None for this process's.
        kwargs: any other ``subprocess.run`` argument except ``env`` and ``shell``.

    Raises:
        OSError, subprocess.TimeoutExpired: as ``subprocess.run``.
    """
    return subprocess.run(list(argv), env=child_env(env), **_checked(kwargs))


def popen(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          **kwargs: Any) -> Popen[Any]:
    """``subprocess.Popen(argv, ...)`` with ``env`` (default ``os.environ``) minus its secrets.

    Raises:
        OSError: the program could not be started.
    """
    return subprocess.Popen(list(argv), env=child_env(env), **_checked(kwargs))


def popen_zbak(argv: Sequence[str], env: Mapping[str, str], **kwargs: Any) -> Popen[Any]:
    """Start zbak itself (the daemon's action child) with ``env`` unfiltered: it needs the
    store credentials and alert secrets the daemon was given.

    Raises:
        OSError: the interpreter could not be started.
    """
    return subprocess.Popen(list(argv), env=dict(env), **_checked(kwargs))


def exec_replace(argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """Replace this process with ``argv`` (``os.execvpe``, PATH search) and ``env`` minus
    its secrets.

    Raises:
        OSError: the program could not be executed (this process is unchanged).
    """
    os.execvpe(argv[0], list(argv), child_env(env))


def _checked(kwargs: dict[str, Any]) -> dict[str, Any]:
    if kwargs.get("shell"):
        raise TypeError("zrepl_py never starts a shell: pass an argv list")
    return kwargs
