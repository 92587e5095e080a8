"""Chain prune survives a crash after every step: real chains written by ``archive_job`` from a
zfs-fuse pool to a ``file://`` store, then ``zbak prune``'s chain deletion killed after the
k-th store or catalog write, for every k, and rerun (docs/design.md#chain-prune-order)."""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import pytest
from support.cli import file_archive_config, zfs

from zrepl_py.archive.job import archive_job
from zrepl_py.catalog.db import make_engine
from zrepl_py.catalog.repository import Catalog
from zrepl_py.cli import main
from zrepl_py.config.loading import load_config
from zrepl_py.errors import ExitStatus
from zrepl_py.invocation.context import Context
from zrepl_py.objects.layout import EXPORT_PREFIX, MANIFEST, dataset_prefix
from zrepl_py.pruning.archive import StoreCheck, prune_dataset_chains
from zrepl_py.pruning.chain_plan import ChainRetention
from zrepl_py.stores.file import FileBackend

pytestmark = pytest.mark.zfs
KEEP_ONE = ChainRetention(keep_chains=1)


class Crash(Exception):
    """Stands in for the process dying: not a ZbakError, so nothing catches it."""


class Steps:
    """Counts store and catalog writes; raises Crash once ``limit`` of them are done."""

    def __init__(self, limit: int | None = None):
        self.limit, self.done, self.log = limit, 0, []

    def step(self, what: str) -> None:
        if self.limit is not None and self.done >= self.limit:
            raise Crash(f"crash after step {self.done}")
        self.done += 1
        self.log.append(what)


class CrashingBackend:
    """A Backend whose ``delete`` counts as a step; everything else passes through."""

    def __init__(self, inner, steps: Steps):
        self._inner, self._steps = inner, steps
        self.name = inner.name

    def delete(self, key):
        self._steps.step(f"delete {key}")
        return self._inner.delete(key)

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


class CrashingCatalog:
    """A Catalog whose ``condemn_streams`` and ``delete_stream`` count as steps."""

    def __init__(self, inner, steps: Steps):
        self._inner, self._steps = inner, steps

    def condemn_streams(self, ids):
        ids = list(ids)
        self._steps.step(f"condemn {sorted(ids)}")
        return self._inner.condemn_streams(ids)

    def delete_stream(self, stream_id):
        self._steps.step(f"delete row {stream_id}")
        return self._inner.delete_stream(stream_id)

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


def store_keys(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def check_invariants(catalog: Catalog, root: Path, survivors: set[int]) -> None:
    """No object the catalog forgot; every living stream's chain whole in catalog AND store;
    the streams that must survive are alive."""
    streams = {s.id: s for s in catalog.streams()}
    keys = store_keys(root)
    prefixes = [s.object_prefix for s in streams.values()]
    # The catalog export (``_zbak/``, docs/reliability.md#r25-catalog-rollback-detection) belongs to
    # the store, not to a stream.
    forgotten = sorted(k for k in keys if not k.startswith(EXPORT_PREFIX)
                       and not any(k.startswith(p) for p in prefixes))
    assert not forgotten, f"objects the catalog forgot: {forgotten}"
    for s in streams.values():
        if s.state == "condemned":
            continue
        walk = s
        while walk.parent_id is not None:
            assert walk.parent_id in streams, f"stream {s.id}: parent {walk.parent_id} gone"
            walk = streams[walk.parent_id]
            assert walk.state != "condemned", f"living stream {s.id} applies on condemned {walk.id}"
        assert walk.kind == "full"
        for v in catalog.volumes(s.id):
            path = root / v.key
            assert path.is_file() and path.stat().st_size == v.stored_bytes, f"{v.key} lost"
        assert (root / (s.object_prefix + MANIFEST)).is_file()
    alive = {i for i, s in streams.items() if s.state != "condemned"}
    assert survivors <= alive


@pytest.fixture
def chains(zpool, tmp_path, capsys):
    """Three chains of DATA in a file:// store: A (full @0, -I @0->@2), B (full @4, -I
    @4->@5) and C (full @6); B's and C's fulls verified. Returns the state to copy."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(zfs("get", "-Hp", "-o", "value", "mountpoint", data).strip())
    config, store = file_archive_config(tmp_path, data, volume_size="256KiB",
                                        archive="keep_chains = 1")
    assert main(["--config", str(config), "init", "--no-checks"], env={}) == ExitStatus.OK
    capsys.readouterr()
    cfg = load_config(config)
    job = cfg.jobs["data"]

    def snap(step: int) -> None:
        (mount / f"f{step}.bin").write_bytes(os.urandom(300_000))
        zfs("snapshot", f"{data}@{step}")

    with Context(config=cfg, config_path=config) as ctx:
        for step in range(3):
            snap(step)
        assert not archive_job(ctx, "data", job).failed
        snap(3), snap(4)
        assert not archive_job(ctx, "data", job, force_full=True).failed
        snap(5)
        assert not archive_job(ctx, "data", job).failed
        snap(6)
        assert not archive_job(ctx, "data", job, force_full=True).failed
        catalog = ctx.catalog()
        streams = catalog.streams(dataset=data)
        assert [(s.kind, s.to_name) for s in streams] == [
            ("full", "0"), ("incremental", "2"), ("full", "4"), ("incremental", "5"),
            ("full", "6")]
        now = dt.datetime.now(dt.UTC)
        for s in streams:
            if s.kind == "full" and s.to_name in ("4", "6"):
                catalog.set_stream_state(s.id, "verified", now)
    return {"data": data, "store": store, "db": tmp_path / "state" / "catalog.sqlite",
            "survivor": streams[-1].id, "tmp": tmp_path}


def _copy(chains: dict, tag: str) -> tuple[Catalog, FileBackend, Path]:
    root = chains["tmp"] / f"store-{tag}"
    shutil.copytree(chains["store"], root)
    db = chains["tmp"] / f"catalog-{tag}.sqlite"
    shutil.copyfile(chains["db"], db)
    return Catalog(make_engine(f"sqlite:///{db}")), FileBackend("cold", root), root


def _prune(catalog, backend, chains, now):
    data = chains["data"]
    check = StoreCheck(backend, dataset_prefix("local", data),
                       lambda: catalog.bulk_volumes(host="local", below=data, store="cold"))
    return prune_dataset_chains(backend, catalog, data, catalog.streams(dataset=data),
                                KEEP_ONE, now, dry_run=False, check=check)


def test_a_crash_after_any_step_of_a_chain_prune_converges_on_rerun_without_losing_a_kept_snapshot(chains):
    """docs/reliability.md#r22-killed-during-prune-at-every-step: a crash after the k-th
    condemn/delete/row-delete, for every k: the catalog never references a deleted object, orphans
    exist only under a tombstone, and a rerun converges."""
    now = dt.datetime.now(dt.UTC)
    survivor = {chains["survivor"]}
    catalog, backend, root = _copy(chains, "count")
    counter = Steps()
    result = _prune(CrashingCatalog(catalog, counter), CrashingBackend(backend, counter), chains, now)
    assert result.outcome.error is None and len(result.outcome.deleted) == 4
    total = counter.done
    assert counter.log[0].startswith("condemn") and counter.log[-1].startswith("delete row")
    assert total > 10, counter.log
    keep_keys = store_keys(root)
    check_invariants(catalog, root, survivor)
    assert {s.id for s in catalog.streams()} == survivor

    for k in range(total + 1):
        catalog, backend, root = _copy(chains, str(k))
        steps = Steps(limit=k)
        try:
            _prune(CrashingCatalog(catalog, steps), CrashingBackend(backend, steps), chains, now)
            crashed = False
        except Crash:
            crashed = True
        assert crashed == (k < total), f"k={k}"
        check_invariants(catalog, root, survivor)
        rerun = _prune(catalog, backend, chains, now)
        assert rerun.outcome.error is None, f"k={k}: {rerun.outcome.error}"
        check_invariants(catalog, root, survivor)
        assert {s.id for s in catalog.streams()} == survivor, f"k={k}: not converged"
        assert store_keys(root) == keep_keys, f"k={k}: objects left behind"
        again = _prune(catalog, backend, chains, now)
        assert again.plan.unfinished == () and again.plan.to_delete == (), f"k={k}"
        catalog._engine.dispose()
