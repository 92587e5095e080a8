"""Replica properties (``zfs.properties``,
docs/decisions.md#replicas-are-received-unmounted-and-read-only,
docs/decisions.md#replica-properties-keep-a-failover-replica-faithful): defaults, validation of
names and values, fitting to a dataset's type, and what a replica read back needs repaired
(pure; the zfs side is in tests/e2e/test_replica_properties.py and the OpenZFS tier)."""

from __future__ import annotations

import pytest

from zrepl_py.errors import InvalidProperty
from zrepl_py.zfs.properties import DEFAULT_EXCLUDE, DEFAULT_SET, Fix, ReceiveProperties


def test_by_default_replicas_are_noauto_readonly_and_keep_no_mountpoint_share_or_reservation():
    props = ReceiveProperties.of()
    assert dict(props.assigned) == {"canmount": "noauto", "readonly": "on"} == DEFAULT_SET
    assert set(props.excluded) == set(DEFAULT_EXCLUDE) == {
        "mountpoint", "sharenfs", "sharesmb", "refreservation"}
    assert props.receive_args() == [
        "-o", "canmount=noauto", "-o", "readonly=on", "-x", "mountpoint", "-x",
        "refreservation", "-x", "sharenfs", "-x", "sharesmb"]


def test_set_goes_over_the_defaults_and_exclude_replaces_them():
    props = ReceiveProperties.of({"readonly": "off", "compression": "zstd-3"},
                                 ["mountpoint", "com.sun:auto-snapshot"])
    assert dict(props.assigned) == {"canmount": "noauto", "readonly": "off",
                                    "compression": "zstd-3"}
    assert props.excluded == ("com.sun:auto-snapshot", "mountpoint")


def test_a_set_property_leaves_the_default_exclusions_it_overrides():
    props = ReceiveProperties.of({"mountpoint": "none"})
    assert "mountpoint" not in props.excluded and ("mountpoint", "none") in props.assigned


@pytest.mark.parametrize("assign, exclude, words", [
    ({"com.example:note": "$(reboot)"}, None, "not allowed"),
    ({"com.example:note": "a\nb"}, None, "not allowed"),
    ({"com.example:note": " padded"}, None, "not allowed"),
    ({"com.example:note": "x" * 8192}, None, "at most 8191"),
    ({"-o": "x"}, None, "not a ZFS property"),
    ({"Compression": "on"}, None, "not a ZFS property"),
    ({"used": "1"}, None, "not a ZFS property"),
    ({"keylocation": "file:///k"}, None, "encryption properties"),
    (None, ["encryption"], "encryption properties"),
    (None, ["mountpont"], "not a ZFS property"),
    ({"canmount": "yes"}, None, "one of on, off, noauto"),
    ({"mountpoint": "/home"}, None, "none or legacy"),
    ({"recordsize": "96K"}, None, "power of two"),
    ({"recordsize": "32M"}, None, "power of two"),
    ({"quota": "lots"}, None, "a size"),
    ({"compression": "zstd-20"}, None, "not allowed"),
    ({"sharenfs": "rw;id"}, None, "not allowed"),
    ({"readonly": "on"}, ["readonly"], "both set and excluded"),
    ({"canmount": "on"}, ["sharenfs"], "needs mountpoint excluded"),
    ({"canmount": 1}, None, "must be a string"),
])
def test_bad_names_and_values_are_refused_before_anything_runs(assign, exclude, words):
    with pytest.raises(InvalidProperty, match=words):
        ReceiveProperties.of(assign, exclude)


@pytest.mark.parametrize("assign", [
    {"recordsize": "1M"}, {"recordsize": "512"}, {"quota": "10G"}, {"refreservation": "auto"},
    {"compression": "zstd-fast-10"}, {"compression": "gzip-9"}, {"dedup": "sha256,verify"},
    {"sharenfs": "rw=@192.0.2.0/24,no_root_squash"}, {"com.example:note": "nightly copy"},
    {"canmount": "on", "mountpoint": "legacy"}, {"special_small_blocks": "0"},
])
def test_ordinary_values_are_accepted(assign):
    assert set(assign.items()) <= set(ReceiveProperties.of(assign).assigned)


def test_a_volume_gets_no_filesystem_only_property_and_a_filesystem_no_volume_only_one():
    props = ReceiveProperties.of({"volmode": "dev", "com.example:x": "1"})
    assert dict(props.for_kind("volume").assigned) == {"readonly": "on", "volmode": "dev",
                                                       "com.example:x": "1"}
    assert props.for_kind("volume").excluded == ("refreservation",)
    assert "volmode" not in dict(props.for_kind("filesystem").assigned)
    assert props.for_kind("filesystem").excluded == props.excluded


def test_nothing_is_repaired_on_a_replica_that_reads_back_as_configured():
    props = ReceiveProperties.of()
    observed = {"canmount": ("noauto", "local"), "readonly": ("on", "local"),
                "mountpoint": ("/backup/r", "inherited from backup"),
                "refreservation": ("none", "default"), "sharenfs": ("off", "default"),
                "sharesmb": ("off", "default")}
    assert props.fixes(observed) == []


def test_a_set_property_not_local_is_set_and_a_received_exclusion_inherited_or_reset():
    props = ReceiveProperties.of()
    observed = {"canmount": ("on", "default"), "readonly": ("on", "local"),
                "mountpoint": ("/home", "received"), "refreservation": ("1048576", "received"),
                "sharenfs": ("off", "default"), "sharesmb": ("off", "default")}
    assert props.fixes(observed) == [
        Fix("canmount", "noauto", "was on (default)"),
        Fix("mountpoint", None, "was the stream's /home (received, though excluded)"),
        Fix("refreservation", "none", "was the stream's 1048576 (received, though excluded)"),
    ]


def test_a_value_an_admin_set_locally_on_the_replica_is_left_alone():
    props = ReceiveProperties.of()
    observed = {"readonly": ("off", "local"), "canmount": ("noauto", "local"),
                "mountpoint": ("/mnt/look", "local")}
    assert props.fixes(observed) == []
