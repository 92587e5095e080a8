"""``snapshots.take.plan_snapshot``: which selected datasets get the job's snapshot and with
which command (docs/decisions.md#unchanged-datasets-skip-their-snapshot-atomically,
zfs-autobackup ``--min-change``). Pure; real runs are in ``tests/e2e/test_min_change_openzfs.py``
(OpenZFS has ``written``) and ``tests/e2e/test_select_cli.py`` (zfs-fuse, which has not)."""

from __future__ import annotations

from zrepl_py.snapshots.take import plan_snapshot
from zrepl_py.zfs.model import build_tree
from zrepl_py.zfs.names import DatasetName

ROOT = DatasetName("tank/data")
A, B = DatasetName("tank/data/a"), DatasetName("tank/data/b")
OWN = "zbak_20260101T000000Z"


def tree(snapshots: dict[str, list[str]]):
    """A listed tree of ROOT, A and B whose datasets carry the given short names, oldest
    first."""
    rows, txg = [], 1
    for name in (ROOT, A, B):
        rows.append((name, {"type": "filesystem", "guid": str(txg), "createtxg": str(txg),
                            "creation": "0", "origin": "-"}))
        for short in snapshots.get(name, []):
            txg += 1
            rows.append((f"{name}@{short}", {"type": "snapshot", "guid": str(100 + txg),
                                             "createtxg": str(txg), "creation": "0",
                                             "userrefs": "0"}))
        txg += 1
    return build_tree(ROOT, rows, recursive=True)


def test_without_min_change_every_selected_dataset_is_snapshotted_with_one_dash_r():
    listed = tree({})

    plan = plan_snapshot(listed, [ROOT, A, B], recursive=True, prefix="zbak")

    assert plan.datasets == (ROOT, A, B) and plan.recursive and plan.unchanged == ()


def test_a_dataset_written_less_than_min_change_since_the_jobs_snapshot_is_left_unchanged():
    listed = tree({ROOT: [OWN], A: [OWN], B: [OWN]})

    plan = plan_snapshot(listed, [ROOT, A, B], recursive=True, prefix="zbak", min_change=4096,
                         written={ROOT: 0, A: 65536, B: 4095})

    assert plan.datasets == (A,)
    assert not plan.recursive  # A alone, by name: -r would take ROOT and B too
    assert [str(d) for d, _ in plan.unchanged] == [ROOT, B]
    assert "4095 bytes written since @" + OWN in dict(plan.unchanged)[B]


def test_a_dataset_whose_newest_snapshot_is_not_the_jobs_own_is_always_snapshotted():
    # written counts since the newest snapshot of any name: after a user's @before-upgrade
    # it says nothing about the change since the job's own last snapshot.
    listed = tree({ROOT: [OWN, "before-upgrade"], A: [], B: [OWN, "hourly_20260101T010000Z"]})

    plan = plan_snapshot(listed, [ROOT, A, B], recursive=True, prefix="zbak", min_change=1,
                         written={ROOT: 0, A: 0, B: 0})

    assert plan.datasets == (ROOT, A, B) and plan.unchanged == ()


def test_unknown_written_bytes_skip_nothing():
    listed = tree({ROOT: [OWN], A: [OWN], B: [OWN]})

    plan = plan_snapshot(listed, [ROOT, A, B], recursive=True, prefix="zbak", min_change=1,
                         written=None)

    assert plan.datasets == (ROOT, A, B) and plan.recursive


def test_a_selection_short_of_the_whole_tree_or_a_replica_below_the_root_is_never_dash_r():
    listed = tree({})

    partial = plan_snapshot(listed, [ROOT, B], recursive=True, prefix="zbak")
    replica_below = plan_snapshot(listed, [ROOT, A, B], recursive=True, prefix="zbak",
                                  whole_tree=False)

    assert partial.datasets == (ROOT, B) and not partial.recursive
    assert not replica_below.recursive


def test_nothing_changed_anywhere_plans_no_snapshot():
    listed = tree({ROOT: [OWN], A: [OWN], B: [OWN]})

    plan = plan_snapshot(listed, [ROOT, A, B], recursive=True, prefix="zbak", min_change=1,
                         written={ROOT: 0, A: 0, B: 0})

    assert plan.datasets == () and len(plan.unchanged) == 3
