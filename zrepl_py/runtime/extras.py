"""Optional libraries installed as pip extras (``zbak[NAME]``), and the one-line error when
one is missing: ``USER needs MODULE: pip install 'zbak[EXTRA]'``, exit 2.

Who needs which extra is said where the need is declared: a store's scheme
(``zrepl_py.stores.schemes``), the catalog and the apprise alerts (``zrepl_py.config.extras``).
"""

from __future__ import annotations

import dataclasses
import importlib

from zrepl_py.errors import ExtraMissing


@dataclasses.dataclass(frozen=True)
class Extra:
    """One pip extra: its name (``zbak[NAME]``) and the module it installs."""

    name: str
    module: str


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
