"""Chain prune survives a SIGKILL after every step: real chains written by ``zbak archive``
from a zfs-fuse pool to a ``file://`` store, then ``zbak prune`` (a process under
``support/crash_runner.py``) killed after its k-th store or catalog write, for every k, and
run again (docs/design.md#chain-prune-order,
docs/reliability.md#r22-killed-during-prune-at-every-step).

A step is a store ``put`` or ``delete`` or a catalog ``condemn_streams``/``delete_stream``
(and the other writes the runner counts): the kill is a real ``SIGKILL`` right after the
step is durable, with no ``finally`` and no exception handler run, as a power cut or the OOM
killer leaves it. Each k starts from a copy of the same store and state directory."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from support.cli import faulty_zbak, file_archive_config, run_zbak, zfs

from zrepl_py.catalog.db import make_engine
from zrepl_py.catalog.repository import Catalog
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import EXPORT_PREFIX, MANIFEST

pytestmark = [pytest.mark.zfs, pytest.mark.slow]


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


def _zbak_ok(config: Path, *args: str) -> str:
    ran = run_zbak("--config", str(config), *args)
    assert ran.status == ExitStatus.OK, f"zbak {' '.join(args)}: {ran.out}{ran.err}"
    return ran.out


@pytest.fixture
def chains(zpool, tmp_path):
    """Three chains of DATA in a file:// store, written by ``zbak archive``: A (full @0,
    -I @0->@2), B (full @4, -I @4->@5) and C (full @6), all verified by ``zbak audit
    --deep``; ``keep_chains = 1`` releases A and B. Returns what ``_copy`` copies."""
    data = f"{zpool.name}/data"
    zfs("create", data)
    mount = Path(zfs("get", "-Hp", "-o", "value", "mountpoint", data).strip())
    base = tmp_path / "pristine"
    base.mkdir()
    config, store = file_archive_config(base, data, volume_size="256KiB",
                                        archive="keep_chains = 1")
    _zbak_ok(config, "init", "--no-checks")

    def snap(step: int) -> None:
        (mount / f"f{step}.bin").write_bytes(os.urandom(300_000))
        zfs("snapshot", f"{data}@{step}")

    for step in range(3):
        snap(step)
    _zbak_ok(config, "archive")
    snap(3), snap(4)
    _zbak_ok(config, "archive", "--full")
    snap(5)
    _zbak_ok(config, "archive")
    snap(6)
    _zbak_ok(config, "archive", "--full")
    _zbak_ok(config, "audit", "--deep")
    catalog, _ = _open(base)
    streams = catalog.streams(dataset=data)
    assert [(s.kind, s.to_name, s.state) for s in streams] == [
        ("full", "0", "verified"), ("incremental", "2", "verified"), ("full", "4", "verified"),
        ("incremental", "5", "verified"), ("full", "6", "verified")]
    catalog._engine.dispose()
    return {"data": data, "base": base, "survivor": streams[-1].id, "tmp": tmp_path}


def _copy(chains: dict, tag: str) -> Path:
    """A copy of the pristine store and state directory under ``tmp/TAG``, with a config
    naming them; returns the config."""
    base = chains["tmp"] / tag
    shutil.copytree(chains["base"] / "store", base / "store")
    shutil.copytree(chains["base"] / "state", base / "state")
    config = base / "zbak.toml"
    text = (chains["base"] / "zbak.toml").read_text()
    config.write_text(text.replace(str(chains["base"]), str(base)))
    return config


def _open(base: Path) -> tuple[Catalog, Path]:
    return Catalog(make_engine(f"sqlite:///{base / 'state' / 'catalog.sqlite'}")), base / "store"


def _prune(config: Path, *, kill_after: int | None = None) -> tuple[int, list[str]]:
    """``zbak prune`` under the crash runner; its exit status and the steps it completed."""
    steps = config.parent / f"steps-{kill_after}"
    env = {"ZBAK_FAULT_STEPS_FILE": str(steps), "ZBAK_LOG_LEVEL": "WARNING"}
    if kill_after is not None:
        env["ZBAK_FAULT_KILL_AFTER"] = str(kill_after)
    ran = faulty_zbak("--config", str(config), "prune", env=env)
    assert ran.status in (ExitStatus.OK, -signal.SIGKILL), ran
    done = steps.read_text().splitlines() if steps.exists() else []
    return int(ran.status), [line.split("\t", 1)[1] for line in done]


def test_a_kill_after_any_step_of_a_chain_prune_converges_on_rerun_without_losing_a_kept_snapshot(chains):
    """docs/reliability.md#r22-killed-during-prune-at-every-step: ``zbak prune`` SIGKILLed after
    the k-th condemn/delete/row-delete, for every k: the catalog never references a deleted
    object, orphans exist only under a tombstone, and a plain rerun converges to the same store
    and catalog as an unkilled run."""
    survivor = {chains["survivor"]}
    config = _copy(chains, "count")
    status, log = _prune(config)
    assert status == ExitStatus.OK
    total = len(log)
    assert log[0].startswith("catalog.condemn_streams"), log
    assert any(step.startswith("delete") for step in log), log
    assert total > 10, log
    catalog, root = _open(config.parent)
    keep_keys = store_keys(root)
    check_invariants(catalog, root, survivor)
    assert {s.id for s in catalog.streams()} == survivor
    catalog._engine.dispose()

    for k in range(1, total + 1):
        config = _copy(chains, f"k{k}")
        status, done = _prune(config, kill_after=k)
        assert status == -signal.SIGKILL and len(done) == k, (k, status, done)
        catalog, root = _open(config.parent)
        check_invariants(catalog, root, survivor)
        catalog._engine.dispose()
        ran = run_zbak("--config", str(config), "prune")
        assert ran.status == ExitStatus.OK, f"k={k} ({done[-1]}): {ran.out}{ran.err}"
        catalog, root = _open(config.parent)
        check_invariants(catalog, root, survivor)
        assert {s.id for s in catalog.streams()} == survivor, f"k={k}: not converged"
        assert store_keys(root) == keep_keys, f"k={k}: objects left behind"
        catalog._engine.dispose()
