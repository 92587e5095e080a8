"""The pools of a push through ``zbak serve``: a source pool with ``data``, and a backup pool
whose ``replicas`` a forced command serves (the replica of ``data`` lands in
``replicas/data``)."""

from __future__ import annotations

import dataclasses

from support.cli import zfs
from support.zfs import PoolHandle


@dataclasses.dataclass(frozen=True)
class ServedPools:
    """The two pools and the names the tests use; ``data`` and ``root`` exist."""

    src: PoolHandle
    bak: PoolHandle
    data: str
    root: str
    replica: str


def served_pools(make_pool) -> ServedPools:
    """Two fresh pools (``make_pool``), ``SRC/data`` and ``BAK/replicas`` created."""
    src, bak = make_pool(), make_pool()
    pools = ServedPools(src, bak, f"{src.name}/data", f"{bak.name}/replicas",
                        f"{bak.name}/replicas/data")
    zfs("create", pools.data)
    zfs("create", pools.root)
    return pools
