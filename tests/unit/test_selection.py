"""The selection planner (``zrepl_py.snapshots.selection``): which datasets of a job's tree
the job works on, from names, a user property with its source, and the replica targets of
the config. Pure logic over listed values; the same rules run against real pools in
``tests/e2e/test_select_cli.py`` (zfs-fuse) and ``tests/e2e/test_select_openzfs.py``."""

from __future__ import annotations

import pytest

from zrepl_py.config.jobs import SelectConfig
from zrepl_py.snapshots.selection import effective_source, replica_of, select_datasets
from zrepl_py.zfs.model import PropertyValue
from zrepl_py.zfs.names import DatasetName

ROOT = DatasetName("tank")
TREE = [DatasetName(n) for n in (
    "tank", "tank/db", "tank/db/logs", "tank/home", "tank/home/tmp", "tank/home/tmp/keep",
    "tank/scratch", "tank/bk", "tank/bk/host1")]
NIGHTLY = SelectConfig(property="zbak:job", value="nightly")


def values(**set_on: tuple[str, str]) -> dict[DatasetName, PropertyValue]:
    """Property values as ``zfs get`` lists them for TREE: each keyword (``/`` written as
    ``__``) sets ``(value, source)`` on a dataset; the others inherit from the nearest
    ancestor that has one, or show ``-``."""
    given = {DatasetName(k.replace("__", "/")): PropertyValue(*v) for k, v in set_on.items()}
    found = {}
    for name in TREE:
        if name in given:
            found[name] = given[name]
            continue
        parts = name.split("/")
        for depth in range(len(parts) - 1, 0, -1):
            above = DatasetName("/".join(parts[:depth]))
            if above in given:
                found[name] = PropertyValue(given[above].value, f"inherited from {above}")
                break
        else:
            found[name] = PropertyValue("-", "-")
    return found


def chosen(selection) -> list[str]:
    return [str(d) for d in selection.selected]


def test_a_value_set_on_a_dataset_selects_it_and_every_child_that_inherits_it():
    got = select_datasets(TREE, ROOT, select=NIGHTLY,
                          values=values(tank__db=("nightly", "local")))

    assert chosen(got) == ["tank/db", "tank/db/logs"]
    assert got.reason("tank") == "zbak:job is not set"
    assert got.reason("tank/home") == "zbak:job is not set"


def test_false_leaves_a_subtree_out_and_a_child_may_select_itself_again_below_it():
    got = select_datasets(TREE, ROOT, select=NIGHTLY, values=values(
        tank=("nightly", "local"), tank__home__tmp=("false", "local"),
        tank__home__tmp__keep=("nightly", "local")))

    assert "tank/home/tmp" not in chosen(got)
    assert got.reason("tank/home/tmp") == "zbak:job=false"
    assert "tank/home/tmp/keep" in chosen(got)
    assert "tank/home" in chosen(got) and "tank" in chosen(got)


def test_another_jobs_value_leaves_the_dataset_to_that_job_and_names_where_it_comes_from():
    got = select_datasets(TREE, ROOT, select=NIGHTLY, values=values(
        tank=("nightly", "local"), tank__db=("weekly", "local")))

    assert got.reason("tank/db") == "zbak:job=weekly"
    assert got.reason("tank/db/logs") == "zbak:job=weekly (inherited from tank/db)"


def test_a_received_value_is_a_replica_and_never_selected_nor_are_children_inheriting_it():
    got = select_datasets(TREE, ROOT, select=NIGHTLY, values=values(
        tank=("nightly", "local"), tank__bk=("nightly", "received")))

    assert "tank/bk" not in chosen(got) and "tank/bk/host1" not in chosen(got)
    assert "was received" in got.reason("tank/bk")
    assert "was received from tank/bk" in got.reason("tank/bk/host1")
    assert "tank/db" in chosen(got)


def test_a_value_inherited_from_a_received_dataset_above_the_root_is_a_replica_too():
    tree = [DatasetName("tank/bk/host1"), DatasetName("tank/bk/host1/db")]
    listed = {tree[0]: PropertyValue("nightly", "inherited from tank/bk"),
              tree[1]: PropertyValue("nightly", "inherited from tank/bk")}

    got = select_datasets(tree, tree[0], select=NIGHTLY, values=listed,
                          setpoints={"tank/bk": "received"})
    mine = select_datasets(tree, tree[0], select=NIGHTLY, values=listed,
                           setpoints={"tank/bk": "local"})

    assert chosen(got) == []
    assert chosen(mine) == ["tank/bk/host1", "tank/bk/host1/db"]


def test_exclude_received_false_selects_received_values_for_a_cascade():
    cascade = SelectConfig(property="zbak:job", value="nightly", exclude_received=False)

    got = select_datasets(TREE, ROOT, select=cascade,
                          values=values(tank__bk=("nightly", "received")))

    assert chosen(got) == ["tank/bk", "tank/bk/host1"]


def test_a_value_set_locally_on_a_replica_is_the_admins_choice_and_counts():
    # OpenZFS lists a local value over a received one as `local` (seen on 2.3.2).
    got = select_datasets(TREE, ROOT, select=NIGHTLY,
                          values=values(tank__bk=("nightly", "local")))

    assert chosen(got) == ["tank/bk", "tank/bk/host1"]


def test_a_replica_target_of_any_job_is_left_out_with_everything_below_it_but_never_the_root():
    replicas = {DatasetName("tank/bk"): "job pull -> local:tank/bk"}

    got = select_datasets(TREE, ROOT, replicas=replicas)
    explicit = select_datasets(TREE[-2:], DatasetName("tank/bk"), replicas=replicas)

    assert "tank/bk" not in chosen(got) and "tank/bk/host1" not in chosen(got)
    assert got.reason("tank/bk/host1") == "a replica: target of job pull -> local:tank/bk"
    assert chosen(explicit) == ["tank/bk", "tank/bk/host1"]


def test_replica_rules_come_before_the_property_so_a_replica_selected_by_value_stays_out():
    replicas = {DatasetName("tank/bk"): "job pull -> local:tank/bk"}

    got = select_datasets(TREE, ROOT, select=NIGHTLY, replicas=replicas,
                          values=values(tank=("nightly", "local")))

    assert "tank/bk" not in chosen(got)
    assert "tank/db" in chosen(got)


def test_excludes_apply_with_a_property_too():
    got = select_datasets(TREE, ROOT, select=NIGHTLY, exclude=["scratch", "tank/home/tmp"],
                          values=values(tank=("nightly", "local")))

    assert got.reason("tank/scratch") == "in exclude"
    assert got.reason("tank/home/tmp/keep") == "in exclude"
    assert "tank/home" in chosen(got)


def test_without_select_every_dataset_not_excluded_nor_a_replica_is_selected_in_tree_order():
    got = select_datasets(TREE, ROOT, exclude=["scratch"])

    assert chosen(got) == [str(d) for d in TREE if d != "tank/scratch"]
    assert [str(d) for d, _ in got.skipped] == ["tank/scratch"]


@pytest.mark.parametrize("source,expected", [
    ("local", "local"),
    ("received", "received"),
    ("inherited from tank", "received"),
    ("inherited from tank/gone", "-"),
])
def test_the_source_of_an_inherited_value_is_the_source_where_it_is_set(source, expected):
    listed = {DatasetName("tank"): PropertyValue("x", "received")}

    assert effective_source(PropertyValue("x", source), listed, {}) == expected


def test_a_replica_target_above_the_root_does_not_make_the_tree_a_replica():
    replicas = {DatasetName("tank"): "job up -> local:tank"}

    assert replica_of(DatasetName("tank/bk/host1"), DatasetName("tank/bk"), replicas) is None
