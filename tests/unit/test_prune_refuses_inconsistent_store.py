"""Archive prune refuses, with a typed error and no delete at all, when an object the catalog
records is missing from the store (docs/reliability.md#r19-prune-refuses-on-an-inconsistent-store;
restic ``TestPruneWithDamagedRepository``).

Plain-data fakes stand in for the store and the catalog: the planner is pure, and the driver
only calls ``list``/``delete`` and ``volumes``/``condemn_streams``/``delete_stream``.
"""

from __future__ import annotations

import datetime as dt
import types

import pytest

from zrepl_py.catalog.rows import StreamRow
from zrepl_py.errors import ObjectNotFound, StoreInconsistent
from zrepl_py.pruning.archive import (
    StoreCheck,
    StoreScope,
    execute_dataset_chains,
    plan_dataset_chains,
)
from zrepl_py.pruning.chain_delete import execute_chain_prune
from zrepl_py.pruning.chain_plan import ChainRetention, plan_chain_retention
from zrepl_py.stores.base import ObjectInfo, Thaw

NOW = dt.datetime(2026, 11, 21, 12, tzinfo=dt.UTC)


def row(id, txg, parent=None, *, state="verified", age=100.0) -> StreamRow:
    """Stream ``id`` of tank/d in store s ending at @TXG, objects under ``p{id}/``."""
    return StreamRow(
        id=id, host="local", dataset="tank/d", store="s",
        kind="full" if parent is None else "incremental",
        parent_id=parent.id if parent else None, from_guid=parent.to_guid if parent else None,
        to_guid=txg * 7, from_name=parent.to_name if parent else None, to_name=str(txg),
        to_createtxg=txg, raw_bytes=100, stored_bytes=50, object_prefix=f"p{id}/",
        storage_class="STANDARD", compression="zstd", state=state,
        created_at=NOW - dt.timedelta(days=age), uploaded_at=None,
        verified_at=NOW - dt.timedelta(days=1) if state == "verified" else None)


# Three chains, oldest first: A (1, 2), B (3, 4), C (5). keep_chains = 1 would delete A and B.
A = [row(1, 10)]
A.append(row(2, 20, A[0]))
B = [row(3, 30, age=60)]
B.append(row(4, 40, B[0], age=50))
C = [row(5, 50, age=5)]
STREAMS = A + B + C
CONDEMNED = row(9, 5, state="condemned", age=200)


class Store:
    """Objects ``{key: size}``, no versions; records every delete."""

    name = "s"
    keeps_versions = False

    def __init__(self, objects: dict[str, int]):
        self.objects, self.deleted = dict(objects), []

    def list(self, prefix: str):
        return [types.SimpleNamespace(key=k, size=v) for k, v in sorted(self.objects.items())
                if k.startswith(prefix)]

    def sizes(self, prefix: str) -> dict[str, int]:
        return {i.key: i.size for i in self.list(prefix)}

    def delete(self, key: str) -> None:
        self.deleted.append(key)
        self.objects.pop(key, None)

    def stat(self, key: str) -> ObjectInfo:
        """Objects are DEEP_ARCHIVE here, so prune's re-check of the releasing chain stops at
        the size (re-reads run on real stores: tests/disaster/test_rot_after_verify.py)."""
        if key not in self.objects:
            raise ObjectNotFound(f"{key} missing", store=self.name, key=key)
        return ObjectInfo(key, self.objects[key], "DEEP_ARCHIVE", NOW, Thaw.FROZEN)


def check(store: Store, catalog: Catalog, streams) -> StoreCheck:
    """What the job driver hands each dataset: one listing, the streams' volume rows."""
    return StoreCheck(store, "", lambda: {s.id: catalog.volumes(s.id) for s in streams})


class Catalog:
    """One volume per stream (``p{id}/vol-000000.zst``, 50 bytes); records every write."""

    def __init__(self, streams):
        self.rows = {s.id: s for s in streams}
        self.writes = []

    def volumes(self, stream_id):
        return [types.SimpleNamespace(key=f"p{stream_id}/vol-000000.zst", stored_bytes=50)]

    def stream(self, stream_id):
        return self.rows[stream_id]

    def condemn_streams(self, ids):
        self.writes.append(("condemn", list(ids)))
        for i in ids:
            self.rows[i] = StreamRow(**{**self.rows[i].__dict__, "state": "condemned"})

    def delete_stream(self, stream_id):
        self.writes.append(("delete", stream_id))


def prune(store: Store, catalog: Catalog, streams):
    """What the job driver does for one dataset of a job with one store: plan, then execute."""
    scope = StoreScope("s", store, ChainRetention(1), check(store, catalog, streams))
    result = plan_dataset_chains([scope], "tank/d", {"s": streams}, NOW)["s"]
    execute_dataset_chains(result, store, catalog, NOW)
    return result


def full_store(streams) -> dict[str, int]:
    objects = {}
    for s in streams:
        objects[f"{s.object_prefix}vol-000000.zst"] = 50
        objects[f"{s.object_prefix}manifest.json"] = 10
    return objects


def test_a_consistent_store_lets_retention_delete_the_old_chains():
    """docs/reliability.md#r19-prune-refuses-on-an-inconsistent-store (control): with every object
    present, the same plan deletes A and B, so the refusal below is caused by the missing object
    alone."""
    store, catalog = Store(full_store(STREAMS)), Catalog(STREAMS)
    result = prune(store, catalog, STREAMS)
    assert result.error is None and result.outcome.error is None
    assert sorted(result.outcome.deleted) == [1, 2, 3, 4]


@pytest.mark.parametrize("missing", ["p4/vol-000000.zst", "p2/manifest.json", "p5/vol-000000.zst"])
def test_one_catalogued_object_missing_makes_prune_refuse_the_whole_dataset_and_delete_nothing(
        missing):
    """docs/reliability.md#r19-prune-refuses-on-an-inconsistent-store: an object the catalog
    references is gone from the store (in a chain retention would delete, in a kept one, or in the
    newest): prune reports StoreInconsistent, issues no delete and writes nothing to the catalog,
    not even for condemned leftovers."""
    streams = STREAMS + [CONDEMNED]
    objects = full_store(STREAMS)
    del objects[missing]
    store, catalog = Store(objects), Catalog(streams)
    result = prune(store, catalog, streams)
    assert result.error and "store is inconsistent" in result.error and "run zbak audit" in result.error
    assert result.outcome is None
    assert store.deleted == [] and catalog.writes == []
    assert result.plan.to_delete == () and result.plan.unfinished == ()
    assert all(d.reasons for d in result.plan.decisions), "every kept stream says why"


def test_the_driver_raises_store_inconsistent_on_a_refused_plan_before_any_write():
    """docs/reliability.md#r19-prune-refuses-on-an-inconsistent-store: ``execute_chain_prune``
    itself refuses a refused plan (typed error)."""
    plan = plan_chain_retention(STREAMS + [CONDEMNED], ChainRetention(1), NOW, damaged={2: "gone"})
    assert plan.refused
    store, catalog = Store(full_store(STREAMS)), Catalog(STREAMS)
    with pytest.raises(StoreInconsistent, match="inconsistent"):
        execute_chain_prune(plan, store, catalog, now=NOW)
    assert store.deleted == [] and catalog.writes == []
