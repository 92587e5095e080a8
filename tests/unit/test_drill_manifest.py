"""A snapshot's file manifest (``drill.manifest``): what a walk records, the ``zbak-files/1``
lines and their end count, and the comparison a drill fails on (docs/drills.md#what-a-drill-checks).

The walks read real files in a temporary directory (the same code reads a snapshot's view).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os

import pytest

from zrepl_py.drill.manifest import SHOWN, Entry, compare, dump, load, walk
from zrepl_py.errors import DigestError


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "snap"
    (root / "dir" / "deeper").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 3_000_000)  # several read chunks
    (root / "dir" / "b.txt").write_text("b\n")
    (root / "dir" / "deeper" / "empty").write_bytes(b"")
    os.symlink("../a.bin", root / "dir" / "link")
    os.symlink("/nowhere", root / "dangling")
    os.mkfifo(root / "fifo")
    (root / os.fsdecode(b"caf\xe9")).write_bytes(b"latin-1 name")
    (root / ".zfs").mkdir()  # an OpenZFS snapdir made visible: not the dataset's data
    (root / ".zfs" / "x").write_text("x")
    os.chmod(root / "dir" / "b.txt", 0o640)
    return root


def test_a_walk_records_every_path_below_the_root_with_its_content_digest(tree):
    entries = {e.path: e for e in walk(str(tree))}
    assert sorted(entries) == sorted(["a.bin", "dir", "dir/b.txt", "dir/deeper",
                                      "dir/deeper/empty", "dir/link", "dangling", "fifo",
                                      os.fsdecode(b"caf\xe9")])
    big = entries["a.bin"]
    assert (big.kind, big.size, big.sha256) == (
        "file", 3_000_000, hashlib.sha256(b"a" * 3_000_000).hexdigest())
    assert entries["dir/b.txt"].mode == 0o640
    assert entries["dir/link"].kind == "link"  # never followed
    assert entries["dir/link"].sha256 == hashlib.sha256(b"../a.bin").hexdigest()
    assert entries["dangling"].size == len("/nowhere")
    assert entries["fifo"].kind == "other" and entries["dir"].kind == "dir"
    assert entries["dir/deeper/empty"].sha256 == hashlib.sha256(b"").hexdigest()


def test_a_walk_is_in_byte_order_of_the_path(tree):
    paths = [os.fsencode(e.path) for e in walk(str(tree))]
    assert paths == sorted(paths)


def test_the_lines_read_back_to_the_same_entries_names_that_are_not_utf8_included(tree):
    entries = list(walk(str(tree)))
    out = io.StringIO()
    assert dump(entries, "tank/data@s", out) == len(entries)
    text = out.getvalue()
    assert text.splitlines()[0] == '{"format": "zbak-files/1", "snapshot": "tank/data@s"}'
    assert load(text, "here") == entries


@pytest.mark.parametrize("cut, problem", [
    (lambda lines: lines[:-1], "cut manifest"),           # the end line lost
    (lambda lines: lines[:-2] + lines[-1:], "cut manifest"),  # an entry lost
    (lambda lines: lines[1:], "no zbak-files/1 manifest"),
    (lambda lines: ["zbak serve: refused: ..."], "no zbak-files/1 manifest"),
    (lambda lines: lines[:1] + ['{"path": "x"}'] + lines[1:], "malformed"),
    (lambda lines: lines[:1] + ["not json"] + lines[1:], "malformed"),
])
def test_output_that_is_not_a_whole_manifest_is_refused(tree, cut, problem):
    out = io.StringIO()
    dump(walk(str(tree)), "tank/data@s", out)
    text = "\n".join(cut(out.getvalue().splitlines())) + "\n"
    with pytest.raises(DigestError, match=problem):
        load(text, "zbak digest tank/data@s on backup")


def entry(path: str, **changed) -> Entry:
    base = Entry(path, "file", 0o644, 0, 0, 3, 1_700_000_000_000_000_000,
                 hashlib.sha256(path.encode()).hexdigest())
    return dataclasses.replace(base, **changed)


def test_the_same_entries_compare_the_same_and_count_the_files():
    source = [entry("a"), entry("d", kind="dir", size=0, sha256=""), entry("d/b")]
    found = compare(source, list(source))
    assert found.same and (found.compared, found.files, found.message()) == (3, 2, "")


def test_every_kind_of_difference_is_named_with_its_path():
    source = [entry("content"), entry("mode"), entry("owner"), entry("gone"), entry("time")]
    restored = [entry("content", sha256="0" * 64), entry("mode", mode=0o600),
                entry("owner", uid=1000, gid=1000), entry("time", mtime_ns=1),
                entry("new")]
    found = compare(source, restored)
    assert not found.same and found.count == 6
    assert found.differences == (
        "content: content (sha256)", "mode: mode", "owner: owner, group",
        "gone: missing from the restored copy", "time: mtime", "new: only in the restored copy")
    assert found.message().startswith("6 path(s) differ: content: content (sha256); mode: mode")


def test_a_long_list_of_differences_names_the_first_ones_and_counts_the_rest():
    source = [entry(f"f{n:03}") for n in range(SHOWN + 5)]
    found = compare(source, [])
    assert found.count == SHOWN + 5 and len(found.differences) == SHOWN
    assert found.message().endswith("; 5 more")
