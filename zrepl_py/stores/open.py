"""Turn a ``[stores.NAME]`` config table into a :class:`~zrepl_py.stores.base.Backend`."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

from zrepl_py.config.extras import S3, require
from zrepl_py.config.stores import StoreConfig
from zrepl_py.errors import StorePermanent
from zrepl_py.stores.base import Backend, ObjectInfo, PutResult, Thaw, Unfinished
from zrepl_py.stores.retry import RetryPolicy

MiB = 1 << 20


def open_store(name: str, cfg: StoreConfig, *, retry: RetryPolicy | None = None) -> Backend:
    """Return the backend for store ``name`` configured by ``cfg``.

    ``file:///abs/dir`` gives a :class:`~zrepl_py.stores.file.FileBackend` on ``/abs/dir`` (the
    path is taken literally, without percent-decoding). ``s3://bucket[/prefix]`` gives an
    :class:`~zrepl_py.stores.s3.S3Backend` with ``cfg.endpoint``, ``cfg.region``,
    ``cfg.profile`` and ``cfg.upload_concurrency``; its part size is 8 MiB, or more when
    ``cfg.volume_size`` needs it to fit in S3's 10,000 parts (rounded up to whole MiB).
    With ``cfg.prune_profile``, a :class:`PruneCredentialBackend` whose deletes use that
    profile's credential and everything else ``cfg.profile``'s. Nothing is contacted here.

    Args:
        name: the store's name (the ``NAME`` of ``[stores.NAME]``).
        cfg: the validated store config.
        retry: the retry policy of S3 calls; None for the defaults.

    Raises:
        ExtraMissing: an ``s3://`` store without boto3 installed (``zbak[s3]``).
        StorePermanent: an unknown URL scheme (config validation normally rejects it first),
            a relative ``file://`` path, a volume size beyond S3's 5 TiB object limit, an
            unknown AWS profile.
    """
    url = cfg.url
    if url.startswith("file://"):
        path = url[len("file://"):]
        if not path.startswith("/"):
            raise StorePermanent(f"store {name}: {url!r}: use file:///absolute/dir", store=name)
        from zrepl_py.stores.file import FileBackend

        return FileBackend(name, Path(path))
    if url.startswith("s3://"):
        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not bucket:
            raise StorePermanent(f"store {name}: {url!r}: no bucket (s3://bucket/prefix)",
                                 store=name)
        require(S3, f"store {name}")
        from zrepl_py.stores import s3

        if cfg.volume_size > s3.MAX_OBJECT_SIZE:
            raise StorePermanent(
                f"store {name}: volume_size {cfg.volume_size} bytes exceeds S3's 5 TiB object"
                " limit", store=name)
        needed = math.ceil(cfg.volume_size / s3.MAX_PARTS / MiB) * MiB
        part_size = min(s3.MAX_PART_SIZE, max(s3.DEFAULT_PART_SIZE, needed))
        writer = s3.S3Backend(
            name, bucket, prefix,
            endpoint_url=cfg.endpoint, region=cfg.region, profile=cfg.profile,
            part_size=part_size, concurrency=cfg.upload_concurrency, retry=retry,
        )
        if cfg.prune_profile is None:
            return writer
        pruner = s3.S3Backend(
            name, bucket, prefix,
            endpoint_url=cfg.endpoint, region=cfg.region, profile=cfg.prune_profile,
            part_size=part_size, concurrency=1, retry=retry,
        )
        return PruneCredentialBackend(writer, pruner)
    raise StorePermanent(
        f"store {name}: unsupported url {url!r} (use s3://bucket/prefix or file:///dir)",
        store=name)


class PruneCredentialBackend(Backend):
    """A store reached with two credentials: ``delete`` with the prune credential, every other
    call with the writer's (RELIABILITY 42, borg's append-only/no-delete keys).

    The writer's credential then needs no ``s3:DeleteObject``, so a stolen writer key (the
    one every archive run holds) cannot destroy the archive: deleting objects needs the
    prune credential, configured as ``[stores.NAME] prune_profile``. Errors are the
    wrapped backends' (a refused delete is ``StorePermanent``, never swallowed).

    Args:
        writer: the backend of ``profile``: put, get, stat, list, request_thaw.
        pruner: the backend of ``prune_profile``: delete.
    """

    def __init__(self, writer: Backend, pruner: Backend):
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

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """``writer.list``."""
        return self.writer.list(prefix)

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """``writer.sizes``."""
        return self.writer.sizes(prefix)

    def list_outside(self, prefix: str, skip: Collection[str]) -> Iterator[ObjectInfo]:
        """``writer.list_outside``."""
        return self.writer.list_outside(prefix, skip)

    def delete(self, key: str) -> None:
        """``pruner.delete``: the only call made with the prune credential."""
        self.pruner.delete(key)

    def request_thaw(self, key: str, *, days: int, tier: str) -> Thaw:
        """``writer.request_thaw``."""
        return self.writer.request_thaw(key, days=days, tier=tier)

    def unfinished_uploads(self, prefix: str = "", *, sizes: bool = True) -> list[Unfinished]:
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
