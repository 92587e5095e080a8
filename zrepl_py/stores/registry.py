"""The store registry: every scheme zbak can store to, and the one way from a
``[stores.NAME]`` table to its settings and its backend (docs/decisions.md#store-registry).

A scheme is declared by one module of ``zrepl_py.stores.schemes`` and registered by one line
in :data:`SCHEMES`. Everything that depends on the scheme asks here: the config validates a
store's table as its scheme's settings (:data:`AnyStoreConfig`, a union pydantic tells apart
by the URL), the extras check asks :func:`scheme_of` for the pip extra, and commands open
stores with :func:`open_store`. The store contract suite runs on every registered scheme
(``tests/integration/test_store_contract.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Discriminator, Tag, model_validator

from zrepl_py.runtime.extras import require
from zrepl_py.stores.base import Backend
from zrepl_py.stores.scheme import Scheme, StoreEnv
from zrepl_py.stores.schemes import file, s3, sftp
from zrepl_py.stores.settings import StoreConfig

SCHEMES: tuple[Scheme[Any], ...] = (
    s3.SCHEME,
    file.SCHEME,
    sftp.SCHEME,
)
"""Every scheme, in the order a message lists their URL forms."""

_BY_SETTINGS = {scheme.settings: scheme for scheme in SCHEMES}
_UNRECOGNISED = "unrecognised"
"""The union's tag for a table whose ``url`` is no registered scheme's (or missing)."""


def scheme_for_url(url: str) -> Scheme[Any] | None:
    """The scheme whose URLs include ``url``, or None when none does."""
    for scheme in SCHEMES:
        try:
            scheme.settings.check_url(url)
        except ValueError:
            continue
        return scheme
    return None


def scheme_of(settings: StoreConfig) -> Scheme[Any]:
    """The scheme of a validated store table (by its settings class)."""
    return _BY_SETTINGS[type(settings)]


def url_forms() -> str:
    """The URL forms of every scheme, as a message lists them:
    ``'s3://bucket[/prefix]' or 'file:///absolute/dir'``."""
    forms = [repr(scheme.form) for scheme in SCHEMES]
    return " or ".join([", ".join(forms[:-1]), forms[-1]] if len(forms) > 1 else forms)


def foreign_key(tag: str, key: str) -> str | None:
    """What to say of ``key`` in a store table of scheme ``tag`` that does not take it, when
    other schemes do: ``"prune_profile applies to s3:// stores only"``; None when no scheme
    takes it (then it is just an unknown key)."""
    owners = [f"{s.name}://" for s in SCHEMES if s.name != tag and key in s.settings.model_fields]
    return f"{key} applies to {' and '.join(owners)} stores only" if owners else None


def open_store(name: str, settings: StoreConfig, env: StoreEnv | None = None) -> Backend:
    """Return the backend of store ``name``, as its scheme opens it; nothing is contacted.

    Args:
        name: the store's name (the ``NAME`` of ``[stores.NAME]``).
        settings: the validated store table.
        env: what opening may take besides the settings (``StoreEnv``); None for defaults.

    Raises:
        ExtraMissing: the scheme's pip extra is not installed (``zbak[s3]`` for boto3).
        StorePermanent: settings the scheme cannot work with (see each scheme's ``open``).
    """
    scheme = scheme_of(settings)
    require(scheme.extra, f"store {name}")
    return scheme.open(name, settings, env or StoreEnv())


class _Unrecognised(StoreConfig):
    """A store table whose ``url`` no scheme takes: validating it reports the URL (and any
    other problem of the keys every store has), never a key another scheme takes."""

    @model_validator(mode="before")
    @classmethod
    def _without_scheme_keys(cls, data: object) -> object:
        if not isinstance(data, Mapping):
            return data
        taken = {key for scheme in SCHEMES for key in scheme.settings.model_fields}
        return {k: v for k, v in data.items() if k in cls.model_fields or k not in taken}

    @classmethod
    def check_url(cls, url: str) -> None:
        """Always raises ValueError: the reason of the scheme the URL starts with
        (``sftp://local/x``: use ``file://``), else every scheme's URL form."""
        for scheme in SCHEMES:
            if url.startswith(f"{scheme.name}://"):
                scheme.settings.check_url(url)
        raise ValueError(f"expected {url_forms()}")


def _tag(value: object) -> str:
    """The union tag of a store table (a TOML table, or settings built in code): the name
    of the scheme its ``url`` belongs to."""
    if isinstance(value, StoreConfig):
        return scheme_of(value).name if type(value) in _BY_SETTINGS else _UNRECOGNISED
    url = value.get("url") if isinstance(value, Mapping) else None
    scheme = scheme_for_url(url) if isinstance(url, str) else None
    return scheme.name if scheme is not None else _UNRECOGNISED


if TYPE_CHECKING:
    AnyStoreConfig = StoreConfig
else:
    AnyStoreConfig = Annotated[
        Union[tuple(Annotated[s.settings, Tag(s.name)] for s in SCHEMES)  # noqa: UP007
              + (Annotated[_Unrecognised, Tag(_UNRECOGNISED)],)],
        Discriminator(_tag),
    ]
"""A ``[stores.NAME]`` table: the settings of the scheme its ``url`` names. A validation
error's location holds the tag (the scheme's name) after the store's name: the config loader
takes it out, so key paths read as written (``stores.NAME.KEY``)."""
