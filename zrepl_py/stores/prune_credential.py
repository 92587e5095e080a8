"""One store reached with two credentials: every delete with the prune credential, every
other call with the writer's (docs/reliability.md#r42-least-privilege-s3-credentials)."""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Collection, Iterable, Iterator

from zrepl_py.stores.base import Backend, ObjectInfo, PutResult, Thaw, Unfinished, Version
from zrepl_py.stores.object_lock import LockPolicy


class PruneCredentialBackend(Backend):
    """A store reached with two credentials: ``delete`` and ``delete_version`` with the prune
    credential, every other call with the writer's
    (docs/reliability.md#r42-least-privilege-s3-credentials; borg's append-only/no-delete
    keys).

    The writer's credential then needs no ``s3:DeleteObject``, so a stolen writer key (the
    one every archive run holds) cannot destroy the archive: deleting objects needs the
    prune credential, configured as ``[stores.NAME] prune_profile``. Errors are the
    wrapped backends' (a refused delete is ``StorePermanent``, never swallowed).

    Args:
        writer: the backend of ``profile``: put, get, stat, list, request_thaw.
        pruner: the backend of ``prune_profile``: delete.
    """

    def __init__(self, writer: Backend, pruner: Backend) -> None:
        self.writer = writer
        self.pruner = pruner
        self.name = writer.name
        self.url = writer.url

    def __repr__(self) -> str:
        return f"PruneCredentialBackend({self.writer!r})"

    def put(self, key: str, chunks: Iterable[bytes], *, storage_class: str = "STANDARD") -> PutResult:
        """``writer.put``."""
        return self.writer.put(key, chunks, storage_class=storage_class)

    def get(self, key: str, *, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """``writer.get``."""
        return self.writer.get(key, chunk_size=chunk_size)

    def stat(self, key: str) -> ObjectInfo:
        """``writer.stat``."""
        return self.writer.stat(key)

    def get_version(self, key: str, version_id: str, *,
                    chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """``writer.get_version``."""
        return self.writer.get_version(key, version_id, chunk_size=chunk_size)

    def stat_version(self, key: str, version_id: str) -> ObjectInfo:
        """``writer.stat_version``."""
        return self.writer.stat_version(key, version_id)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """``writer.list``."""
        return self.writer.list(prefix)

    @property
    def lock_policy(self) -> LockPolicy | None:
        """``writer.lock_policy``."""
        return self.writer.lock_policy

    def lock_version(self, key: str, version_id: str) -> dt.datetime:
        """``writer.lock_version``: extending a lock is part of writing."""
        return self.writer.lock_version(key, version_id)

    @property
    def keeps_versions(self) -> bool:
        """``writer.keeps_versions``."""
        return self.writer.keeps_versions

    def retain_until(self, key: str, version_id: str) -> dt.datetime | None:
        """``writer.retain_until``."""
        return self.writer.retain_until(key, version_id)

    def list_versions(self, prefix: str) -> Iterator[Version]:
        """``writer.list_versions``."""
        return self.writer.list_versions(prefix)

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """``writer.sizes``."""
        return self.writer.sizes(prefix)

    def list_outside(self, prefix: str, skip: Collection[str]) -> Iterator[ObjectInfo]:
        """``writer.list_outside``."""
        return self.writer.list_outside(prefix, skip)

    def delete(self, key: str) -> None:
        """``pruner.delete``: the only call made with the prune credential."""
        self.pruner.delete(key)

    def delete_version(self, key: str, version_id: str) -> None:
        """``pruner.delete_version``: a delete, so the prune credential's."""
        self.pruner.delete_version(key, version_id)

    def request_thaw(self, key: str, *, days: int, tier: str) -> Thaw:
        """``writer.request_thaw``."""
        return self.writer.request_thaw(key, days=days, tier=tier)

    def probe(self) -> str:
        """``writer.probe``: the credential every run uses (the prune credential is used
        only by ``zbak prune`` and ``zbak audit --repair``)."""
        return self.writer.probe()

    def unfinished_uploads(self, prefix: str = "", *,
                           sizes: bool = True) -> builtins.list[Unfinished]:
        """``writer.unfinished_uploads``."""
        return self.writer.unfinished_uploads(prefix, sizes=sizes)

    def abort_upload(self, upload: Unfinished) -> bool:
        """``writer.abort_upload``: aborting an upload is part of writing (the writer's own
        failed puts abort theirs), and deletes no stored object."""
        return self.writer.abort_upload(upload)

    def close(self) -> None:
        """Close both backends."""
        try:
            self.writer.close()
        finally:
            self.pruner.close()
