"""Generations of a catalog export (docs/decisions.md#write-once-catalog-exports): the keys,
the next number, which generation a reader takes and which versions prune may delete.
Pure rules on plain data; the reader on a ``file://`` store in a temporary directory."""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.catalog.export import CatalogExport, read_exports
from zrepl_py.objects.checked import put_with_copy
from zrepl_py.objects.generations import (
    candidates,
    job_generations,
    next_generation,
    stale_versions,
)
from zrepl_py.objects.layout import copy_key, export_key, generation_key, parse_export_key
from zrepl_py.stores.base import ObjectInfo, Version
from zrepl_py.stores.file import FileBackend

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
SINGLE = export_key("node1", "data")


def gen(n: int) -> str:
    return generation_key(SINGLE, n)


def version(key: str, version_id: str, *, marker: bool = False) -> Version:
    return Version(ObjectInfo(key, 0 if marker else 10, "STANDARD", T0), version_id, False,
                   marker)


def test_generation_keys_name_their_export_job_and_number():
    assert gen(7) == "_zbak/catalog/node1/data/G0000000007.json"
    assert parse_export_key(gen(7)) == (SINGLE, "data", 7)
    assert parse_export_key(copy_key(gen(7))) == (SINGLE, "data", 7)
    assert parse_export_key(SINGLE) == (SINGLE, "data", None)
    assert parse_export_key(copy_key(SINGLE)) == (SINGLE, "data", None)
    assert parse_export_key(export_key("n", "a.json")) == (export_key("n", "a.json"), "a.json",
                                                           None)
    for other in ("local/tank/data/x.json", "_zbak/catalog/node1/data/G7.json",
                  "_zbak/catalog/node1/data/G0000000007.json.tmp", "_zbak/catalog/data.json"):
        assert parse_export_key(other) is None, other
    with pytest.raises(ValueError):
        generation_key(SINGLE, 0)


def test_the_next_generation_is_above_every_key_ever_written_and_the_mark():
    assert next_generation([], 0) == 1
    assert next_generation([gen(3), copy_key(gen(9)), SINGLE, "local/x"], 4) == 10
    assert next_generation([gen(3)], 12) == 13


def test_a_reader_tries_the_generations_newest_first():
    found = candidates([gen(2), copy_key(gen(10)), gen(9), copy_key(gen(2)), SINGLE,
                        generation_key(export_key("node2", "data"), 1), "local/x"])
    assert found[SINGLE].single == SINGLE
    assert found[SINGLE].generations == [gen(10), gen(9), gen(2)]
    other = found[export_key("node2", "data")]
    assert other.single is None and other.generations == [
        generation_key(export_key("node2", "data"), 1)]


def test_prune_deletes_older_generations_never_the_newest_nor_the_marks():
    listed = [version(SINGLE, "s1"), version(gen(1), "a"), version(copy_key(gen(1)), "b"),
              version(gen(2), "m", marker=True), version(gen(2), "c"),
              version(gen(3), "d"), version(copy_key(gen(3)), "e"), version(gen(4), "f")]
    stale = stale_versions(listed, {gen(3), copy_key(gen(3))})
    assert [v.version_id for v in stale] == ["s1", "a", "b", "m", "c"]
    # no generation key at all: the single key is the export, nothing goes
    assert stale_versions([version(SINGLE, "s1")], set()) == []


def test_audit_checks_the_generation_keys_of_its_job_on_every_machine():
    theirs = generation_key(export_key("node2", "data"), 1)
    listed = [version(SINGLE, "s"), version(gen(1), "a"), version(theirs, "b"),
              version(generation_key(export_key("node1", "other"), 1), "c")]
    assert [v.version_id for v in job_generations(listed, "data")] == ["a", "b"]


def export(generation: int, prefixes: list[str]) -> bytes:
    rows = tuple({"prefix": p, "host": "local", "dataset": "tank/d", "kind": "full",
                  "from_guid": None, "to_guid": "1", "to_name": "s", "to_createtxg": 1,
                  "state": "uploaded", "raw_bytes": 1, "stored_bytes": 1, "verified_at": None}
                 for p in prefixes)
    return CatalogExport(generation, T0, "node1", "data", "cold", "zbak test", rows).to_json()


def test_read_exports_takes_the_newest_generation_that_reads(tmp_path):
    """The single key (generation 2, left from before) loses to generation 4; a damaged
    generation 5 is reported and the next older one read."""
    (tmp_path / "store").mkdir()
    store = FileBackend("cold", tmp_path / "store")
    put_with_copy(store, SINGLE, export(2, ["a/"]))
    put_with_copy(store, gen(3), export(3, ["a/", "b/"]))
    put_with_copy(store, gen(4), export(4, ["a/", "b/", "c/"]))
    put_with_copy(store, gen(5), b"garbage")
    found, bad = read_exports(store)
    assert [(key, e.generation) for key, e in found] == [(gen(4), 4)]
    assert [key for key, _ in bad] == [gen(5)]
    # a single key newer than every generation (object_lock turned off later) wins
    put_with_copy(store, SINGLE, export(6, ["a/"]))
    assert [(key, e.generation) for key, e in read_exports(store)[0]] == [(SINGLE, 6)]
    store.close()
