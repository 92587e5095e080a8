"""The archive run's index of its tree listing (``archive.job._Tree.stream_dirs``): the
stream folders directly under one dataset, never a child dataset's (their leftovers are
the child's own to clean) nor a folder that is no stream."""

from __future__ import annotations

import datetime as dt

from zrepl_py.archive.job import _leaves, _Tree
from zrepl_py.objects.layout import stream_prefix


def test_the_stream_folders_of_a_dataset_are_its_own_and_not_its_childrens():
    parent = stream_prefix("h", "tank/data", to_createtxg=5, to_guid=0xA, from_guid=None)
    incr = stream_prefix("h", "tank/data", to_createtxg=9, to_guid=0xB, from_guid=0xA)
    child = stream_prefix("h", "tank/data/child", to_createtxg=7, to_guid=0xC, from_guid=None)
    keys = [parent + "vol-000000.zst", parent + "manifest.json", incr + "progress.json",
            child + "vol-000000.zst", "h/tank/data/notes/readme.txt"]
    listing = {key: None for key in keys}
    tree = _Tree({}, {}, listing, _leaves(listing), dt.datetime.now(dt.UTC))
    assert tree.stream_dirs("h/tank/data/") == {
        parent: {"vol-000000.zst", "manifest.json"}, incr: {"progress.json"}}
    assert tree.stream_dirs("h/tank/data/child/") == {child: {"vol-000000.zst"}}
    assert tree.stream_dirs("h/tank/other/") == {}
