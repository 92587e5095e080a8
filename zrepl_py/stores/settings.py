"""``[stores.NAME]``: the keys every store has, whatever its scheme.

Each scheme's settings (``zrepl_py.stores.schemes``) subclass :class:`StoreConfig` with the
keys only that scheme has, and say which URLs are theirs (:meth:`StoreConfig.check_url`); the
config holds them as one union told apart by the URL (``zrepl_py.stores.registry``).
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from zrepl_py.runtime.extras import Extra
from zrepl_py.streams.age import RECIPIENT
from zrepl_py.values.fields import BandwidthLimit, ByteSize, Table
from zrepl_py.values.timetable import Timetable

AGE = Extra("age", "pyrage")
"""The pip extra a sealed store (``[stores.NAME.age]``) needs: ``zbak[age]``."""

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


class AgeSettings(Table):
    """``[stores.NAME.age]``: the store is sealed, every volume encrypted to every recipient
    in the age format (docs/sealed.md).

    Attributes:
        recipients: public keys: age X25519 (``age1...``) or OpenSSH ``ssh-ed25519 BASE64``.
        recipients_file: a file of more of them, one per line (``#`` comments), as
            ``age -R`` reads it; read when the store is written to.
        identity_file: a private key (``age-keygen`` output, or an unencrypted OpenSSH
            ed25519 key) that decrypts the store; only on a host that restores, deep-audits
            or drills (``--identity FILE`` overrides it). The archiving host needs none.
    """

    recipients: tuple[str, ...] = ()
    recipients_file: Path | None = None
    identity_file: Path | None = None

    @field_validator("recipients")
    @classmethod
    def _public_keys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for number, key in enumerate(value, 1):
            if not RECIPIENT.fullmatch(key.strip()):
                raise ValueError(f"entry {number} is not an age X25519 (age1...) or"
                                 " ssh-ed25519 public key")
        return tuple(key.strip() for key in value)

    @model_validator(mode="after")
    def _someone(self) -> AgeSettings:
        if not self.recipients and self.recipients_file is None:
            raise ValueError("a sealed store needs recipients or recipients_file")
        return self


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
    age: AgeSettings | None = None
    """Sealed cold storage (client-side age encryption); None: volumes are plain zstd."""
    bandwidth_limit: BandwidthLimit = Timetable()
    """Bytes per second of the uploads to this store (archive volumes), or a weekly
    timetable in UTC (``values.timetable``); ``Timetable()`` (``"off"``): none."""

    @property
    def keeps_progress_locally(self) -> bool:
        """True when an upload's progress record (with the raw SHA-256 of each volume it
        compares on resume) lives in the archiving host's state directory instead of the
        store: a sealed store holds no hash of plaintext
        (docs/design.md#upload-progress-record)."""
        return self.age is not None

    @property
    def needs_identity(self) -> bool:
        """True for a sealed store, whose volumes open only with an age identity
        (docs/design.md#sealed-cold-storage); a drill skips it where no identity is at hand."""
        return self.age is not None

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
