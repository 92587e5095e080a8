"""The mark of an unfinished restore (PURE, import-light: ``zbak serve`` allows exactly the
``zfs set`` and ``zfs inherit`` of it, and loads no config schema).

A restore sets ``RESTORING`` on the dataset it creates once the first stream (a chain's full,
or a local or replica source's full) is received, and clears it when it finished: a dataset
holding it is the unfinished work of a restore that was killed or failed, which the same
restore continues (``plan.plan_restore``) instead of refusing the existing dataset.
"""

from __future__ import annotations

from zrepl_py.errors import InvalidName
from zrepl_py.values.names import is_config_name
from zrepl_py.zfs.names import DatasetName

RESTORING = "zbak:restoring"
"""The user property (zfsprops(7) "User Properties"); its value is ``mark_value``'s."""


def mark_value(host: str, dataset: str) -> str:
    """The mark of a restore of ``host``'s ``dataset`` (a config host name or ``local``, and a
    dataset name): ``HOST:DATASET``."""
    return f"{host}:{dataset}"


def is_mark_value(value: str) -> bool:
    """True when ``value`` has ``mark_value``'s shape: a config host name, ``:``, a valid
    dataset name (OpenZFS naming rules, ``zfs.names``)."""
    host, sep, dataset = value.partition(":")
    if not sep or not is_config_name(host):
        return False
    try:
        DatasetName(dataset)
    except InvalidName:
        return False
    return True
