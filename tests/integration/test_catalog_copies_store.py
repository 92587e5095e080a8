"""Catalog exports and manifest copies against real stores (``file://`` and moto's S3 server)
and real ``zbak archive``/``prune``/``restore``/``catalog rebuild`` runs on zfs-fuse
(docs/reliability.md#r25-catalog-rollback-detection and
docs/reliability.md#r26-catalog-metadata-copy-with-checksum, levels C and E)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from support.cli import Zbak, prop, zfs

from zrepl_py.catalog.export import MARKS_DIR, load_export
from zrepl_py.config.loading import load_config
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import EXPORT_PREFIX, MANIFEST, copy_key
from zrepl_py.stores.registry import open_store

pytestmark = pytest.mark.zfs


def snap(dataset: str, name: str) -> None:
    mount = Path(prop(dataset, "mountpoint"))
    (mount / f"{name}.bin").write_bytes(os.urandom(150_000))
    zfs("snapshot", f"{dataset}@{name}")


@pytest.fixture(params=["file", "s3"])
def archived(request, zpool, tmp_path, capsys):
    """``POOL/data`` with @0..@2 archived (full @0, -I @0 -> @2) to store ``cold``, the
    store's kind the parameter. Yields (run, data, backend, state dir)."""
    if request.param == "file":
        (tmp_path / "store").mkdir()
        store_toml = f'url = "file://{tmp_path / "store"}"'
    else:
        server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")
        store_toml = (f'url = "s3://{bucket}/zbak"\nendpoint = "{server.endpoint_url}"\n'
                      'region = "us-east-1"')
    data = f"{zpool.name}/data"
    zfs("create", data)
    for name in "012":
        snap(data, name)
    config = tmp_path / "zbak.toml"
    config.write_text(textwrap.dedent(f"""
        state_dir = "{tmp_path / 'state'}"
        [stores.cold]
        {textwrap.indent(store_toml, "        ").strip()}
        [jobs.data]
        dataset = "{data}"
        [jobs.data.archive]
        store = "cold"
        keep_chains = 1
    """))
    run = Zbak(config, capsys)
    assert run("init", "--no-checks")[0] == ExitStatus.OK
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    backend = open_store("cold", load_config(config).stores["cold"])
    yield run, data, backend, tmp_path / "state"
    backend.close()


def get(backend, key: str) -> bytes:
    return b"".join(backend.get(key))


def put(backend, key: str, data: bytes) -> None:
    backend.put(key, [data], storage_class="STANDARD")


def the_export(backend) -> str:
    keys = sorted({i.key.removesuffix(".copy") for i in backend.list(EXPORT_PREFIX)})
    assert len(keys) == 1, keys
    return keys[0]


def keys_of(backend) -> set[str]:
    return {i.key for i in backend.list("")}


def test_an_archive_writes_an_export_and_a_copy_of_every_manifest(archived):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: after a run the store holds the
    export (primary and copy, healthy, listing both streams) and every manifest twice, byte for
    byte."""
    run, data, backend, state = archived
    key = the_export(backend)
    loaded = load_export(backend, key)
    assert loaded.healthy and loaded.export.generation == 1
    assert len(loaded.export.streams) == 2
    manifests = [k for k in keys_of(backend) if k.endswith("/" + MANIFEST)]
    assert len(manifests) == 2
    for m in manifests:
        assert get(backend, m) == get(backend, copy_key(m))
    assert (state / MARKS_DIR / "cold" / key).is_file()
    status, out, err = run("audit")
    assert status == ExitStatus.OK, out + err


def test_an_older_export_put_back_makes_archive_prune_and_restore_refuse_until_the_mark_goes(
        archived, zpool):
    """docs/reliability.md#r25-catalog-rollback-detection: the store rolled back to the export of an
    earlier run -> the next archive, prune and restore exit 1 with CatalogReplay's message and write
    nothing."""
    run, data, backend, state = archived
    key = the_export(backend)
    old = get(backend, key), get(backend, copy_key(key))
    snap(data, "3")
    assert run("archive")[0] == ExitStatus.OK
    assert load_export(backend, key).export.generation == 2
    put(backend, key, old[0])
    put(backend, copy_key(key), old[1])
    before = keys_of(backend)
    snap(data, "4")
    status, out, err = run("archive")
    assert status == ExitStatus.FAILED, out + err
    assert "has generation 1, but this machine wrote generation 2" in err
    assert keys_of(backend) == before
    status, out, err = run("prune")
    assert status == ExitStatus.FAILED and "has generation 1" in out + err
    status, out, err = run("restore", data, "--to", "@2", "--into", f"{zpool.name}/r",
                           "--from", "cold", "--yes")
    assert status == ExitStatus.FAILED and "has generation 1" in out + err
    assert keys_of(backend) == before
    # The admin checked the store and accepts it: the mark file named in the message goes.
    mark = state / MARKS_DIR / "cold" / key
    assert str(mark) in err
    mark.unlink()
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    assert load_export(backend, key).export.generation == 2


def test_a_store_emptied_of_its_export_is_refused_as_replaced(archived):
    """docs/reliability.md#r25-catalog-rollback-detection: the export gone while this machine wrote
    one -> CatalogReplay."""
    run, data, backend, state = archived
    key = the_export(backend)
    backend.delete(key)
    backend.delete(copy_key(key))
    snap(data, "3")
    status, out, err = run("archive")
    assert status == ExitStatus.FAILED and "is missing" in err, out + err


def test_a_damaged_export_primary_is_read_from_its_copy_and_both_damaged_stop_the_run(archived):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: a damaged primary export -> the
    copy is used and the run repairs it; both damaged -> the run fails loudly naming both
    objects."""
    run, data, backend, state = archived
    key = the_export(backend)
    put(backend, key, get(backend, key).replace(b'"generation": 1', b'"generation": 9'))
    snap(data, "3")
    status, out, err = run("archive")
    assert status == ExitStatus.OK, out + err
    loaded = load_export(backend, key)
    assert loaded.healthy and loaded.export.generation == 2
    put(backend, key, b"{}")
    put(backend, copy_key(key), b"not json")
    status, out, err = run("archive")
    assert status == ExitStatus.FAILED
    assert key in err and copy_key(key) in err and "Nothing was done" in err


def test_a_damaged_manifest_primary_is_read_from_its_copy_by_audit_rebuild_and_restore(
        archived, zpool):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: one manifest's primary changed
    (valid JSON, wrong value) -> audit warns and uses the copy; after the catalog is lost, ``catalog
    rebuild`` rebuilds every stream from the copy and the restore from the store gives @2 back; with
    the copy damaged too the stream is skipped and reported."""
    run, data, backend, state = archived
    incr = next(k for k in keys_of(backend) if "-incr-" in k and k.endswith("/" + MANIFEST))
    good = get(backend, incr)
    put(backend, incr, good.replace(b'"compression_level": 3', b'"compression_level": 4'))
    status, out, err = run("audit", "--json")
    assert status == ExitStatus.AUDIT_FINDINGS, out + err
    finding, = json.loads(out)["findings"]
    assert finding["severity"] == "warning" and "its copy is used" in finding["problem"]

    catalog = Path(load_config(run.config).catalog_url.removeprefix("sqlite:///"))
    catalog.unlink()
    assert run("init", "--no-checks")[0] == ExitStatus.OK
    status, out, err = run("catalog", "rebuild", "cold", "--json")
    assert status == ExitStatus.OK, out + err
    doc = json.loads(out)
    assert (doc["manifests"], len(doc["added"]), doc["skipped"]) == (2, 2, [])
    into = f"{zpool.name}/back"
    status, out, err = run("restore", data, "--to", "@2", "--into", into, "--from", "cold",
                           "--yes")
    assert status == ExitStatus.OK, out + err
    assert prop(f"{into}@2", "guid") == prop(f"{data}@2", "guid")

    put(backend, copy_key(incr), good[:-40])
    catalog.unlink()
    assert run("init", "--no-checks")[0] == ExitStatus.OK
    status, out, err = run("catalog", "rebuild", "cold", "--json")
    assert status == ExitStatus.FAILED
    skipped, = json.loads(out)["skipped"]
    assert skipped["key"] == incr and copy_key(incr) in skipped["why"]


def test_prune_deletes_manifest_copies_with_their_stream_and_rewrites_the_export(archived):
    """docs/reliability.md#r26-catalog-metadata-copy-with-checksum: a pruned chain leaves no
    ``.copy`` behind; the export follows."""
    run, data, backend, state = archived
    old = tuple(k[: -len(MANIFEST)] for k in keys_of(backend) if k.endswith("/" + MANIFEST))
    assert len(old) == 2
    snap(data, "3")
    assert run("archive", "--full")[0] == ExitStatus.OK
    assert run("audit", "--deep")[0] == ExitStatus.OK  # the newer full must be verified
    status, out, err = run("prune")
    assert status == ExitStatus.OK, out + err
    left = keys_of(backend)
    assert not [k for k in left if k.startswith(old)], left
    manifests = [k for k in left if k.endswith("/" + MANIFEST)]
    assert len(manifests) == 1 and copy_key(manifests[0]) in left
    export = load_export(backend, the_export(backend))
    assert export.healthy
    assert [r["prefix"] + MANIFEST for r in export.export.streams] == manifests
