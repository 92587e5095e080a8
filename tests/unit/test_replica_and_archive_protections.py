"""What prune protects on the source because of archive chains, and on a replica target
(pruning/source.py archive_protections and stale_archive_tips, pruning/replica.py), on plain
listings."""

from __future__ import annotations

import datetime as dt

from zrepl_py.catalog.rows import CursorRow, StreamRow
from zrepl_py.config.hosts import parse_endpoint
from zrepl_py.config.loading import parse_config
from zrepl_py.config.retention import Retention
from zrepl_py.pruning.replica import NEWEST_COMMON, plan_replica_prune, zfs_targets
from zrepl_py.pruning.source import archive_protections, stale_archive_tips
from zrepl_py.snapshots.inventory import Inventory
from zrepl_py.zfs.model import build_tree
from zrepl_py.zfs.names import DatasetName

NOW = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
SHORTS = [f"zbak_2026010{i}T000000Z" for i in range(1, 7)]  # createtxg 2..7, guid 102..107


def listing(root: str, shorts, *, guid_base=100, userrefs=None, start=2):
    userrefs = userrefs or {}
    rows = [(root, {"type": "filesystem", "guid": "1", "createtxg": "1", "creation": "0",
                    "userrefs": "-", "origin": "-"})]
    for i, short in enumerate(shorts, start=start):
        rows.append((f"{root}@{short}", {
            "type": "snapshot", "guid": str(guid_base + i), "createtxg": str(i),
            "creation": str(1_790_000_000 + i * 3600), "userrefs": str(userrefs.get(short, 0)),
            "origin": "-"}))
    return build_tree(DatasetName(root), rows, recursive=True)


def inventory(shorts=SHORTS, **kw) -> Inventory:
    tree = listing("tank/data", shorts, **kw)
    return Inventory(tree=tree, datasets=tuple(tree.datasets))


def stream(id, short_index, parent=None, store="cold", state="uploaded") -> StreamRow:
    txg = short_index + 2
    return StreamRow(
        id=id, host="local", dataset="tank/data", store=store,
        kind="full" if parent is None else "incremental", parent_id=parent.id if parent else None,
        from_guid=parent.to_guid if parent else None, to_guid=100 + txg,
        from_name=parent.to_name if parent else None, to_name=SHORTS[short_index],
        to_createtxg=txg, raw_bytes=1, stored_bytes=1, object_prefix=f"p{id}/",
        storage_class="STANDARD", compression="zstd", state=state, created_at=NOW,
        uploaded_at=None, verified_at=None)


def test_the_tip_of_each_stores_current_chain_is_an_archive_base():
    """docs/reliability.md#r21-replication-safety-in-pruning: a snapshot an archive chain continues
    from (not yet uploaded past it) is kept."""
    a = stream(1, 0)
    b = stream(2, 2, a)
    c = stream(3, 3)              # a newer full: the current chain of store cold is just @3
    other = stream(4, 1, store="offsite")
    found = archive_protections(inventory(), [a, b, c, other])
    assert found == {f"tank/data@{SHORTS[3]}": ["archive base (store cold)"],
                     f"tank/data@{SHORTS[1]}": ["archive base (store offsite)"]}


def test_a_condemned_chain_or_a_tip_gone_from_the_source_protects_nothing():
    a = stream(1, 0, state="condemned")
    assert archive_protections(inventory(), [a]) == {}
    assert archive_protections(inventory(SHORTS[1:], start=3), [stream(1, 0)]) == {}


def test_the_held_tip_of_a_chain_closed_by_a_newer_full_is_stale():
    a = stream(1, 0)
    b = stream(2, 2, a)
    c = stream(3, 3)
    inv = inventory(userrefs={SHORTS[2]: 1, SHORTS[3]: 1})
    assert stale_archive_tips(inv, [a, b, c]) == {f"tank/data@{SHORTS[2]}": ["cold"]}
    assert stale_archive_tips(inventory(), [a, b, c]) == {}, "no hold, nothing to release"
    assert stale_archive_tips(inv, [a, b]) == {}, "the current tip keeps its hold"


def job(retention=True, method="auto", targets=("backup:pool/replica",)):
    data = {"jobs": {"j": {"dataset": "tank/data",
                           "replicate": {"targets": list(targets), "method": method}}},
            "hosts": {"backup": {"address": "127.0.0.1"}}}
    if retention:
        data["jobs"]["j"]["replicate"]["retention"] = {"keep_last": 1}
    return parse_config(data, "x.toml").jobs["j"]


def cursor(short, guid, location="pool/replica", target="backup:pool/replica", job_name="j"):
    return CursorRow(job=job_name, target=target, source_host="local", source_dataset="tank/data",
                     target_location=location, method="zfs", snapshot_name=short, guid=guid,
                     createtxg=0, updated_at=NOW)


def test_retention_applies_to_dataset_targets_only_and_only_when_set():
    assert [str(t) for t in zfs_targets(job())] == ["backup:pool/replica"]
    assert zfs_targets(job(retention=False)) == []
    assert zfs_targets(job(targets=("backup:/srv/copy",))) == []


def test_on_the_target_the_newest_common_snapshot_the_cursor_held_and_foreign_ones_stay():
    """docs/reliability.md#r21-replication-safety-in-pruning: on the target side the newest common
    snapshot and the cursor stay."""
    # the source still has @4 and @5 (guids 105, 106); the target has @1..@5 (guids 102..106)
    # and a snapshot an admin made there ("manual", guid 107)
    source = inventory(SHORTS[3:5], start=5)
    target = listing("pool/replica", SHORTS[:5] + ["manual"], userrefs={SHORTS[0]: 1})
    plans = plan_replica_prune(job(), parse_endpoint("backup:pool/replica", allow_directory=False),
                               Retention(keep_last=1), source, target,
                               [cursor(SHORTS[3], 105)], {f"pool/replica@{SHORTS[1]}": ("pool/c",)},
                               NOW)
    (plan,) = plans.values()
    decisions = {d.candidate.name.split("@")[1]: d for d in plan.decisions}
    assert decisions[SHORTS[0]].reasons == ("held (1 user ref)",)
    assert decisions[SHORTS[1]].reasons == ("has dependent clones: pool/c",)
    assert decisions[SHORTS[2]].destroy
    assert decisions[SHORTS[3]].reasons == ("replication cursor of j -> backup:pool/replica",)
    assert NEWEST_COMMON in decisions[SHORTS[4]].reasons
    assert "keep_last (1 of 1)" in decisions[SHORTS[4]].reasons
    assert decisions["manual"].reasons[0] == "not a zbak snapshot (never pruned)"
    assert [d.candidate.name.split("@")[1] for d in plan.to_destroy] == [SHORTS[2]]


def test_a_cursor_of_another_host_with_the_same_location_protects_nothing_here():
    source = inventory(SHORTS[5:], start=7)
    target = listing("pool/replica", SHORTS[:3])
    plans = plan_replica_prune(job(), parse_endpoint("backup:pool/replica", allow_directory=False),
                               Retention(), source, target,
                               [cursor(SHORTS[0], 102, target="elsewhere:pool/replica")], {}, NOW)
    (plan,) = plans.values()
    assert [d.candidate.name.split("@")[1] for d in plan.to_destroy] == SHORTS[:2]


def test_a_missing_target_dataset_plans_nothing():
    plans = plan_replica_prune(job(), parse_endpoint("backup:pool/replica", allow_directory=False),
                               Retention(), inventory(), None, [], {}, NOW)
    assert plans == {}
