"""The environment zbak's child processes (zfs, zpool, ssh, rsync, zstd, pv) start with.

zbak's own process may hold secrets in its environment: the standard AWS chain reads
``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN`` there (boto3, in process), libpq reads
``PGPASSWORD``, and the config's ``{ env = "NAME" }`` secrets (SMTP password, webhook token)
are variables too. None of the tools zbak starts needs any of them, and a child's environment
is readable by its user in ``/proc/PID/environ``, survives in core dumps, and would travel
further in any child that forwards its environment (docs/reliability.md#r39-no-secrets-in-argv,
docs/style.md#secrets-are-a-type). So every child gets this process's environment minus:

- every ``AWS_*`` variable (AWS CLI/SDK settings; no child talks to AWS);
- every variable whose name contains a secret-like word (``SECRET``, ``PASSWORD``, ``PASSWD``,
  ``PASSPHRASE``, ``TOKEN``, ``CREDENTIAL``, ``PRIVATE_KEY``, ``API_KEY``, ``ACCESS_KEY``,
  ``AUTH`` except ``SSH_AUTH_SOCK``), compared case-insensitively;
- the variables ``register_secret_env`` named (the config's ``{ env = "NAME" }`` secrets,
  registered when the config is validated, whatever their names).

Everything else is kept: ``PATH``, ``HOME``, locale, and ``SSH_AUTH_SOCK`` (ssh reads the
agent through it; it is a socket path, not a key).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping

_SECRET_WORDS = re.compile(
    r"SECRET|PASSWORD|PASSWD|PASSPHRASE|TOKEN|CREDENTIAL|PRIVATE_?KEY|API_?KEY|ACCESS_?KEY"
    r"|AUTH(?!_SOCK$)",
    re.IGNORECASE,
)
_STRIPPED_PREFIXES = ("AWS_",)
_registered: set[str] = set()
_lock = threading.Lock()


def register_secret_env(name: str) -> None:
    """Never pass environment variable ``name`` to a child process (a config secret's source)."""
    with _lock:
        _registered.add(name)


def is_secret_name(name: str) -> bool:
    """True when variable ``name`` is withheld from children (see the module docstring)."""
    upper = name.upper()
    return (upper.startswith(_STRIPPED_PREFIXES) or _SECRET_WORDS.search(name) is not None
            or name in _registered)


def child_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return ``environ`` (default ``os.environ``) without the secret variables.

    Args:
        environ: the environment to filter; None for this process's.

    Returns:
        a new dict for ``subprocess.Popen(env=...)``.
    """
    source = os.environ if environ is None else environ
    return {key: value for key, value in source.items() if not is_secret_name(key)}
