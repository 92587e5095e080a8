"""Optional libraries installed as pip extras, and the one-line error when one is missing.

boto3 (``zbak[s3]``) is needed only by ``s3://`` stores, psycopg (``zbak[postgresql]``)
only by a PostgreSQL catalog and apprise (``zbak[apprise]``) only by ``[alerts.apprise]``, so a
host with a SQLite catalog, ``file://`` stores and webhook or mail alerts installs none. A config that needs a missing one is refused at ``zbak config check`` and
``zbak init`` (:func:`require_for_config`) and where the store or catalog is opened
(:func:`require`): ``NAME needs MODULE: pip install 'zbak[EXTRA]'``, exit 2.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING

from zrepl_py.errors import ExtraMissing

if TYPE_CHECKING:
    from zrepl_py.config.schema import Config


@dataclasses.dataclass(frozen=True)
class Extra:
    """One pip extra: its name (``zbak[NAME]``) and the module it installs."""

    name: str
    module: str


S3 = Extra("s3", "boto3")
POSTGRESQL = Extra("postgresql", "psycopg")
APPRISE = Extra("apprise", "apprise")

CATALOG = "the PostgreSQL catalog ([catalog] url)"
"""What a missing-psycopg message says needs it."""
APPRISE_USER = "the apprise alerts ([alerts.apprise])"
"""What a missing-apprise message says needs it."""


def require(extra: Extra | None, user: str) -> None:
    """Import ``extra.module`` (nothing for None); raise :class:`ExtraMissing` when it fails.

    The import is real, not only a look-up, so a half-installed package (boto3 without
    botocore, psycopg without a libpq) is caught here too, and its error is quoted.

    Args:
        extra: the extra that provides the module, or None when nothing is needed.
        user: what needs it, e.g. ``"store cold"``; the message starts with it.

    Raises:
        ExtraMissing: exit 2, ``USER needs MODULE: pip install 'zbak[EXTRA]'``.
    """
    if extra is None:
        return
    try:
        importlib.import_module(extra.module)
    except ImportError as exc:
        absent = isinstance(exc, ModuleNotFoundError) and exc.name == extra.module
        reason = None if absent else (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ExtraMissing([(user, extra.module, extra.name, reason)]) from None


def for_store(url: str) -> Extra | None:
    """The extra a store with ``url`` needs: ``S3`` for ``s3://``, None for ``file://``."""
    return S3 if url.startswith("s3://") else None


def for_catalog(drivername: str) -> Extra | None:
    """The extra a catalog URL's scheme (SQLAlchemy ``drivername``) needs: ``POSTGRESQL``
    for ``postgresql`` and ``postgresql+psycopg`` (zbak's driver); None for SQLite or a
    driver the admin installs on their own (``postgresql+psycopg2``)."""
    return POSTGRESQL if drivername in ("postgresql", "postgresql+psycopg") else None


def require_for_config(config: Config) -> None:
    """Check that every extra ``config`` needs is importable.

    Raises:
        ExtraMissing: one line per store, and one for the catalog, whose extra is missing.
    """
    needs = [(for_catalog(config.catalog_url.split("://", 1)[0]), CATALOG)]
    needs += [(for_store(store.url), f"store {name}") for name, store in config.stores.items()]
    if config.alerts.apprise is not None:
        needs.append((APPRISE, APPRISE_USER))
    missing: list[tuple[str, str, str, str | None]] = []
    for extra, user in needs:
        try:
            require(extra, user)
        except ExtraMissing as exc:
            missing += exc.needs
    if missing:
        raise ExtraMissing(missing)
