"""What a store scheme declares (``Scheme``) and what opening one of its stores may take
besides the store's own settings (``StoreEnv``).

Each module of ``zrepl_py.stores.schemes`` declares one ``Scheme``; ``zrepl_py.stores.registry``
lists them (docs/decisions.md#store-registry).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from zrepl_py.runtime.extras import Extra
from zrepl_py.stores.base import Backend
from zrepl_py.stores.retry import RetryPolicy
from zrepl_py.stores.settings import StoreConfig

if TYPE_CHECKING:
    from zrepl_py.proc.openssh import SshHost

C = TypeVar("C", bound=StoreConfig)


@dataclasses.dataclass(frozen=True)
class StoreEnv:
    """What opening a store may take besides its settings; each scheme uses what it needs.

    Attributes:
        retry: the retry policy of the store's calls; None for ``RetryPolicy``'s defaults.
        hosts: the config's ``[hosts]`` by name (a store on an SSH server names one).
        known_hosts: the known_hosts file of a host that names none (the config's
            ``<state_dir>/known_hosts``); None: only a host's own.
    """

    retry: RetryPolicy | None = None
    hosts: Mapping[str, SshHost] = dataclasses.field(default_factory=dict)
    known_hosts: Path | None = None


@dataclasses.dataclass(frozen=True)
class Scheme(Generic[C]):
    """One kind of store, as its module declares it.

    Attributes:
        name: the URL scheme (``s3`` for ``s3://...``); also the tag of its settings in the
            config's union of store tables.
        form: how its URL is written, for messages (``s3://bucket[/prefix]``).
        settings: its ``[stores.NAME]`` table: the keys every store has and its own.
        extra: the pip extra its backend needs; None when it needs none.
        open: ``(store name, settings, env) -> Backend``; contacts nothing. It may raise
            ``StorePermanent`` for settings that cannot work (a volume larger than the
            scheme's objects may be).
    """

    name: str
    form: str
    settings: type[C]
    extra: Extra | None
    open: Callable[[str, C, StoreEnv], Backend]
