"""Volumes copied inside S3: between two ``s3://`` stores on one endpoint, ``zbak copy`` asks
S3 to copy each volume (CopyObject) instead of reading it through this host and writing it
back (docs/copies.md#s3-to-s3-inside-s3)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from zrepl_py.catalog.rows import VolumeRow
from zrepl_py.stores.base import Backend, PutResult
from zrepl_py.stores.prune_credential import PruneCredentialBackend
from zrepl_py.stores.schemes.s3 import S3StoreConfig, inside_s3_refusal
from zrepl_py.stores.settings import StoreConfig

if TYPE_CHECKING:
    from zrepl_py.stores.s3 import S3Backend

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class InsideS3:
    """Copies volumes from store ``source`` to store ``target``, both on one S3 endpoint."""

    source: S3Backend
    target: S3Backend

    def copy(self, volume: VolumeRow, storage_class: str) -> PutResult | None:
        """CopyObject of ``volume`` (``S3Backend.copy_within``); None when S3 made no checked
        copy (over 5 GiB, or no full-object SHA-256 answered): the caller streams it, and
        this says so in one log line.

        Raises:
            as ``S3Backend.copy_within``.
        """
        result = self.target.copy_within(self.source, volume.key, storage_class=storage_class)
        if result is None:
            log.info("store %s: volume %s is copied through this host: S3 cannot copy it with"
                     " a full-object SHA-256 (over 5 GiB, or none answered)",
                     self.target.name, volume.key)
        return result


def inside_s3(source_name: str, source_settings: StoreConfig, source: Backend,
              target_name: str, target_settings: StoreConfig, target: Backend) -> InsideS3 | None:
    """An :class:`InsideS3` when both stores are ``s3://`` stores S3 can copy between
    (``inside_s3_refusal``), else None; two ``s3://`` stores that differ get one log line
    saying why their volumes go through this host."""
    if not (isinstance(source_settings, S3StoreConfig)
            and isinstance(target_settings, S3StoreConfig)):
        return None
    why = inside_s3_refusal(source_settings, target_settings)
    if why is not None:
        log.info("stores %s and %s: volumes are copied through this host, not inside S3: %s",
                 source_name, target_name, why)
        return None
    return InsideS3(_writer(source), _writer(target))


def _writer(backend: Backend) -> S3Backend:
    """The ``S3Backend`` that reads and writes for an ``s3://`` store's backend (itself, or a
    ``PruneCredentialBackend``'s writer)."""
    from zrepl_py.stores.s3 import S3Backend

    writer = backend.writer if isinstance(backend, PruneCredentialBackend) else backend
    assert isinstance(writer, S3Backend), writer
    return writer
