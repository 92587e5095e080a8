"""Which pip extras a config needs, checked before any work starts.

boto3 (``zbak[s3]``) is needed only by ``s3://`` stores (each store's scheme names its extra,
``zrepl_py.stores.registry``), pyrage (``zbak[age]``) only by sealed stores, psycopg (``zbak[postgresql]``) only by a PostgreSQL catalog and
apprise (``zbak[apprise]``) only by ``[alerts.apprise]``, so a host with a SQLite catalog,
``file://`` stores and webhook or mail alerts installs none. A config that needs a missing one
is refused at ``zbak config check``, ``zbak init`` and ``zbak daemon``
(:func:`require_for_config`) and where the store or catalog is opened
(``zrepl_py.runtime.extras.require``): ``NAME needs MODULE: pip install 'zbak[EXTRA]'``, exit 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrepl_py.errors import ExtraMissing
from zrepl_py.runtime.extras import Extra, require

if TYPE_CHECKING:
    from zrepl_py.config.schema import Config

POSTGRESQL = Extra("postgresql", "psycopg")
APPRISE = Extra("apprise", "apprise")

CATALOG = "the PostgreSQL catalog ([catalog] url)"
"""What a missing-psycopg message says needs it."""
APPRISE_USER = "the apprise alerts ([alerts.apprise])"
"""What a missing-apprise message says needs it."""


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
    # imported here: `zbak --help` loads this module, and the registry loads pydantic
    from zrepl_py.stores.registry import scheme_of
    from zrepl_py.stores.settings import AGE

    needs = [(for_catalog(config.catalog_url.split("://", 1)[0]), CATALOG)]
    needs += [(scheme_of(store).extra, f"store {name}") for name, store in config.stores.items()]
    needs += [(AGE, f"store {name}") for name, store in config.stores.items()
              if store.age is not None]
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
