"""``zbak catalog rebuild STORE``: chains archived into a file:// store by ``zbak archive``, the
catalog lost, a fresh one rebuilt from the manifests equals the original (on SQLite and
PostgreSQL), and an audit of it is clean."""

from __future__ import annotations

import datetime as dt
import json
import os
import textwrap
import uuid
from pathlib import Path

import pytest
from support.cli import run_zbak, zfs

from zrepl_py.catalog.rebuild import chain_order, pick_parent
from zrepl_py.catalog.rows import StreamRow
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest

T0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


def config_file(path: Path, state: Path, url: str, dataset: str, store: Path) -> Path:
    path.write_text(textwrap.dedent(f"""
        state_dir = "{state}"
        [catalog]
        url = "{url}"
        [stores.cold]
        url = "file://{store}"
        [jobs.data]
        dataset = "{dataset}"
        [jobs.data.archive]
        store = "cold"
    """))
    return path


def cli(capsys, config: Path, *args: str):
    return run_zbak("--config", str(config), *args)


def ok(capsys, config: Path, *args: str) -> str:
    status, out, err = cli(capsys, config, *args)
    assert status == ExitStatus.OK, out + err
    return out


def snapshot_steps(dataset: str, steps) -> None:
    mount = Path(zfs("get", "-Hp", "-o", "value", "mountpoint", dataset).strip())
    for step in steps:
        (mount / f"f{step}").write_bytes(os.urandom(100_000))
        zfs("snapshot", f"{dataset}@{step}")


def catalog_of(config: Path):
    from zrepl_py.catalog.db import make_engine
    from zrepl_py.catalog.repository import Catalog
    from zrepl_py.config.loading import load_config

    return Catalog(make_engine(load_config(config).catalog_url))


def picture(catalog) -> dict:
    """The catalog's streams, volumes and carried snapshots keyed by object prefix (ids and
    states left out: rebuilt streams are unverified; times to the manifest's second)."""
    streams = catalog.bulk_streams()
    prefix = {s.id: s.object_prefix for s in streams}
    volumes = catalog.bulk_volumes()
    carried = catalog.bulk_carried()
    return {
        s.object_prefix: (
            s.host, s.dataset, s.store, s.kind, prefix.get(s.parent_id), s.from_guid, s.to_guid,
            s.from_name, s.to_name, s.to_createtxg, s.raw_bytes, s.stored_bytes,
            s.storage_class, s.compression, s.created_at.replace(microsecond=0),
            [(v.index, v.key, v.raw_bytes, v.stored_bytes, v.sha256) for v in volumes[s.id]],
            [(c.name, c.guid, c.createtxg) for c in carried.get(s.id, [])],
        )
        for s in streams
    }


@pytest.fixture
def fresh_url(catalog_url, request, tmp_path):
    """A second, empty database on the same backend as ``catalog_url``."""
    if catalog_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'rebuilt' / 'catalog.db'}"
        return
    cluster = request.getfixturevalue("pg_cluster")
    name = f"zbak_rebuilt_{uuid.uuid4().hex[:10]}"
    with cluster.admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield cluster.url(name)
    with cluster.admin() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.zfs
def test_a_catalog_rebuilt_from_the_manifests_equals_the_original_and_audits_clean(
        zpool, tmp_path, capsys, catalog_url, fresh_url):
    data = f"{zpool.name}/data"
    zfs("create", data)
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    original = config_file(tmp_path / "a.toml", tmp_path / "state-a", catalog_url, data, store)
    assert cli(capsys, original, "init", "--no-checks")[0] == ExitStatus.OK
    snapshot_steps(data, range(5))
    ok(capsys, original, "archive")          # full @0, -I @0..@4
    ok(capsys, original, "audit")            # the archive's runs and heads, on both backends
    catalog = catalog_of(original)
    tip = max(catalog.streams(dataset=data), key=lambda s: s.to_createtxg)
    catalog.set_stream_state(tip.id, "bad", dt.datetime.now(dt.UTC), reason="test: marked by hand")
    status, out, err = cli(capsys, original, "audit", "--json")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    lag = [f for f in json.loads(out)["findings"] if "older than the last archive run" in f["problem"]]
    assert [f["severity"] for f in lag] == ["warning"] and f"{data}@4" in lag[0]["problem"]
    ok(capsys, original, "archive")          # new chain: full @4
    snapshot_steps(data, range(5, 7))
    ok(capsys, original, "archive")          # -I @4..@6 on full @4
    before = picture(catalog)
    assert len(before) == 4

    rebuilt = config_file(tmp_path / "b.toml", tmp_path / "state-b", fresh_url, data, store)
    assert cli(capsys, rebuilt, "init", "--no-checks")[0] == ExitStatus.OK
    status, out, err = cli(capsys, rebuilt, "catalog", "rebuild", "cold", "--json")
    assert status == ExitStatus.OK, out + err
    doc = json.loads(out)
    assert (doc["manifests"], len(doc["added"]), doc["skipped"]) == (4, 4, [])
    assert picture(catalog_of(rebuilt)) == before
    assert {s.state for s in catalog_of(rebuilt).bulk_streams()} == {"uploaded"}

    status, out, err = cli(capsys, rebuilt, "audit", "--deep", "--json")
    assert status == ExitStatus.OK, out + err
    assert json.loads(out)["findings"] == []

    # a second rebuild is refused; --merge adds only what the catalog lacks
    status, out, err = cli(capsys, rebuilt, "catalog", "rebuild", "cold")
    assert status == ExitStatus.USAGE and "--merge" in err
    snapshot_steps(data, range(7, 8))
    ok(capsys, original, "archive")
    status, out, err = cli(capsys, rebuilt, "catalog", "rebuild", "cold", "--merge", "--json")
    assert status == ExitStatus.OK, out + err
    doc = json.loads(out)
    assert (len(doc["added"]), len(doc["present"])) == (1, 4)
    assert picture(catalog_of(rebuilt)) == picture(catalog)


def test_rebuild_of_an_unknown_store_is_a_usage_error(tmp_path, capsys):
    config = config_file(tmp_path / "c.toml", tmp_path / "state",
                         f"sqlite:///{tmp_path / 'c.db'}", "tank/data", tmp_path / "store")
    assert cli(capsys, config, "init", "--no-checks")[0] == ExitStatus.OK
    status, _, err = cli(capsys, config, "catalog", "rebuild", "warm")
    assert status == ExitStatus.USAGE and "warm" in err and "cold" in err


def row(id: int, kind: str, created: dt.datetime, state: str = "uploaded") -> StreamRow:
    return StreamRow(id, "local", "tank/a", "cold", kind, None if kind == "full" else 1,
                     None if kind == "full" else 5, 9, None, "s9", 90, 1, 1, f"p{id}/",
                     "STANDARD", "zstd", state, created, created, None)


def manifest(kind: str, to: int, created: dt.datetime, frm: int | None = None) -> Manifest:
    snap = CarriedSnapshot(f"s{to}", to, 10 * to)
    return Manifest("local", "tank/a", kind, None if frm is None else CarriedSnapshot(f"s{frm}", frm, 10 * frm),
                    snap, (snap,), (), "zstd", 3, (), "STANDARD", "zbak", created)


def test_an_incremental_applies_on_the_stream_ending_at_its_base_created_last_before_it():
    tip = row(2, "incremental", T0)
    newer_full = row(3, "full", T0 + dt.timedelta(hours=1))
    later = row(4, "full", T0 + dt.timedelta(hours=5))
    child = manifest("incremental", 12, T0 + dt.timedelta(hours=2), frm=9)
    assert pick_parent(child, [tip, newer_full, later]).id == 3
    assert pick_parent(child, [tip]).id == 2
    assert pick_parent(child, [row(2, "incremental", T0, state="bad")]) is None
    same_second = row(5, "incremental", T0 + dt.timedelta(hours=1))
    assert pick_parent(child, [same_second, newer_full]).id == 3


def test_manifests_are_added_parents_first():
    items = [("c", manifest("incremental", 20, T0, frm=12)), ("a", manifest("full", 9, T0)),
             ("b", manifest("incremental", 12, T0, frm=9)), ("d", manifest("full", 12, T0))]
    assert [k for k, _ in chain_order(items)] == ["a", "d", "b", "c"]
