"""The re-check's pure comparisons (pruning/recheck.py): what the store's metadata or a re-read
shows against the catalog's volume row, table-driven."""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.catalog.rows import VolumeRow
from zrepl_py.pruning.recheck import head_problem, read_problem
from zrepl_py.stores.base import ObjectInfo

SHA, OTHER = "a" * 64, "b" * 64
VOLUME = VolumeRow(id=1, stream_id=3, index=0, key="k", raw_bytes=200, stored_bytes=100,
                   sha256=SHA)
T = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize("size, sha256, expected", [
    (100, None, None),
    (100, SHA, None),
    (99, None, "the store has 99 bytes, the catalog says 100"),
    (99, OTHER, "the store has 99 bytes, the catalog says 100"),
    (100, OTHER, "the store's checksum is sha256 bbbbbbbbbbbbbbbb..., the catalog says"
                 " aaaaaaaaaaaaaaaa..."),
], ids=["size matches, no stored checksum", "both match", "resized", "resized and changed",
        "same size, stored checksum differs"])
def test_head_problem_compares_the_size_and_any_stored_checksum(size, sha256, expected):
    assert head_problem(VOLUME, ObjectInfo("k", size, "STANDARD", T, sha256=sha256)) == expected


@pytest.mark.parametrize("size, sha256, bad", [
    (100, SHA, False), (100, OTHER, True), (101, SHA, True)])
def test_read_problem_needs_both_the_length_and_the_sha256_to_match(size, sha256, bad):
    problem = read_problem(VOLUME, size, sha256)
    assert (problem is not None) == bad
    if bad:
        assert problem.startswith(f"re-read {size} bytes") and "the catalog says 100" in problem
