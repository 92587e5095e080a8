"""Turn a ``[stores.NAME]`` config table into a :class:`~zrepl_py.stores.base.Backend`."""

from __future__ import annotations

import math
from pathlib import Path

from zrepl_py.config.schema import StoreConfig
from zrepl_py.errors import StorePermanent
from zrepl_py.stores.base import Backend
from zrepl_py.stores.retry import RetryPolicy

MiB = 1 << 20


def open_store(name: str, cfg: StoreConfig, *, retry: RetryPolicy | None = None) -> Backend:
    """Return the backend for store ``name`` configured by ``cfg``.

    ``file:///abs/dir`` gives a :class:`~zrepl_py.stores.file.FileBackend` on ``/abs/dir`` (the
    path is taken literally, without percent-decoding). ``s3://bucket[/prefix]`` gives an
    :class:`~zrepl_py.stores.s3.S3Backend` with ``cfg.endpoint``, ``cfg.region``,
    ``cfg.profile`` and ``cfg.upload_concurrency``; its part size is 16 MiB, or more when
    ``cfg.volume_size`` needs it to fit in S3's 10,000 parts (rounded up to whole MiB).
    Nothing is contacted here.

    Args:
        name: the store's name (the ``NAME`` of ``[stores.NAME]``).
        cfg: the validated store config.
        retry: the retry policy of S3 calls; None for the defaults.

    Raises:
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
        from zrepl_py.stores import s3

        if cfg.volume_size > s3.MAX_OBJECT_SIZE:
            raise StorePermanent(
                f"store {name}: volume_size {cfg.volume_size} bytes exceeds S3's 5 TiB object"
                " limit", store=name)
        needed = math.ceil(cfg.volume_size / s3.MAX_PARTS / MiB) * MiB
        part_size = min(s3.MAX_PART_SIZE, max(s3.DEFAULT_PART_SIZE, needed))
        return s3.S3Backend(
            name, bucket, prefix,
            endpoint_url=cfg.endpoint, region=cfg.region, profile=cfg.profile,
            part_size=part_size, concurrency=cfg.upload_concurrency, retry=retry,
        )
    raise StorePermanent(
        f"store {name}: unsupported url {url!r} (use s3://bucket/prefix or file:///dir)",
        store=name)
