"""Load and validate the TOML config; every error names the key path and the file."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from zrepl_py.config.schema import Config
from zrepl_py.errors import ConfigError
from zrepl_py.runtime.reading import CONFIG_LIMIT, read_regular
from zrepl_py.stores.registry import foreign_key

DEFAULT_CONFIG_PATH = Path("/etc/zbak/zbak.toml")
CONFIG_ENV = "ZBAK_CONFIG"


def config_path(explicit: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path:
    """Resolve the config file: ``--config``, then ``$ZBAK_CONFIG``, then /etc/zbak/zbak.toml."""
    if explicit:
        return Path(explicit)
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV])
    return DEFAULT_CONFIG_PATH


def _key_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


_EXPECTED = {"dict_type": "a table", "model_type": "a table", "list_type": "an array",
             "string_type": "a string", "int_type": "an integer", "bool_type": "true or false",
             "float_type": "a number"}
"""What pydantic's type errors expected, in TOML's words ("Input should be a valid
dictionary or instance of SelectConfig" says neither TOML nor what was found)."""

_TOML_TYPES = {dict: "a table", list: "an array", str: "a string", bool: "a boolean",
               int: "an integer", float: "a number"}


def _type_message(expected: str, given: object) -> str:
    """``expected a table, got a string``: what was found is named by its type only, never
    its value, which may be a secret (a notification URL with its token, a password)."""
    return f"expected {expected}, got {_TOML_TYPES.get(type(given), type(given).__name__)}"


def _problem(err: ErrorDetails) -> tuple[str, str]:
    """``(key path, message)`` of one pydantic error, in the config's words."""
    # Drop pydantic's internal wrapper names (function-after[...], etc.).
    loc = tuple(p for p in err["loc"] if not str(p).startswith("function-"))
    scheme = None
    if loc[:1] == ("stores",) and len(loc) > 2:
        # A store's table is its scheme's settings, a tagged union: pydantic puts the tag
        # (the scheme's name) after the store's name (stores.registry.AnyStoreConfig).
        scheme, loc = str(loc[2]), loc[:2] + loc[3:]
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
        if scheme is not None and len(loc) == 3:
            msg = foreign_key(scheme, str(loc[2])) or msg
    elif err["type"] in _EXPECTED:
        msg = _type_message(_EXPECTED[err["type"]], err.get("input"))
    return _key_path(loc), msg


def parse_config(data: dict[str, Any], path: str) -> Config:
    """Validate an already-parsed TOML table.

    Raises:
        ConfigError: listing every problem as (key path, message) with ``path`` as the file.
    """
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(path, [_problem(err) for err in exc.errors()]) from None
    problems = config.reference_problems()
    if problems:
        raise ConfigError(path, problems)
    return config


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate the TOML file at ``path``.

    Raises:
        ConfigError: file missing or unreadable, TOML syntax error, or schema violations.
    """
    path = Path(path)
    try:
        raw = read_regular(path, CONFIG_LIMIT)
    except OSError as exc:
        raise ConfigError(str(path), [("", f"cannot read config: {exc.strerror}")]) from None
    except ValueError:  # os.open refuses a NUL byte in the path
        raise ConfigError(str(path), [("", "cannot read config: the path holds a NUL byte")]) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [("", f"not valid TOML: {exc}")]) from None
    return parse_config(data, str(path))
