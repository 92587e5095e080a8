"""``[stores.NAME]``: the keys every store has, whatever its scheme.

Each scheme's settings (``zrepl_py.stores.schemes``) subclass :class:`StoreConfig` with the
keys only that scheme has, and say which URLs are theirs (:meth:`StoreConfig.check_url`); the
config holds them as one union told apart by the URL (``zrepl_py.stores.registry``).
"""

from __future__ import annotations

import abc
from typing import Literal, get_args

from pydantic import Field, field_validator

from zrepl_py.values.fields import ByteSize, Table

StorageClass = Literal[
    "STANDARD",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER_IR",
    "GLACIER",
    "DEEP_ARCHIVE",
]
S3_STORAGE_CLASSES: tuple[StorageClass, ...] = get_args(StorageClass)


class StorageClasses(Table):
    """Storage class per stream kind; manifests are always STANDARD (restorable metadata)."""

    full: StorageClass = "STANDARD"
    incremental: StorageClass = "STANDARD"


class StoreConfig(Table):
    """The keys of ``[stores.NAME]`` every scheme has. Abstract: a store's table is one
    scheme's subclass, chosen by its ``url``.

    A store that keeps no storage classes (``file://``) accepts ``storage_class`` and stores
    everything as STANDARD; ``upload_concurrency`` also bounds the objects read at once
    (``zbak audit``, ``zbak catalog rebuild``), whatever the scheme.
    """

    url: str
    storage_class: StorageClasses = StorageClasses()
    volume_size: ByteSize = 1024**3
    """Bytes per stored volume object; 1 GiB keeps any stream far inside S3 limits."""
    upload_concurrency: int = Field(4, ge=1, le=64)

    @classmethod
    @abc.abstractmethod
    def check_url(cls, url: str) -> None:
        """Check that ``url`` is a URL of this scheme, as written in the config.

        Raises:
            ValueError: it is not; the message says the form expected.
        """

    def host_names(self) -> tuple[str, ...]:
        """The ``[hosts.NAME]`` names the store's URL refers to (``sftp://HOST/...``); the
        config checks each is defined. None by default."""
        return ()

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        cls.check_url(value)
        return value
