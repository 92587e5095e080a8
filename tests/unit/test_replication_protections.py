"""Source prune protections from replica cursors: bases and not-yet-replicated snapshots survive."""

from __future__ import annotations

import datetime as dt

from zrepl_py.catalog.rows import CursorRow
from zrepl_py.config.loading import parse_config
from zrepl_py.pruning.source import plan_source_prune, replication_protections
from zrepl_py.snapshots.inventory import Inventory
from zrepl_py.zfs.model import build_tree
from zrepl_py.zfs.names import DatasetName

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
ROOT = DatasetName("tank/data")


def tree(shorts):
    rows = [("tank/data", {"type": "filesystem", "guid": "1", "createtxg": "1", "creation": "0",
                           "userrefs": "-", "origin": "-"})]
    for i, short in enumerate(shorts, start=2):
        rows.append((f"tank/data@{short}", {"type": "snapshot", "guid": str(100 + i),
                                            "createtxg": str(i), "creation": str(1_790_000_000 + i),
                                            "userrefs": "0", "origin": "-"}))
    built = build_tree(ROOT, rows, recursive=False)
    return Inventory(tree=built, datasets=tuple(built.datasets))


def job(targets):
    data = {"jobs": {"j": {"dataset": "tank/data", "snapshot": {"retention": {"keep_last": 1}}}},
            "hosts": {"b": {"address": "127.0.0.1"}}}
    if targets:
        data["jobs"]["j"]["replicate"] = {"targets": targets}
    return parse_config(data, "x.toml").jobs["j"]


def cursor(job_name, target, short, createtxg, host="local"):
    return CursorRow(job=job_name, target=target, source_host=host, source_dataset="tank/data",
                     target_location="pool/x", method="zfs", snapshot_name=short, guid=100 + createtxg,
                     createtxg=createtxg, updated_at=T0)


SHORTS = [f"zbak_2026010{i}T000000Z" for i in range(1, 6)]  # createtxg 2..6


def destroyed(inv, jb, protections):
    plans = plan_source_prune(inv, jb, protections, T0)
    return [d.candidate.name.split("@")[1] for p in plans.values() for d in p.to_destroy]


def test_without_replication_only_retention_decides():
    inv = tree(SHORTS)
    assert destroyed(inv, job([]), replication_protections(inv, "j", job([]), [])) == SHORTS[:4]


def test_a_never_replicated_target_protects_every_snapshot():
    """docs/reliability.md#r21-replication-safety-in-pruning: nothing is destroyed before it reached
    every target."""
    inv, jb = tree(SHORTS), job(["b:pool/x"])
    protections = replication_protections(inv, "j", jb, [])
    assert destroyed(inv, jb, protections) == []
    assert "never replicated" in protections[f"tank/data@{SHORTS[0]}"][0]


def test_the_cursor_is_a_base_and_newer_snapshots_wait_for_replication():
    """docs/reliability.md#r21-replication-safety-in-pruning: the cursor (newest common snapshot)
    and everything newer survive."""
    inv, jb = tree(SHORTS), job(["b:pool/x"])
    protections = replication_protections(inv, "j", jb, [cursor("j", "b:pool/x", SHORTS[2], 4)])
    assert destroyed(inv, jb, protections) == SHORTS[:2]
    assert protections[f"tank/data@{SHORTS[2]}"] == ["replication base of j -> b:pool/x"]


def test_each_target_protects_from_its_own_cursor():
    """docs/reliability.md#r21-replication-safety-in-pruning: each target's cursor protects on its
    own."""
    inv, jb = tree(SHORTS), job(["b:pool/x", "b:pool/y"])
    cursors = [cursor("j", "b:pool/x", SHORTS[3], 5), cursor("j", "b:pool/y", SHORTS[1], 3)]
    assert destroyed(inv, jb, replication_protections(inv, "j", jb, cursors)) == [SHORTS[0]]


def test_another_jobs_cursor_on_the_same_host_still_protects_its_base():
    inv, jb = tree(SHORTS), job([])
    protections = replication_protections(inv, "j", jb, [cursor("other", "b:pool/z", SHORTS[0], 2)])
    assert SHORTS[0] not in destroyed(inv, jb, protections)


def test_a_cursor_from_another_source_host_protects_nothing_here():
    inv, jb = tree(SHORTS), job([])
    protections = replication_protections(inv, "j", jb, [cursor("o", "b:pool/z", SHORTS[0], 2, host="b")])
    assert protections == {}


def test_a_local_target_written_without_host_is_matched_to_its_cursor():
    """docs/reliability.md#r21-replication-safety-in-pruning: the config may name a local target
    ``pool/x``, the cursor records ``local:pool/x``; snapshots up to the cursor count as replicated
    (before this was matched, a local target's snapshots were "never replicated" forever and never
    pruned)."""
    inv = tree(SHORTS)
    jb = job(["pool/x"])
    protections = replication_protections(inv, "j", jb, [cursor("j", "local:pool/x", SHORTS[3], 5)])
    assert not any("never replicated" in r for rs in protections.values() for r in rs)
    assert destroyed(inv, jb, protections) == SHORTS[:3]


def test_a_snapshot_the_targets_filter_leaves_out_waits_for_no_replication():
    """docs/decisions.md#snapshot-filters-keep-the-replication-base: a snapshot never sent to a
    target (its snapshot_filter) is not kept for that target; the cursor stays a base and admitted
    newer snapshots still wait."""
    shorts = SHORTS[:3] + ["tmp_1", "tmp_2"]  # createtxg 2..6
    inv = tree(shorts)
    jb = parse_config({"jobs": {"j": {
        "dataset": "tank/data", "snapshot": {"retention": {"keep_last": 1}},
        "replicate": {"targets": ["b:pool/x"],
                      "snapshot_filter": {"b:pool/x": {"exclude": ["tmp_*"]}}}}},
        "hosts": {"b": {"address": "127.0.0.1"}}}, "x.toml").jobs["j"]

    protections = replication_protections(inv, "j", jb, [cursor("j", "b:pool/x", SHORTS[1], 3)])

    assert "tank/data@tmp_1" not in protections
    assert protections[f"tank/data@{SHORTS[2]}"] == ["not yet replicated to b:pool/x"]
    assert protections[f"tank/data@{SHORTS[1]}"] == ["replication base of j -> b:pool/x"]
