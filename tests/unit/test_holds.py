"""Which zbak holds are current and which are stale (``pruning.holds.classify``, pure;
docs/reliability.md#r23-interrupted-initial-replication-leaves-no-unbounded-holds)."""

from __future__ import annotations

import datetime as dt

import pytest

from zrepl_py.catalog.rows import CursorRow
from zrepl_py.config.loading import parse_config
from zrepl_py.pruning.holds import CURRENT, FOREIGN, STALE, UNKNOWN, Held, classify
from zrepl_py.zfs.client import parse_holds_output
from zrepl_py.zfs.model import ListingError

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
DS = "tank/data"
TAG_B = "zbak:j:b:pool/x"


def jobs(targets=("b:pool/x",), extra=None):
    data = {"jobs": {"j": {"dataset": DS, "replicate": {"targets": list(targets)}}},
            "hosts": {"b": {"address": "127.0.0.1"}}}
    data["jobs"].update(extra or {})
    return parse_config(data, "x.toml").jobs


def cursor(job, target, short):
    return CursorRow(job=job, target=target, source_host="local", source_dataset=DS,
                     target_location="pool/x", method="zfs", snapshot_name=short, guid=1,
                     createtxg=1, updated_at=T0)


def rows(held, configured, cursors):
    found = classify("j", held, "local", configured, cursors, [], {})
    return {(r.snapshot.split("@")[1], r.tag): r.status for r in found}


def test_the_cursor_snapshot_keeps_its_hold_and_an_older_one_is_stale():
    """docs/reliability.md#r23-interrupted-initial-replication-leaves-no-unbounded-holds: the
    current base's hold is never stale; a hold of the same owner on another snapshot is."""
    held = [Held(f"{DS}@a", 1, 1, (TAG_B,)), Held(f"{DS}@b", 2, 1, (TAG_B,))]
    assert rows(held, jobs(), [cursor("j", "b:pool/x", "b")]) == {
        ("a", TAG_B): STALE, ("b", TAG_B): CURRENT}


def test_holds_of_a_removed_target_or_job_are_stale_and_other_tags_are_foreign():
    """docs/reliability.md#r23-interrupted-initial-replication-leaves-no-unbounded-holds: the owner
    left the config -> stale; another configured job's hold or a non-zbak tag -> foreign (never
    released by this job)."""
    held = [Held(f"{DS}@b", 2, 4, (TAG_B, "zbak:gone:b:pool/y", "zbak:k:b:pool/z", "admin"))]
    other = {"k": {"dataset": DS}}
    found = rows(held, jobs(targets=("b:pool/new",), extra=other), [cursor("j", "b:pool/x", "b")])
    assert found == {("b", TAG_B): STALE, ("b", "zbak:gone:b:pool/y"): STALE,
                     ("b", "zbak:k:b:pool/z"): FOREIGN, ("b", "admin"): FOREIGN}


def test_without_a_hold_listing_candidates_are_named_and_the_rest_is_unknown():
    """docs/reliability.md#r23-interrupted-initial-replication-leaves-no-unbounded-holds on zfs-fuse
    (no ``zfs holds``): the current base's tag is current, the job's tag on another snapshot is a
    stale candidate, and holds no name accounts for are reported as unknown, never released."""
    held = [Held(f"{DS}@a", 1, 1, None), Held(f"{DS}@b", 2, 3, None)]
    found = classify("j", held, "local", jobs(), [cursor("j", "b:pool/x", "b")], [], {})
    by = {(r.snapshot.split("@")[1], r.tag): (r.status, r.listed) for r in found}
    assert by[("a", TAG_B)] == (STALE, False)
    assert by[("b", TAG_B)] == (CURRENT, False)
    assert by[("b", "?")] == (UNKNOWN, False)
    assert by[("a", "?")] == (UNKNOWN, False)  # a candidate may or may not be its one hold


def test_a_tag_zbak_cannot_have_made_is_foreign_even_when_it_starts_like_zbaks():
    """Another program's ``zbak:go<tab>ne:...`` (no job can be named so) is never released:
    judged stale, releasing it stopped ``release-stale`` with an invalid-name error."""
    tags = ("zbak:go\tne:b:pool/y", "zbak:gone:b:pool/y\n", "zbak:-x:b:pool/y")
    held = [Held(f"{DS}@b", 2, 3, tags)]
    assert rows(held, jobs(), []) == {("b", tag): FOREIGN for tag in tags}


def test_zfs_holds_records_are_read_whole_whatever_their_tags_hold():
    """``zfs holds -Hp`` as OpenZFS 2.3 prints foreign tags with a tab, a trailing tab and a
    newline (seen in the guest); several snapshots in one listing."""
    text = ("p/d@a\tzbak:j:vm:x\t1795847954\np/d@a\tfor\teign\t1795847954\n"
            "p/d@ab\tnew\nline\t1795847955\np/d@ab\ttail\t\t1795847955\n")
    assert parse_holds_output(text, ["p/d@a", "p/d@ab", "p/d@c"]) == {
        "p/d@a": ["zbak:j:vm:x", "for\teign"], "p/d@ab": ["new\nline", "tail\t"]}
    assert parse_holds_output("", ["p/d@a"]) == {}
    for bad in ("p/d@a\tx\n", "p/d@z\tx\t1\n", "p/d@a\tx\t1"):
        with pytest.raises(ListingError):
            parse_holds_output(bad, ["p/d@a"])
