"""``[hosts.NAME]`` and the endpoints jobs name: ``HOST:POOL/PATH``, ``HOST:/dir``,
``POOL/PATH`` (``local`` is this machine)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from pathlib import Path
from typing import Literal, overload

from pydantic import Field, StrictBool, field_validator

from zrepl_py.errors import InvalidEndpoint, InvalidName
from zrepl_py.values.fields import Duration, Table
from zrepl_py.values.names import is_config_name
from zrepl_py.zfs.names import DatasetName

LOCAL_HOST = "local"
"""Host name that means this machine; it needs no ``[hosts.local]`` section."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where a dataset or directory lives: ``HOST:POOL/PATH``, ``HOST:/dir`` or ``POOL/PATH``.

    Attributes:
        host: a ``[hosts.NAME]`` key, or ``"local"`` for this machine.
        dataset: the ZFS dataset, or None for a directory endpoint (rsync targets).
        directory: the absolute directory for rsync targets, else None.
    """

    host: str
    dataset: DatasetName | None
    directory: str | None

    @property
    def is_local(self) -> bool:
        """True when the endpoint is on this machine."""
        return self.host == LOCAL_HOST

    def __str__(self) -> str:
        where = self.dataset if self.dataset is not None else self.directory
        return f"{self.host}:{where}"


@dataclasses.dataclass(frozen=True)
class DatasetEndpoint(Endpoint):
    """An endpoint that is a ZFS dataset (a job's source, a ZFS target): ``parse_endpoint``
    makes every one of these, so its ``dataset`` is never None."""

    dataset: DatasetName
    directory: None = None


@overload
def parse_endpoint(value: object, *, allow_directory: Literal[False]) -> DatasetEndpoint: ...
@overload
def parse_endpoint(value: object, *, allow_directory: bool) -> Endpoint: ...
def parse_endpoint(value: object, *, allow_directory: bool) -> Endpoint:
    """Parse ``HOST:POOL/PATH`` / ``HOST:/dir`` / ``POOL/PATH`` into an Endpoint.

    The text before the first ``:`` is a host when it holds no ``/``; a pool whose name
    contains ``:`` must therefore be written with an explicit host, e.g. ``local:p:x/y``.

    Raises:
        InvalidEndpoint (a ValueError, exit 2): bad host name, invalid dataset name, or a
            directory where not allowed.
    """
    if not isinstance(value, str) or not value:
        raise InvalidEndpoint("expected 'HOST:POOL/PATH' or 'POOL/PATH'")
    host, sep, rest = value.partition(":")
    if not sep or "/" in host:
        host, rest = LOCAL_HOST, value
    if not is_config_name(host):
        raise InvalidEndpoint(f"invalid host name {host!r}")
    if rest.startswith("/"):
        if not allow_directory:
            raise InvalidEndpoint(f"{value!r}: a directory is only allowed as an rsync target")
        if "\x00" in rest or "\n" in rest:
            raise InvalidEndpoint(f"{value!r}: directory has control characters")
        return Endpoint(host, None, rest.rstrip("/") or "/")
    try:
        return DatasetEndpoint(host, DatasetName(rest))
    except InvalidName as exc:
        raise InvalidEndpoint(str(exc)) from None



class HostConfig(Table):
    """``[hosts.NAME]``: an SSH-reachable machine with ZFS (or a directory for rsync)."""

    address: str
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    identity_file: Path | None = None
    known_hosts: Path | None = None
    """known_hosts file; None means ``<state_dir>/known_hosts``. Checking is always strict."""
    trust_on_first_use: StrictBool = False
    """Accept and record an unknown host key once; a changed key is refused regardless."""
    zfs: str = "zfs"
    zpool: str = "zpool"
    zbak: str = "zbak"
    """zbak on this host: a drill runs ``zbak digest`` there to read a snapshot's files
    (behind ``zbak serve`` the request is served by serve itself)."""
    scratch: str | None = None
    """``POOL/PATH``, an existing dataset below which a drill of a replica on this host
    receives its copy; None: next to the replica, below the target dataset's parent."""
    sudo: StrictBool = False
    connect_timeout: Duration = dt.timedelta(seconds=15)
    ciphers: list[str] | None = None
    """SSH ciphers for the ``ssh`` binary (data path, rsync), most preferred first
    (ssh_config(5) ``Ciphers``). None: AES-GCM first where this machine's CPU has AES
    instructions, else ssh's own order (``proc.openssh.data_ciphers``); []: ssh's own order."""

    @field_validator("ciphers")
    @classmethod
    def _ciphers(cls, values: list[str] | None) -> list[str] | None:
        # Names only: a comma or space would splice more ciphers or options into -o Ciphers=.
        for value in values or []:
            if not re.fullmatch(r"[a-z0-9][a-z0-9@.+-]{0,63}", value):
                raise ValueError(f"invalid cipher name {value!r} (see ssh -Q cipher)")
        if values is not None and len(set(values)) != len(values):
            raise ValueError("ciphers are listed twice")
        return values

    @field_validator("scratch")
    @classmethod
    def _scratch(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                DatasetName(value)
            except InvalidName as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("zbak")
    @classmethod
    def _zbak(cls, value: str) -> str:
        # A program name or path; never something a shell or zbak serve could read otherwise.
        if not re.fullmatch(r"[A-Za-z0-9_./+-]{1,255}", value) or value.startswith("-"):
            raise ValueError(f"invalid program {value!r}: a name or an absolute path")
        return value

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        # A hostname, IPv4 or IPv6 literal; never something ssh could read as an option.
        if not re.fullmatch(r"[A-Za-z0-9_.:%\[\]-]{1,253}", value) or value.startswith("-"):
            raise ValueError(f"invalid host address {value!r}")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}\$?", value):
            raise ValueError(f"invalid user name {value!r} (POSIX user names only)")
        return value
