"""``sftp://HOST/PATH``: a store in a directory of an SFTP server (the backend is
``zrepl_py.stores.sftp``; paramiko, a dependency of zbak itself).

``HOST`` names a ``[hosts.NAME]`` table (address, port, user, identity file, known_hosts:
the same strict host keys as every SSH connection of zbak); ``PATH`` is the store's directory,
absolute as the server's SFTP session sees it (inside its chroot, if any), taken literally
without percent-decoding. The store has no keys of its own beyond those every store has.
"""

from __future__ import annotations

import re

from zrepl_py.errors import StorePermanent
from zrepl_py.stores.base import Backend
from zrepl_py.stores.scheme import Scheme, StoreEnv
from zrepl_py.stores.settings import StoreConfig
from zrepl_py.values.names import is_config_name

_URL = re.compile(r"sftp://(?P<host>[^/]*)(?P<path>/.*)")
_LOCAL_HOST = "local"  # config.hosts.LOCAL_HOST: this machine (stores import no config module)


class SftpStoreConfig(StoreConfig):
    """``[stores.NAME]`` with ``url = "sftp://HOST/PATH"``."""

    @classmethod
    def check_url(cls, url: str) -> None:
        """Raises ValueError unless ``url`` is ``sftp://``, a host name of the config (not
        ``local``), and an absolute path without empty, ``.`` or ``..`` segments or
        control characters (a trailing ``/`` is allowed)."""
        _host_and_path(url)

    @property
    def host(self) -> str:
        """The ``[hosts.NAME]`` the store is on: the URL's host part."""
        return _host_and_path(self.url)[0]

    @property
    def path(self) -> str:
        """The store's directory on the server: the URL's path, without a trailing ``/``
        (``/`` for the root)."""
        return _host_and_path(self.url)[1]

    def host_names(self) -> tuple[str, ...]:
        """The host the URL names (``Config.reference_problems`` checks it is defined)."""
        return (self.host,)


def _host_and_path(url: str) -> tuple[str, str]:
    """``(host, path)`` of an ``sftp://`` URL: the one place it is parsed.

    Raises:
        ValueError: not ``sftp://HOST/PATH`` as :meth:`SftpStoreConfig.check_url` says.
    """
    match = _URL.fullmatch(url)
    if match is None:
        raise ValueError(f"expected {SCHEME.form!r}")
    host, path = match["host"], match["path"]
    if not is_config_name(host):
        raise ValueError(f"expected {SCHEME.form!r} with HOST the name of a [hosts.NAME]"
                         f" table, not {host!r}")
    if host == _LOCAL_HOST:
        raise ValueError("sftp://local/... names this machine: use 'file:///absolute/dir'")
    trimmed = path.rstrip("/")
    if any(ord(c) < 0x20 or c == "\x7f" for c in path) or (
            trimmed and {"", ".", ".."} & set(trimmed.split("/")[1:])):
        raise ValueError(f"the path {path!r} has an empty, '.' or '..' segment or a control"
                         " character")
    return host, trimmed or "/"


def _open(name: str, settings: SftpStoreConfig, env: StoreEnv) -> Backend:
    """An ``SftpBackend`` on one SSH connection to the settings' host, with the store's
    upload concurrency and retry policy.

    Raises:
        StorePermanent: the host is not in ``env.hosts``, or no known_hosts file is known
            for it.
    """
    from zrepl_py.proc.sshconn import SshConnection
    from zrepl_py.stores.sftp import SftpBackend

    host = env.hosts.get(settings.host)
    if host is None:
        raise StorePermanent(f"store {name}: host {settings.host!r} is not defined under"
                             " [hosts]", store=name)
    known_hosts = env.known_hosts if env.known_hosts is not None else host.known_hosts
    if known_hosts is None:
        raise StorePermanent(f"store {name}: no known_hosts file for host {settings.host!r}:"
                             f" set hosts.{settings.host}.known_hosts", store=name)
    connection = SshConnection(settings.host, host, known_hosts_default=known_hosts)
    return SftpBackend(name, connection, settings.path, concurrency=settings.upload_concurrency,
                       retry=env.retry)


SCHEME = Scheme(name="sftp", form="sftp://host/absolute/dir", settings=SftpStoreConfig,
                extra=None, open=_open)
