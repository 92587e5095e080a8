"""``[catalog]``: where the SQL catalog lives (SQLite or PostgreSQL)."""

from __future__ import annotations

import re

from pydantic import field_validator

from zrepl_py.values.fields import Table


class CatalogConfig(Table):
    """``[catalog]``: where the SQL catalog lives."""

    url: str | None = None
    """SQLAlchemy URL; None means ``sqlite:///<state_dir>/catalog.sqlite``. A password is
    never in this file: libpq reads it from ``~/.pgpass`` or ``PGPASSWORD``."""

    @field_validator("url")
    @classmethod
    def _no_password(cls, value: str | None) -> str | None:
        # user:password@host (RFC 3986 userinfo) or ?password= in the query (libpq keyword).
        if value is not None and (re.match(r"^[^:/]+://[^/@?#]*:[^/@?#]*@", value)
                                  or re.search(r"[?&]password=", value, re.IGNORECASE)):
            raise ValueError("a password must not be in the config file: put it in ~/.pgpass"
                             " (mode 0600) or PGPASSWORD, and write the URL without it")
        return value

    @field_validator("url")
    @classmethod
    def _sqlite_or_postgresql(cls, value: str | None) -> str | None:
        # The catalog's migrations and SQL are written for these two (docs/design.md#config-toml).
        if value is not None and not re.match(r"^(sqlite|postgresql)(\+\w+)?://", value):
            raise ValueError(f"{value.split('://', 1)[0]!r} is no catalog database zbak"
                             " supports: use sqlite:////ABSOLUTE/PATH or postgresql://HOST/DB")
        return value
